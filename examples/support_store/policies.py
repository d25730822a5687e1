"""Scripted model policies for the support store (the seeds' model stand-ins)."""

from __future__ import annotations

import re
from typing import Any

PLAN = [
    {"id": "s1", "tool": "get_order", "depends_on": []},
    {"id": "s2", "tool": "issue_refund", "depends_on": ["s1"]},
    {"id": "s3", "tool": "send_status_email", "depends_on": ["s2"]},
]


class RefundPolicy:
    """Handles 'refund the damaged item and confirm by email' from the view it is shown; it
    gives up once a reviewer denies the refund."""

    def __init__(self, order: str = "ord_1001", amount: int = 3000, latency: float = 1.5):
        self.order, self.amount, self.latency = order, amount, latency

    @classmethod
    def from_goal(cls, goal: str, latency: float = 1.5) -> RefundPolicy:
        """Read the order and the amount from the goal; 3,000 cents when it names none."""
        order = re.search(r"ord_\d+", goal)
        amount = re.search(r"(\d+)\s*cents", goal)
        return cls(
            order=order.group(0) if order else "ord_1001",
            amount=int(amount.group(1)) if amount else 3000,
            latency=latency,
        )

    def __call__(self, view: dict[str, Any], i: int) -> tuple[dict[str, Any], float]:
        facts, o = view["facts"], self.order
        if not view["plan"]:
            return {"type": "plan", "steps": PLAN}, self.latency
        if (view.get("last_result") or {}).get("reason") == "APPROVAL_DENIED":
            # A reviewer said no: asking again for the same refund would only be denied again.
            final = {"type": "final", "outcome": "cannot_complete", "text": "Refund denied."}
            return final, self.latency
        done = {s["id"] for s in view["plan"] if s["status"] == "done"}
        if f"{o}.total_cents" not in facts:
            call = {"name": "get_order", "args": {"order_id": o}, "plan_step": "s1"}
        elif "s2" not in done:
            args = {"order_id": o, "amount_cents": self.amount, "reason": "damaged"}
            call = {"name": "issue_refund", "args": args, "plan_step": "s2"}
        elif f"{o}.sent" not in facts:
            call = {"name": "send_status_email", "args": {"order_id": o}, "plan_step": "s3"}
        else:
            final = {
                "type": "final",
                "outcome": "completed",
                "text": "Refund issued and confirmation sent.",
            }
            return final, self.latency
        return {"type": "tool", **call}, self.latency


class Fn:
    """A policy from a function of (view, call number), at a fixed latency."""

    def __init__(self, fn: Any, latency: float = 1.5) -> None:
        self.fn, self.latency = fn, latency

    def __call__(self, view: dict[str, Any], i: int) -> tuple[Any, float]:
        return self.fn(view, i), self.latency


same_call = Fn(lambda v, i: {"type": "tool", "name": "get_order", "args": {"order_id": "ord_9999"}})
new_ids = Fn(
    lambda v, i: {"type": "tool", "name": "get_order", "args": {"order_id": f"ord_{9000 + i}"}}
)
search_loop = Fn(
    lambda v, i: {
        "type": "tool",
        "name": "search_policy",
        "args": {"order_id": "x", "q": f"returns policy {i}"},
    }
)


def under_review(view: dict[str, Any]) -> dict[str, Any] | None:
    """The tool call a plan step awaits review with, proposed back so it is held for a
    reviewer; None when no step awaits review."""
    last = view.get("last_result") or {}
    if last.get("code") != "needs_review" or not isinstance(last.get("call"), dict):
        return None
    return {"type": "tool", **last["call"]}


class RewooRefund:
    """ReWOO: the planner writes every call up front with #E references; a solver answers.

    The refund takes the order's full total from the first step's result (``#E1.total_cents``),
    so the reference has to resolve before the refund can be sent.
    """

    def __init__(self, order: str = "ord_1001", latency: float = 1.5) -> None:
        self.order, self.latency = order, latency

    @classmethod
    def from_goal(cls, goal: str) -> RewooRefund:
        """The order the goal names (ord_1001 when it names none)."""
        order = re.search(r"ord_\d+", goal)
        return cls(order.group(0) if order else "ord_1001")

    def __call__(self, view: dict[str, Any], i: int) -> tuple[dict[str, Any], float]:
        o = self.order
        review = under_review(view)
        if review is not None:
            return review, self.latency
        if not view["plan"]:
            steps = [
                {"id": "E1", "tool": "get_order", "args": {"order_id": o}},
                {
                    "id": "E2",
                    "tool": "issue_refund",
                    "depends_on": ["E1"],
                    "args": {"order_id": o, "amount_cents": "#E1.total_cents", "reason": "damaged"},
                },
                {
                    "id": "E3",
                    "tool": "send_status_email",
                    "depends_on": ["E2"],
                    "args": {"order_id": o},
                },
            ]
            return {"type": "plan", "steps": steps}, self.latency
        evidence = view.get("evidence", {})
        ok = all(s["status"] == "done" for s in view["plan"])
        text = f"Refunded {evidence.get('E2', {}).get('refunded_cents')} cents and e-mailed."
        outcome = "completed" if ok else "cannot_complete"
        return {"type": "final", "outcome": outcome, "text": text}, self.latency


class ReplanningRefund:
    """Plan-execute-replan: the first plan reads the wrong order; code sees `not_found`, the
    planner is re-entered once and plans again with the right order."""

    def __init__(self, wrong: str = "ord_9999", right: str = "ord_1001") -> None:
        self.wrong, self.right = wrong, right

    def plan(self, o: str) -> dict[str, Any]:
        return {
            "type": "plan",
            "steps": [
                {"id": "E1", "tool": "get_order", "args": {"order_id": o}},
                {
                    "id": "E2",
                    "tool": "issue_refund",
                    "depends_on": ["E1"],
                    "args": {"order_id": o, "amount_cents": 3000, "reason": "damaged"},
                },
                {
                    "id": "E3",
                    "tool": "send_status_email",
                    "depends_on": ["E2"],
                    "args": {"order_id": o},
                },
            ],
        }

    def __call__(self, view: dict[str, Any], i: int) -> dict[str, Any]:
        last = view.get("last_result") or {}
        review = under_review(view)
        if review is not None:
            return review
        if not view["plan"]:
            return self.plan(self.wrong)
        if last.get("code") == "replan":
            return self.plan(self.right)
        return {"type": "final", "outcome": "completed", "text": "Refund issued and e-mailed."}
