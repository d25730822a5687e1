"""Once-only writes: the same write proposed twice is one effect under one key.

A write's idempotency key derives from what it does (the trajectory, the plan step when there
is one, the tool and its canonical arguments): a model that proposes the same refund on two
turns with no plan gets one refund, and its second proposal is answered from the stored result
without anything being sent. A tool that would be re-sent on an unknown outcome must declare
that its backend deduplicates.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from examples.support_store.policies import Fn
from kernel.chain import RowKind
from kernel.states import StopReason
from kernel.tools import OnUnknown, ToolKind, tool
from tests.kernel.harness import go

REFUND = {"order_id": "ord_1001", "amount_cents": 3000, "reason": "damaged"}


def refund_twice(view: dict[str, Any], i: int) -> Any:
    if i == 1:
        return {"type": "tool", "name": "get_order", "args": {"order_id": "ord_1001"}}
    if i in (2, 3):  # the same refund on two turns, no plan step
        return {"type": "tool", "name": "issue_refund", "args": REFUND}
    return {"type": "final", "outcome": "completed", "text": "refunded"}


def test_the_same_refund_proposed_on_two_turns_is_one_refund_answered_from_its_result() -> None:
    seen: list[Any] = []

    def policy(view: dict[str, Any], i: int) -> Any:
        seen.append(view["last_result"])
        return refund_twice(view, i)

    run = go(Fn(policy, latency=0.1))
    assert run.rec.stop_reason is StopReason.DONE
    assert [e for e in run.effects() if e[0] == "refund"] == [["refund", "ord_1001", 3000]]
    tools = [r for r in run.out.rows if r.kind is RowKind.TOOL and r.tool == "issue_refund"]
    assert [r.outcome for r in tools] == ["ok", "replayed"]
    first = next(op for op in run.rec.operations.values() if op.tool == "issue_refund")
    assert tools[1].call_id == first.call_id and tools[1].detail == {"key": first.idempotency_key}
    answer = seen[3]  # what the model saw after its second proposal
    assert answer["replayed"] is True and answer["refunded_cents"] == 3000
    assert sum(1 for op in run.rec.operations.values() if op.tool == "issue_refund") == 1


class Args(BaseModel):
    order_id: str


def test_a_write_resent_on_an_unknown_outcome_must_declare_that_it_deduplicates() -> None:
    with pytest.raises(ValueError, match=r"tool charge: .*deduplicates=True"):

        @tool(Args, kind=ToolKind.WRITE, on_unknown=OnUnknown.RESEND)
        def charge(order_id: str) -> None:
            """Charge a card."""

    @tool(Args, kind=ToolKind.WRITE, on_unknown=OnUnknown.RESEND, deduplicates=True)
    def charge_once(order_id: str) -> None:
        """Charge a card, once per key."""

    assert charge_once.spec.deduplicates
