"""A tenant frozen in the fleet's document: its refund is held, not sent, and goes once the
freeze is lifted (``reins freeze acme --off``); the router's tick re-checks the hold."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import RedisState
from kernel.events import Tick
from kernel.record import HoldReason
from kernel.states import LifecycleState
from router.fleet import config as fleet_config
from tests.api.conftest import fleet_toml
from tests.api.test_admin_cli import reins
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders

pytestmark = pytest.mark.redis
S = LifecycleState


class Counting:
    """The support store's backend, counting the calls that reach it, by tool."""

    def __init__(self, state: RedisState) -> None:
        self.inner = SupportStoreBackend(state)
        self.calls: Counter[str] = Counter()

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        self.calls[tool] += 1
        return self.inner.call(user, tool, args, key, timeout_s, approval, fence=fence)

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        return self.inner.lookup(tool, key, fence=fence)


def test_a_frozen_tenants_refund_is_held_not_sent_until_the_freeze_lifts(
    redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    doc, tenants = tmp_path / "fleet.toml", tmp_path / "tenants.toml"
    doc.write_text(fleet_toml() + "\n[authority.tenants.acme]\nfrozen = true\n")
    tenants.write_text(fleet_toml())  # the in-process router's own file: tenants only
    applied = reins(key_prefix, "config", "apply", str(doc))
    assert applied.returncode == 0, applied.stderr
    source = fleet_config.ConfigSource(redis_client, key_prefix, refresh_s=0)
    backends: list[Counting] = []

    def backend(state: RedisState) -> Counting:
        backends.append(Counting(state))
        return backends[-1]

    fleet = InProcessFleet(
        redis_client,
        key_prefix,
        tenants,
        backend=backend,
        authority=fleet_config.authority_lookup(source),
    )
    (counted,) = backends
    oid = seed_orders(redis_client, key_prefix, 7100, 1, total=12_000)[0]
    tid = fleet.api.submit("acme", refund_job(oid, "examples.support_store:agent")).trajectory_id
    fleet.run_until_quiet()

    rec = fleet.load("acme", tid)
    assert rec.state is S.AWAITING_APPROVAL, rec.state
    assert rec.held is not None and rec.held.reason is HoldReason.FREEZE
    assert rec.held.tool == "issue_refund"
    assert counted.calls["get_order"] >= 1 and counted.calls["issue_refund"] == 0, counted.calls
    fleet.api.deliver("acme", tid, Tick(now=time.time()))
    fleet.run_until_quiet()
    assert counted.calls["issue_refund"] == 0, "a tick while frozen sends nothing"

    lifted = reins(key_prefix, "freeze", "acme", "--off", "--json")
    assert lifted.returncode == 0, lifted.stderr
    fleet.api.deliver("acme", tid, Tick(now=time.time()))  # the router's tick, re-checking
    fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert counted.calls["issue_refund"] == 1, counted.calls
    assert rec.state is S.COMPLETED, (rec.state, rec.stop_reason)
    outcomes = [r.outcome for r in fleet.store.read(rec.tenant, tid)]
    assert "held_freeze" in outcomes and "released" in outcomes
