"""An approved action that admission refuses stays approved and held (seed 004 table 8): each
tick re-checks it, and it is dispatched without a second approval once capacity and budget
allow, or expires with its approval. At dispatch the digest is recomputed from the held
arguments: arguments altered after the approval refuse the dispatch."""

from __future__ import annotations

import dataclasses

from kernel.events import DispatchTool, HoldForApproval
from kernel.record import ApprovalStatus, ControlKind
from kernel.states import LifecycleState
from tests.kernel.driver import Driver
from tests.kernel.test_approvals import held

S = LifecycleState


def approved_without_room(room: list[bool]) -> tuple[Driver, HoldForApproval]:
    """A held refund approved while the capacity plug-in says no (``room[0]`` is read live)."""
    d, hold = held()
    d.ctx = dataclasses.replace(d.ctx, capacity=lambda rec, spec, args: room[0])
    d.decide(hold)
    return d, hold


def test_an_approved_action_without_capacity_stays_approved_and_held() -> None:
    room = [False]
    d, _hold = approved_without_room(room)
    assert d.rec.state is S.AWAITING_APPROVAL and not d.commands(DispatchTool)
    assert d.rec.held is not None and d.rec.held.status is ApprovalStatus.APPROVED
    assert d.last is not None and [r.outcome for r in d.last.rows] == ["approved_not_admitted"]
    version = d.rec.record_version
    d.tick(d.now + 5)
    assert d.rec.record_version == version, "a re-check that admits nothing writes nothing"


def test_it_runs_once_the_re_check_passes_without_a_second_approval() -> None:
    room = [False]
    d, hold = approved_without_room(room)
    d.tick(d.now + 5)
    room[0] = True
    d.tick(d.now + 5)
    assert d.rec.state is S.WAITING_TOOL
    (dispatch,) = d.commands(DispatchTool)
    assert dispatch.approval_digest == hold.digest and dispatch.args == hold.args
    assert d.last is not None and [r.outcome for r in d.last.rows] == ["admitted"]
    decisions = [r for h in d.history for r in h.rows if r.outcome.startswith("approved")]
    assert len(decisions) == 1, "one decision recorded, one approval given"


def test_the_budget_re_check_holds_it_until_the_budget_has_room() -> None:
    d, hold = held()
    spent = d.rec.ledger.tool_calls.actual
    d.rec.ledger.tool_calls.actual = d.rec.ledger.tool_calls.allowance  # someone spent it
    d.decide(hold)
    assert d.rec.held is not None and d.rec.held.status is ApprovalStatus.APPROVED
    d.tick(d.now + 1)
    assert d.rec.state is S.AWAITING_APPROVAL and not d.commands(DispatchTool)
    d.rec.ledger.tool_calls.actual = spent  # the room is back (a settlement released it)
    d.tick(d.now + 1)
    assert d.rec.state is S.WAITING_TOOL and len(d.commands(DispatchTool)) == 1


def test_it_expires_with_its_approval() -> None:
    room = [False]
    d, hold = approved_without_room(room)
    d.tick(hold.expires_at)
    assert d.rec.held is not None and d.rec.held.status is ApprovalStatus.EXPIRED
    assert d.rec.state is S.READY and not d.commands(DispatchTool)
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["reason"] == "APPROVAL_EXPIRED"


def test_held_arguments_altered_in_the_record_refuse_the_dispatch() -> None:
    room = [False]
    d, _hold = approved_without_room(room)
    assert d.rec.held is not None
    d.rec.held.args = {**d.rec.held.args, "amount_cents": 15000}  # the record was tampered with
    room[0] = True
    d.tick(d.now + 1)
    assert not d.commands(DispatchTool) and d.rec.state is S.READY
    assert d.rec.held.status is ApprovalStatus.WITHDRAWN
    assert d.last is not None and next(r.outcome for r in d.last.rows) == "digest_mismatch"
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["reason"] == "APPROVAL_STALE"


def test_altered_arguments_refuse_the_first_dispatch_too() -> None:
    d, hold = held()
    assert d.rec.held is not None
    d.rec.held.args = {**d.rec.held.args, "order_id": "ord_1003"}
    d.decide(hold)  # the decision names the approved digest; the held arguments are not it
    assert not d.commands(DispatchTool) and d.rec.held.status is ApprovalStatus.WITHDRAWN


def test_a_pause_withdraws_an_approved_undispatched_request() -> None:
    room = [False]
    d, _hold = approved_without_room(room)
    d.control(ControlKind.PAUSE)
    assert d.rec.state is S.PAUSED
    assert d.rec.held is not None and d.rec.held.status is ApprovalStatus.WITHDRAWN
    room[0] = True
    d.tick(d.now + 1)
    assert not d.commands(DispatchTool), "a withdrawn approval never dispatches"
