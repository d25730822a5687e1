"""Operators' grants and freezes at the dispatch boundary (seed 004 war story 10.1)."""

from __future__ import annotations

import dataclasses

import pytest

from kernel.agent import Escalation
from kernel.authority import TenantAuthority
from kernel.errors import UnknownReference
from kernel.events import ApprovalDecided, DispatchTool, GrantsChanged, HoldForApproval, Tick
from kernel.record import ApprovalStatus, Grants, HoldReason
from kernel.states import LifecycleState, StopReason
from tests.kernel.driver import BIG_REFUND, PLAN, READ, REFUND, Driver

S = LifecycleState


class Operator:
    """The tenant's settings as the fleet's document holds them; tests change them."""

    def __init__(self) -> None:
        self.settings: TenantAuthority | None = None

    def __call__(self, tenant: str) -> TenantAuthority | None:
        return self.settings if tenant == "acme" else None


def proposing(proposal: dict[str, object]) -> tuple[Driver, Operator]:
    """A run that read its order and now proposes ``proposal``; the operator's settings are
    looked up through the context, as the fleet does."""
    d, op = Driver(), Operator()
    d.ctx = dataclasses.replace(d.ctx, authority=op)
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), READ)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
    return d, op


def propose(d: Driver, proposal: dict[str, object]) -> None:
    d.reply(d.admit(), proposal)


def grants(d: Driver, **fields: object) -> None:
    d.apply(GrantsChanged(now=d.now, request_id="g1", requested_by="ops", **fields))


def test_a_frozen_tenants_write_is_held_not_sent_and_goes_when_the_freeze_lifts() -> None:
    d, op = proposing(REFUND)
    op.settings = TenantAuthority(frozen=True)
    propose(d, REFUND)
    assert not d.commands(DispatchTool), "a freeze holds the write: nothing is sent"
    assert d.rec.state is S.AWAITING_APPROVAL
    assert d.rec.held is not None and d.rec.held.reason is HoldReason.FREEZE
    assert [r.outcome for r in d.last.rows if r.kind == "approval"] == ["held_freeze"]
    d.now += 60
    d.apply(Tick(now=d.now))
    assert not d.commands(DispatchTool), "still frozen: a tick re-checks and keeps it held"
    op.settings = TenantAuthority(frozen=False)
    d.now += 1
    d.apply(Tick(now=d.now))
    (sent,) = d.commands(DispatchTool)
    assert sent.tool == "issue_refund" and sent.idempotency_key == d.rec.held.call_key
    assert d.rec.state is S.WAITING_TOOL
    assert "released" in [r.outcome for r in d.last.rows]


def test_a_frozen_trajectory_is_released_by_its_own_grants_at_once() -> None:
    d, _ = proposing(REFUND)
    grants(d, frozen=True)
    assert d.rec.grants.frozen
    propose(d, REFUND)
    assert d.rec.state is S.AWAITING_APPROVAL and not d.commands(DispatchTool)
    grants(d, frozen=False)
    assert [c.tool for c in d.commands(DispatchTool)] == ["issue_refund"]


def test_read_only_holds_a_write_and_lets_reads_through() -> None:
    d, op = proposing(REFUND)
    op.settings = TenantAuthority(grants=Grants(read_only=True))
    d.reply(d.admit(), {"type": "tool", "name": "get_order", "args": {"order_id": "ord_2"}})
    assert [c.tool for c in d.commands(DispatchTool)] == ["get_order"]
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 1})
    propose(d, REFUND)
    assert d.rec.held is not None and d.rec.held.reason is HoldReason.READ_ONLY
    assert not d.commands(DispatchTool)


def test_a_tool_not_granted_is_refused_to_the_model_and_the_run_goes_on() -> None:
    d, op = proposing(REFUND)
    op.settings = TenantAuthority(grants=Grants(tools=["get_order", "search_policy"]))
    propose(d, REFUND)
    assert not d.commands(DispatchTool) and d.rec.state is S.READY
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["code"] == "policy_denied"
    assert d.rec.last_observation["reason"] == "not_granted"
    assert [r.outcome for r in d.last.rows if r.kind == "tool"] == ["policy_denied"]


def test_a_denied_target_is_refused_on_either_grants() -> None:
    d, _ = proposing(REFUND)
    grants(d, grants=Grants(denied_targets=["ord_1001"]))
    propose(d, REFUND)
    assert not d.commands(DispatchTool)
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["reason"] == "denied_target"


def test_a_reviewer_cannot_approve_a_write_past_a_freeze() -> None:
    d, op = proposing(REFUND)
    op.settings = TenantAuthority(frozen=True)
    propose(d, REFUND)
    held = d.rec.held
    assert held is not None
    before = d.rec
    with pytest.raises(UnknownReference) as refused:
        d.apply(
            ApprovalDecided(
                now=d.now,
                approval_id=held.approval_id,
                held_version=held.held_version,
                digest=held.digest,
                reviewer="reviewer",
                approve=True,
            )
        )
    assert refused.value.code == "held_by_policy"
    assert d.rec is before


def test_a_released_write_that_needs_approval_is_held_for_a_reviewer() -> None:
    d, op = proposing(BIG_REFUND)
    op.settings = TenantAuthority(frozen=True)
    propose(d, BIG_REFUND)
    assert not d.commands(HoldForApproval), "a freeze hold is no request for a reviewer"
    op.settings = None
    d.apply(Tick(now=d.now + 1))
    (hold,) = d.commands(HoldForApproval)
    assert not d.commands(DispatchTool)
    assert d.rec.held is not None and d.rec.held.reason is HoldReason.APPROVAL
    d.now += 1
    d.decide(hold)
    assert [c.tool for c in d.commands(DispatchTool)] == ["issue_refund"]


def test_a_frozen_write_waits_no_longer_than_the_wall_clock() -> None:
    d, op = proposing(REFUND)
    op.settings = TenantAuthority(frozen=True)
    propose(d, REFUND)
    d.apply(Tick(now=d.rec.submitted_at + d.rec.budget.wall_clock_s))
    assert d.rec.stop_reason is StopReason.WALL_CLOCK and not d.commands(DispatchTool)
    assert d.rec.held is not None and d.rec.held.status is ApprovalStatus.WITHDRAWN


def test_grants_changed_on_an_ended_run_changes_nothing() -> None:
    d, _ = proposing(REFUND)
    d.apply(Tick(now=d.rec.submitted_at + d.rec.budget.wall_clock_s))
    before = d.rec
    with pytest.raises(Exception, match="run has ended"):
        grants(d, frozen=True)
    assert d.rec is before


def test_staged_escalation_is_turned_on_by_the_tenants_setting() -> None:
    d, op = proposing(REFUND)
    assert d.ctx.agent.escalation is None
    op.settings = TenantAuthority(escalation=Escalation(steer_at_calls=1000, restrict_at_calls=0))
    d.admit()
    assert d.rec.escalation == "steer"


def test_a_hold_names_what_still_holds_it_when_the_freeze_lifts_under_read_only() -> None:
    d, op = proposing(REFUND)
    op.settings = TenantAuthority(frozen=True, grants=Grants(read_only=True))
    propose(d, REFUND)
    assert d.rec.held is not None and d.rec.held.reason is HoldReason.FREEZE
    op.settings = TenantAuthority(grants=Grants(read_only=True))
    d.apply(Tick(now=d.now + 1))
    assert d.rec.held.reason is HoldReason.READ_ONLY and not d.commands(DispatchTool)
    d.apply(Tick(now=d.now + 2))
    assert d.last is not None and not d.last.rows, "an unchanged hold writes nothing"
