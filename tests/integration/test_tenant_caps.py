"""Per-tenant caps on the real Redis: validated by ``reins config apply``, changed live, and
the drift sweep (docs/adr/0123-tenant-caps.md). The fleet run is tests/fleet/test_tenant_caps.py;
the cap under every interleaving, on both admitters, is in the admitter contract suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from kernel.errors import SnapshotNotFound
from kernel.states import LifecycleState
from router.admission.redis.admitter import RedisAdmitter
from router.admission.tenants import AdmissionConfig
from router.process.in_flight_sweep import InFlightSweep
from tests.api.conftest import fleet_toml
from tests.api.test_admin_cli import reins

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0", "greater than or equal to 1"),
        ("2.5", "valid integer"),
        ('"2"', "valid integer"),
        ("true", "valid integer"),
    ],
)
def test_config_apply_refuses_a_bad_cap_naming_the_tenant_and_changes_nothing(
    key_prefix: str, tmp_path: Path, value: str, why: str
) -> None:
    good, bad = tmp_path / "fleet.toml", tmp_path / "bad.toml"
    good.write_text(fleet_toml().replace("weight = 3\n", "weight = 3\nmax_in_flight = 4\n"))
    bad.write_text(fleet_toml().replace("weight = 3\n", f"weight = 3\nmax_in_flight = {value}\n"))
    assert "v1 applied" in reins(key_prefix, "config", "apply", str(good)).stdout
    refused = reins(key_prefix, "config", "apply", str(bad))
    assert refused.returncode == 2, refused.stdout
    message = " ".join(refused.stderr.split())
    assert "tenants['acme'].max_in_flight" in message and why in message, message
    shown = json.loads(reins(key_prefix, "config", "show").stdout)
    assert shown["version"] == 1 and shown["tenants"][0]["max_in_flight"] == 4


def document(cap: int | None) -> AdmissionConfig:
    tenants: list[dict[str, Any]] = [
        {"name": n, "weight": 1, "max_ready": 50, "largest_call_tokens": 2_000}
        for n in ("acme", "globex")
    ]
    if cap is not None:
        tenants[0]["max_in_flight"] = cap
    return AdmissionConfig.from_mapping(
        {"quantum_tokens": 1_000, "credit_cap_tokens": 4_000, "tenants": tenants}
    )


def admitted(admitter: RedisAdmitter, count: int) -> list[str]:
    out = []
    for _ in range(count):
        claim = admitter.nominate()
        if claim is None:
            break
        admitter.confirm(claim)
        out.append(claim.call.trajectory_id)
    return out


def test_a_lowered_cap_admits_nothing_new_until_turns_end_and_revokes_none(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    one = RedisAdmitter(redis_client, document(3), prefix=key_prefix, clock=lambda: 0.0, version=1)
    other = RedisAdmitter(
        redis_client, document(3), prefix=key_prefix, clock=lambda: 0.0, version=1
    )
    for k in range(6):
        one.submit("acme", f"a{k}", input_tokens=500, output_allowance=500)
    assert admitted(one, 6) == ["a0", "a1", "a2"] and one.in_flight("acme") == 3
    assert one.reconfigure(document(1), 2)  # `reins config apply` lowers the cap to 1
    assert one.in_flight("acme") == 3  # nothing in flight is revoked
    for k in range(3):
        other.submit("globex", f"g{k}", input_tokens=500, output_allowance=500)
    # the replica still on version 1 admits by the state's cap: globex only
    assert admitted(other, 6) == ["g0", "g1", "g2"]
    for tid in ("a0", "a1"):
        assert one.release("acme", tid)
        assert one.nominate() is None, "2, then 1 in flight: not below the cap of 1 yet"
    assert one.release("acme", "a2") and admitted(other, 6) == ["a3"]
    assert one.reconfigure(document(None), 3)  # the cap removed: acme runs freely again
    assert admitted(other, 6) == ["a4", "a5"] and other.in_flight("acme") == 3


class Records:
    """The store's side of the sweep: each trajectory's state, or gone (a fake store's load)."""

    def __init__(self, states: dict[str, LifecycleState]) -> None:
        self.states = states
        self.loads: list[str] = []

    def load(self, tenant: str, trajectory_id: str) -> Any:
        self.loads.append(trajectory_id)
        if trajectory_id not in self.states:
            raise SnapshotNotFound(f"{tenant}/{trajectory_id}")
        return type("Rec", (), {"state": self.states[trajectory_id]})()


def test_the_drift_sweep_ends_the_turns_of_trajectories_that_act_no_more(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    admitter = RedisAdmitter(redis_client, document(4), prefix=key_prefix, clock=lambda: 0.0)
    for tid in ("acting", "ready", "gone", "pending"):
        admitter.submit("acme", tid, input_tokens=500, output_allowance=500)
    assert admitted(admitter, 3) == ["acting", "ready", "gone"]
    pending = admitter.nominate()  # claimed, not confirmed: its turn has not started
    assert pending is not None and admitter.in_flight("acme") == 4
    states = {
        "acting": LifecycleState.CALLING_MODEL,
        "ready": LifecycleState.READY,  # its notice was lost
        "pending": LifecycleState.READY,
    }
    records = Records(states)
    sweep = InFlightSweep(lambda: admitter, records, every_s=0, budget=2)  # type: ignore[arg-type]
    assert sweep.sweep() == 0 and records.loads == [], "an entry first seen is not loaded"
    total = sum(sweep.sweep() for _ in range(6))  # pages of 2: each entry is seen twice
    assert total == 2 and admitter.in_flight("acme") == 2
    assert "pending" not in records.loads, "a pending claim is not even looked at"
    # A stale end names the claim it ended: a trajectory claimed again since keeps its turn.
    admitter.confirm(pending)
    assert not admitter.release("acme", "pending", "c-other")
    assert admitter.release("acme", "pending", pending.claim_id)
    assert admitter.in_flight("acme") == 1
