"""The shared admitter reconfigured while it runs: lanes kept by name, weights in force at once
for every replica, credit clipped, new tenants without debt, removed tenants drained."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.errors import ConfigError, UnknownTenant
from router.admission.redis.admitter import RedisAdmitter
from router.admission.tenants import AdmissionConfig

pytestmark = pytest.mark.redis


def config(weights: dict[str, float], cap: int = 20_000, **classes: Any) -> AdmissionConfig:
    tenants = []
    for name, weight in weights.items():
        t: dict[str, Any] = {
            "name": name,
            "weight": weight,
            "max_ready": 10_000,
            "largest_call_tokens": 10_000,
        }
        if name in classes:
            t["classes"] = [{"name": c, "weight": w} for c, w in classes[name].items()]
        tenants.append(t)
    return AdmissionConfig.from_mapping(
        {"quantum_tokens": 1_000, "credit_cap_tokens": cap, "tenants": tenants}
    )


OLD = config({"acme": 3, "globex": 2, "initech": 1})
NEW = config({"acme": 1, "globex": 1, "initech": 4})


def fill(admitter: RedisAdmitter, tenants: list[str], per_tenant: int, tag: str = "") -> None:
    for tenant in tenants:
        for k in range(per_tenant):
            admitter.submit(tenant, f"{tenant}{tag}-{k}", input_tokens=900, output_allowance=100)


def admit(admitters: list[RedisAdmitter], count: int) -> Counter[str]:
    """Admit ``count`` calls, taking turns between ``admitters``; charge per tenant."""
    charge: Counter[str] = Counter()
    for i in range(count):
        admitter = admitters[i % len(admitters)]
        claim = admitter.claim().claim
        assert claim is not None, f"nothing to claim after {i} admissions"
        admitter.confirm(claim)
        charge[claim.call.tenant] += claim.call.charge
    return charge


def shares(charge: Counter[str]) -> dict[str, float]:
    total = sum(charge.values())
    return {t: c / total for t, c in charge.items()}


def test_a_new_version_reweights_every_replica_at_once(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    first = RedisAdmitter(redis_client, OLD, prefix=key_prefix, version=1)
    stale = RedisAdmitter(redis_client, OLD, prefix=key_prefix, version=1)
    fill(first, ["acme", "globex", "initech"], 1000)
    before = shares(admit([first, stale], 120))
    assert before["acme"] == pytest.approx(0.5, abs=0.02)

    assert first.reconfigure(NEW, 2) is True
    # ``stale`` has not looked at the new version: it still admits by the weights in the state.
    after = shares(admit([first, stale], 600))
    for tenant, want in {"acme": 1 / 6, "globex": 1 / 6, "initech": 4 / 6}.items():
        assert after[tenant] == pytest.approx(want, abs=0.01), after
    assert stale.reconfigure(NEW, 2) is False, "the state already holds version 2"
    assert stale.reconfigure(OLD, 1) is False, "an older version changes nothing"
    assert shares(admit([stale], 120))["initech"] == pytest.approx(4 / 6, abs=0.02)


def test_a_file_that_differs_is_still_refused_and_changes_nothing(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    held = RedisAdmitter(redis_client, OLD, prefix=key_prefix, version=3)
    for version in (0, 3):
        with pytest.raises(ConfigError, match="holds another configuration"):
            RedisAdmitter(redis_client, NEW, prefix=key_prefix, version=version)
    assert held._state.fields(["Q:0", "Q:1", "Q:2", "ver"]) == [3000, 2000, 1000, 3]


def test_credit_is_clipped_and_a_new_tenant_starts_without_debt(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    admitter = RedisAdmitter(redis_client, OLD, prefix=key_prefix, version=1)
    fill(admitter, ["acme", "globex", "initech"], 200)
    admit([admitter], 30)
    small = config({"acme": 3, "globex": 2, "initech": 1, "hooli": 2}, cap=10_000)
    admitter.reconfigure(small, 2)
    state = admitter._state
    lanes = state.lanes
    credits = state.fields([f"c:{lane}" for lane in range(len(lanes.tenants))])
    assert max(credits) <= 10_000
    hooli = lanes.lane_of["hooli"]
    assert hooli == 3, "a new tenant gets a new lane; the others keep theirs"
    assert credits[hooli] == 0
    fill(admitter, ["hooli"], 200)
    charge = admit([admitter], 320)
    assert shares(charge)["hooli"] == pytest.approx(2 / 8, abs=0.02)


def test_a_removed_tenant_drains_and_takes_nothing_new(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    admitter = RedisAdmitter(redis_client, OLD, prefix=key_prefix, version=1)
    fill(admitter, ["acme", "globex", "initech"], 5)
    admitter.reconfigure(config({"acme": 1, "globex": 1}), 2)
    with pytest.raises(UnknownTenant, match="'initech' is not configured"):
        admitter.submit("initech", "late", input_tokens=1, output_allowance=1)
    assert not admitter.is_queued("late")
    # A trajectory of it that was running comes back, and is admitted like the rest.
    admitter.requeue("initech", "running", input_tokens=900, output_allowance=100)
    charge = admit([admitter], 16)
    assert charge["initech"] == 6 * 1000
    assert admitter.claim().claim is None, "everything drained"
    assert len(admitter.admitted()) == 2, "figures cover the configured tenants"


def test_a_tenant_that_gains_a_class_keeps_its_queue(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    admitter = RedisAdmitter(redis_client, OLD, prefix=key_prefix, version=1)
    fill(admitter, ["acme"], 6)
    split = config({"acme": 3, "globex": 2, "initech": 1}, acme={"default": 1, "batch": 1})
    admitter.reconfigure(split, 2)
    for k in range(6):
        admitter.submit(
            "acme", f"b-{k}", input_tokens=900, output_allowance=100, service_class="batch"
        )
    classes: Counter[str] = Counter()
    for _ in range(12):
        claim = admitter.claim().claim
        assert claim is not None
        admitter.confirm(claim)
        classes[claim.call.service_class] += 1
    assert classes == Counter(default=6, batch=6)
    assert admitter.claim().claim is None


RUNS = itertools.count()
WEIGHTS = st.dictionaries(
    st.sampled_from(["acme", "globex", "initech", "hooli"]),
    st.integers(min_value=1, max_value=5),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(versions=st.lists(st.tuples(WEIGHTS, st.integers(0, 6)), min_size=1, max_size=4))
def test_every_queued_call_is_admitted_once_across_any_versions(
    redis_client: redis.Redis, key_prefix: str, versions: list[tuple[dict[str, int], int]]
) -> None:
    prefix = f"{key_prefix}:{next(RUNS)}"
    admitter = RedisAdmitter(redis_client, OLD, prefix=prefix, version=1)
    queued = set()
    for n, (weights, per_tenant) in enumerate(versions):
        admitter.reconfigure(config(weights, cap=10_000 + 1_000 * n), n + 2)
        for tenant in weights:
            for k in range(per_tenant):
                tid = f"{tenant}-{n}-{k}"
                admitter.submit(tenant, tid, input_tokens=900, output_allowance=100)
                queued.add(tid)
        for _ in range(per_tenant):  # some admissions between versions
            claim = admitter.claim().claim
            if claim is not None:
                admitter.confirm(claim)
                queued.discard(claim.call.trajectory_id)
    seen: list[str] = []
    while (claim := admitter.claim().claim) is not None:
        admitter.confirm(claim)
        seen.append(claim.call.trajectory_id)
    assert sorted(seen) == sorted(queued), "each queued call admitted exactly once"
