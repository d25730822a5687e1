"""Gate leases kept alive while a turn runs, on the real Redis.

A turn message carries its gate lease and the lease's ttl; the worker renews the lease every
third of the ttl until the turn ends, so a model call that outlasts the ttl still holds its
concurrency slot (the gate refuses one more), while a lease nobody renews lapses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from router.admission.gates import GateConfig
from router.admission.redis.gates import RedisGates
from router.wire.turns import TurnMessage
from tests.fleet.conftest import ROUTE
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from tests.support import ManualClock
from worker.leases import LeaseKeeper

pytestmark = pytest.mark.redis


def gates_at(client: redis.Redis, prefix: str, clock: ManualClock) -> RedisGates:
    config = GateConfig.from_mapping({"routes": {ROUTE: {"concurrency": 2, "lease_ttl_s": 3}}})
    gates = RedisGates(client, config, prefix=prefix, clock=clock)
    gates.configure()
    return gates


def first_turn(
    client: redis.Redis,
    prefix: str,
    tenants_file: Path,
    gates_file: Path,
    order: int,
    leases: LeaseKeeper | None = None,
) -> tuple[InProcessFleet, TurnMessage]:
    """An in-process fleet with one refund submitted and admitted: its first turn's message;
    ``leases`` keeps its worker's gate leases alive."""
    fleet = InProcessFleet(client, prefix, tenants_file, gates_file=str(gates_file), leases=leases)
    fleet.api.submit("acme", refund_job(seed_orders(client, prefix, order, 1)[0]))
    fleet.cycle()
    (msg,) = fleet.take()
    return fleet, msg


def test_a_renewed_lease_outlives_its_ttl_and_an_unrenewed_one_lapses(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    clock = ManualClock(1000.0)
    gates = gates_at(redis_client, key_prefix, clock)
    assert gates.debit(ROUTE, "kept", 10).ok and gates.debit(ROUTE, "left", 10).ok
    assert not gates.debit(ROUTE, "third", 10).ok, "concurrency 2: full"
    keeper = LeaseKeeper(gates, clock=clock)
    keeper.hold(ROUTE, "kept", 3.0)
    for now in (1000.5, 1001.0, 1002.0, 1003.0, 1004.0, 1005.0):  # one beat a second
        clock.set(now)
        keeper.renew_due()
    assert keeper.renewed >= 4 and keeper.lost == 0
    reading = gates.reading(ROUTE)
    assert reading.leases == 1, "the renewed lease holds its slot; the other lapsed at 1003"
    assert gates.debit(ROUTE, "fourth", 10).ok and not gates.debit(ROUTE, "fifth", 10).ok

    keeper.drop("kept")  # the turn ended
    clock.set(1010.0)
    assert keeper.renew_due() == 0 and keeper.held() == []
    assert gates.reading(ROUTE).leases == 0, "dropped: it lapsed like any other"


def test_a_lease_the_gate_no_longer_holds_is_let_go(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    clock = ManualClock(2000.0)
    gates = gates_at(redis_client, key_prefix, clock)
    assert gates.debit(ROUTE, "late", 10).ok
    keeper = LeaseKeeper(gates, clock=clock)
    keeper.hold(ROUTE, "late", 3.0)
    clock.set(2004.0)  # the worker stalled past the ttl: the slot is gone
    assert keeper.renew_due() == 0 and keeper.lost == 1 and keeper.held() == []


def test_a_turn_message_carries_its_lease_ttl_and_the_worker_lets_go_when_it_ends(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path, gates_file: Path
) -> None:
    renewals = RedisGates(redis_client, GateConfig(routes={}), prefix=key_prefix)
    keeper = LeaseKeeper(renewals)
    fleet, msg = first_turn(redis_client, key_prefix, tenants_file, gates_file, 1100, keeper)
    assert msg.lease and msg.route == ROUTE and msg.lease_ttl_s == 20.0  # conftest's gates

    held: list[list[str]] = []
    real_call = fleet.backend.call

    def call(*args: object, **kw: object) -> object:  # the tool runs while the turn is on
        held.append(keeper.held())
        return real_call(*args, **kw)  # type: ignore[arg-type]

    fleet.backend.call = call  # type: ignore[method-assign,assignment]
    fleet.runner.run(msg)
    fleet.run_until_quiet()  # every later turn comes with its own lease
    assert len(held) == 3 and all(len(leases) == 1 for leases in held), "held while it ran"
    assert len({leases[0] for leases in held}) == 3, "each turn's own lease"
    assert keeper.held() == [], "let go once each notice went to the router"


def test_a_duplicate_message_leaves_the_running_turns_lease_alone(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path, gates_file: Path
) -> None:
    keeper = LeaseKeeper(RedisGates(redis_client, GateConfig(routes={}), prefix=key_prefix))
    fleet, first = first_turn(redis_client, key_prefix, tenants_file, gates_file, 1200, keeper)
    fleet.runner.run(first)  # the plan: a model call alone
    fleet.cycle()
    (msg,) = fleet.take()  # its turn calls a tool too
    reading = RedisGates(redis_client, GateConfig(routes={}), prefix=key_prefix).reading
    seen: list[tuple[str, list[str], int]] = []
    real_call = fleet.backend.call

    def call(*args: object, **kw: object) -> object:  # the turn is on: its message comes again
        if not seen:
            report = fleet.runner.run(msg)
            fleet.cycle()  # a router takes the duplicate's IDLE notice
            seen.append((report.reason, keeper.held(), reading(ROUTE).leases))
        return real_call(*args, **kw)  # type: ignore[arg-type]

    fleet.backend.call = call  # type: ignore[method-assign,assignment]
    fleet.runner.run(msg)
    ((reason, held, leases),) = seen
    assert reason.startswith("ignored"), reason
    assert held == [msg.lease], "the running turn still renews its lease"
    assert leases == 1, "and the gate still counts it: the duplicate settled nothing"
    assert keeper.held() == [], "the turn that held it let go when it ended"
