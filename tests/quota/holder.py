"""An admitter process that claims calls and holds them: ``python -m tests.quota.holder PREFIX``.

It confirms HELD claims (their concurrency leases renewed every quarter lease, as a dispatcher
does while the calls run) and leaves one more claim unconfirmed (a dispatcher that died before
confirming it), says so in ``PREFIX:holder-ready``, counts renewal rounds in
``PREFIX:holder-renewals``,
and runs until it is killed. Time is the Redis server's.
"""

from __future__ import annotations

import os
import sys
import time

import redis

from router.admission.gates import GateConfig
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.admission.tenants import AdmissionConfig

URL = os.environ.get("REINS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ROUTE = "loopback/model-1"
HELD = 3
LEASE_TTL_S = 1.0
CLAIM_TTL_S = 1.0
CONFIG = AdmissionConfig.from_mapping(
    {
        "quantum_tokens": 10_000,
        "credit_cap_tokens": 20_000,
        "tenants": [{"name": "acme", "weight": 1, "max_ready": 10, "largest_call_tokens": 2_500}],
    }
)
GATES = GateConfig.from_mapping(
    {"routes": {ROUTE: {"concurrency": HELD + 1, "lease_ttl_s": LEASE_TTL_S}}}
)


def admitter(client: redis.Redis, prefix: str) -> RedisAdmitter:
    gates = RedisGates(client, GATES, prefix=prefix)
    return RedisAdmitter(client, CONFIG, prefix=prefix, gates=gates, claim_ttl_s=CLAIM_TTL_S)


def main() -> None:
    prefix = sys.argv[1]
    client = redis.Redis.from_url(URL)
    adm = admitter(client, prefix)
    assert adm.gates is not None
    leases = []
    for _ in range(HELD):
        claim = adm.nominate()
        assert claim is not None
        adm.confirm(claim)
        leases.append(claim.claim_id)
    assert adm.nominate() is not None  # claimed, never confirmed
    client.set(f"{prefix}:holder-ready", os.getpid())
    while True:  # the calls "run": renew their leases until the process is killed
        for lease in leases:
            assert adm.gates.renew(ROUTE, lease)
        client.incr(f"{prefix}:holder-renewals")
        time.sleep(LEASE_TTL_S / 4)  # the renewal period of a live holder, not a test wait


if __name__ == "__main__":
    main()
