"""The support store's fencing, on both of its states: the same contract, the same answers.

A write under a key that was called or looked up with a newer fence is refused (``fenced``,
no effect, counted); an equal or newer fence is served as before, a repeated key replayed. The
Redis state checks and records the fence in the same transaction as the write, so a lookup
that overtakes a write in progress makes it retry and be refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import MemoryState, Order, RedisState, StoreState, Written

REFUND = {"order_id": "ord_1001", "amount_cents": 1000, "reason": "damaged"}
STATES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]
MakeState = Callable[..., StoreState]


@pytest.fixture(params=STATES)
def make_state(request: pytest.FixtureRequest) -> Iterator[MakeState]:
    """Builds a fresh state of the parametrised kind (Redis: under this test's prefix)."""
    if request.param == "memory":
        yield lambda deduplicate=True: MemoryState(deduplicate=deduplicate)
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    prefix: str = request.getfixturevalue("key_prefix")
    made: list[int] = []

    def make(deduplicate: bool = True) -> StoreState:
        made.append(1)
        return RedisState(client, f"{prefix}-{len(made)}", deduplicate=deduplicate)

    yield make


def refund(backend: SupportStoreBackend, fence: int, key: str = "t1:s2") -> dict[str, Any]:
    result, _secs = backend.call("cu_ana", "issue_refund", dict(REFUND), key, 30.0, fence=fence)
    return result


def look(backend: SupportStoreBackend, fence: int, key: str = "t1:s2") -> dict[str, Any]:
    result, _secs = backend.lookup("issue_refund", key, fence=fence)
    return result


def refunds(backend: SupportStoreBackend) -> int:
    return sum(1 for e in backend.effects() if e[0] == "refund")


def test_a_write_older_than_a_call_of_its_key_is_refused(make_state: MakeState) -> None:
    backend = SupportStoreBackend(make_state())
    assert refund(backend, 5)["status"] == "ok"
    assert refund(backend, 4) == {"status": "error", "code": "fenced"}
    assert refunds(backend) == 1 and backend.fenced_writes() == 1
    again = refund(backend, 5)
    assert again["status"] == "ok" and again["replayed"] is True, "an equal fence is replayed"
    assert refund(backend, 9)["replayed"] is True and refunds(backend) == 1
    assert refund(backend, 8)["code"] == "fenced" and backend.fenced_writes() == 2


def test_a_write_older_than_a_lookup_of_its_key_is_refused(make_state: MakeState) -> None:
    # The zombie's case: the lookup said absent; the write it could not see arrives after it.
    backend = SupportStoreBackend(make_state())
    assert look(backend, 7) == {"status": "absent", "key": "t1:s2"}
    assert refund(backend, 6)["code"] == "fenced"
    assert refunds(backend) == 0 and backend.fenced_writes() == 1
    assert look(backend, 3)["status"] == "absent", "a lookup with an older fence still answers"
    assert refund(backend, 7)["status"] == "ok", "the re-send under the lookup's fence"
    assert look(backend, 8)["status"] == "ok" and refunds(backend) == 1


def test_fences_are_kept_per_key(make_state: MakeState) -> None:
    backend = SupportStoreBackend(make_state())
    look(backend, 50, key="t1:s2")
    assert refund(backend, 1, key="t2:s2")["status"] == "ok"
    assert backend.fenced_writes() == 0


def test_a_refused_business_rule_still_raises_the_fence(make_state: MakeState) -> None:
    backend = SupportStoreBackend(make_state())
    too_much = {**REFUND, "amount_cents": 999_999}
    result, _ = backend.call("cu_ana", "issue_refund", too_much, "t1:s2", 30.0, fence=4)
    assert result["code"] == "invalid_state"
    assert refund(backend, 3)["code"] == "fenced"


def test_without_de_duplication_only_the_fence_keeps_a_late_write_out(
    make_state: MakeState,
) -> None:
    backend = SupportStoreBackend(make_state(deduplicate=False))
    assert refund(backend, 2)["status"] == "ok"
    assert refund(backend, 3)["status"] == "ok" and refunds(backend) == 2, "no replay here"
    assert refund(backend, 2)["code"] == "fenced" and refunds(backend) == 2


def test_a_lookup_that_overtakes_a_write_in_progress_refuses_it(make_state: MakeState) -> None:
    """The write checks its fence, then runs; a lookup with a newer fence lands meanwhile. The
    answers must agree: absent and the write refused, or present and the write applied."""
    state = make_state()
    inside, looked = threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def slow(order: Order | None) -> tuple[dict[str, Any], Order | None, list[list[Any]]]:
        inside.set()
        # The memory state holds its lock here, so its lookup waits for the write instead.
        looked.wait(0.2 if isinstance(state, MemoryState) else 10.0)
        assert order is not None
        updated = {**order, "refunded": order["refunded"] + 1000}
        return {"status": "ok"}, updated, [["refund", "ord_1001", 1000]]

    def write() -> None:
        out["write"] = state.write_once("t1:s2", "issue_refund", "ord_1001", slow, 4)

    writer = threading.Thread(target=write)
    writer.start()
    assert inside.wait(5.0)
    out["lookup"] = state.lookup("t1:s2", "issue_refund", 5)
    looked.set()
    writer.join(10.0)
    (_result, written), found = out["write"], out["lookup"]
    if isinstance(state, RedisState):
        assert found is None, "the lookup ran while the write was in progress"
    if found is None:
        assert written is Written.FENCED and state.effects() == []
        assert state.fenced_writes() == 1
    else:
        assert written is Written.RAN and len(state.effects()) == 1
