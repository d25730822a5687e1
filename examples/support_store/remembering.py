"""The support-store agent with memory: it remembers the language a customer asked to be
answered in, and the next run for that customer uses it without being told.

``reins run examples.support_store.remembering:agent --goal "refund the damaged item on order
ord_1001; the customer prefers replies in ar"`` then the same without the preference: the
confirmation e-mail of the second run goes out in ``ar``. The facts belong to the customer
(the trajectory's user): another customer's run recalls nothing of them.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, Field

from examples.support_store import make_agent
from examples.support_store.policies import RefundPolicy
from kernel.agent import AgentModule
from kernel.memory_tools import MEMORY_TOOLS, MemoryPolicy
from kernel.tools import Catalog, DeclaredTool, ToolKind, tool

PREFERENCE = "reply_language"


class EmailArgs(BaseModel):
    """The status e-mail of one order, in the customer's language."""

    order_id: str = Field(min_length=1)
    language: str = Field("en", min_length=2, max_length=8)


@tool(
    EmailArgs,
    kind=ToolKind.WRITE,
    facts=("sent",),
    fact_key="order_id",
    deduplicates=True,
    done_text="the confirmation email was sent",
    not_done_text="the confirmation email was not sent",
)
def send_status_email(order_id: str, language: str = "en") -> None:
    """E-mail the customer the order's status, in their language."""


class RememberingPolicy(RefundPolicy):
    """The refund, and before the e-mail: note a preference the goal states, then recall the
    customer's preference and write the e-mail in it."""

    def __init__(self, preference: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.preference = preference

    @classmethod
    def from_goal(cls, goal: str, latency: float = 1.5) -> RememberingPolicy:
        """The refund's order and amount, and the language the goal says the customer wants."""
        base = RefundPolicy.from_goal(goal, latency)
        said = re.search(r"prefers replies in ([a-z]{2,8})", goal)
        return cls(
            preference=said.group(1) if said else None,
            order=base.order,
            amount=base.amount,
            latency=latency,
        )

    def __call__(self, view: dict[str, Any], i: int) -> tuple[dict[str, Any], float]:
        reply, latency = super().__call__(view, i)
        if reply.get("name") != "send_status_email":
            return reply, latency
        last = view.get("last_result") or {}
        if last.get("code") == "recalled":
            known = [f["value"] for f in last.get("facts", []) if f["key"] == PREFERENCE]
            args = {**reply["args"], "language": known[0] if known else "en"}
            return {**reply, "args": args}, latency
        if self.preference and last.get("code") != "remembered":
            args = {"key": PREFERENCE, "value": self.preference, "tags": [PREFERENCE]}
            args["source"] = "goal"  # the customer said it: the fact's provenance names it
            return {"type": "tool", "name": "remember_fact", "args": args}, latency
        recall = {"tags": [PREFERENCE]}
        return {"type": "tool", "name": "recall_facts", "args": recall}, latency


def _agent() -> AgentModule:
    base = make_agent("support_store_remembering")
    tools: list[DeclaredTool] = [*MEMORY_TOOLS, send_status_email]
    specs = [s for s in base.profile.catalog.tools.values() if s.name != "send_status_email"]
    profile = replace(
        base.profile,
        catalog=Catalog.of([*specs, *(t.spec for t in tools)]),
        memory=MemoryPolicy(episodes=True, episodes_per_user=True, recall_episodes=3),
    )
    return replace(base, profile=profile, make_policy=RememberingPolicy.from_goal)


agent = _agent()
