"""The support-store refund agent of the seeds, as an agent module a user would copy.

Run it: ``reins run examples.support_store:agent --goal "refund the damaged item on order
ord_1001"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, Field

from examples.support_store.backend import AUTO_LIMIT, SupportStoreBackend
from examples.support_store.policies import RefundPolicy, ReplanningRefund, RewooRefund
from kernel.agent import AgentModule, AgentProfile, LoopShape, ModelRef
from kernel.amounts import ModelPrice
from kernel.budget import Budget
from kernel.tools import Catalog, Change, DeclaredTool, OnUnknown, ToolKind, tool


class OrderArgs(BaseModel):
    """Arguments naming one order."""

    order_id: str = Field(min_length=1)


class SearchArgs(BaseModel):
    """A policy search."""

    q: str = ""
    order_id: str | None = None


class RefundArgs(BaseModel):
    """A refund of some cents on one order."""

    order_id: str = Field(min_length=1)
    amount_cents: int = Field(gt=0)
    reason: str = "unspecified"


def _over_limit(args: Any) -> bool:
    return int(args.get("amount_cents", 0)) > AUTO_LIMIT


def _refund_changes(args: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Change]:
    """The order's refunded amount before and after, once ``get_order`` has read it."""
    order = args.get("order_id")
    before = facts.get(f"{order}.refunded_cents")
    if not isinstance(before, int):
        return []
    after = before + int(args.get("amount_cents", 0))
    out = [Change(f"{order}.refunded_cents", before, after)]
    total = facts.get(f"{order}.total_cents")
    if isinstance(total, int):
        out.append(Change(f"{order}.refundable_cents", total - before, total - after))
    return out


@tool(
    OrderArgs,
    facts=("order_status", "total_cents", "refunded_cents"),
    fact_key="order_id",
    trusted_output=True,  # the store's own record, not anyone's words: memory may build on it
)
def get_order(order_id: str) -> None:
    """Read an order's status, total and refunded amount."""


@tool(SearchArgs)
def search_policy(q: str = "") -> None:
    """Search the store's return policy."""


def refund_tool(on_unknown: OnUnknown = OnUnknown.STOP) -> DeclaredTool:
    """The refund declaration; a variant may resolve unknown outcomes another way."""

    @tool(
        RefundArgs,
        kind=ToolKind.WRITE,
        needs_approval=_over_limit,
        target_arg="order_id",  # an operator's grants may deny an order
        facts=("refunded_cents",),
        fact_key="order_id",
        on_unknown=on_unknown,
        deduplicates=True,
        liability=Decimal(0),
        done_text="your refund was issued",
        not_done_text="the refund was not issued",
        changes=_refund_changes,
    )
    def issue_refund(order_id: str, amount_cents: int, reason: str = "") -> None:
        """Refund part of an order; above the automatic limit it needs approval."""

    return issue_refund


def email_tool(on_unknown: OnUnknown = OnUnknown.STOP) -> DeclaredTool:
    """The status e-mail declaration."""

    @tool(
        OrderArgs,
        kind=ToolKind.WRITE,
        target_arg="order_id",
        facts=("sent",),
        fact_key="order_id",
        on_unknown=on_unknown,
        deduplicates=True,
        done_text="the confirmation email was sent",
        not_done_text="the confirmation email was not sent",
    )
    def send_status_email(order_id: str) -> None:
        """E-mail the customer the order's status."""

    return send_status_email


PRICE = ModelPrice(
    input_per_m=Decimal(3), cached_input_per_m=Decimal("0.30"), output_per_m=Decimal(15)
)


# A scripted model reads exactly the rendered view and reports its estimate: nothing unseen.
SCRIPTED = ModelRef(
    provider="scripted",
    name="refund-policy",
    price=PRICE,
    input_margin=0.0,
    framing_tokens=0,
    sends_tool_schemas=False,
)
LOCAL_SERVER = ModelRef(
    provider="openai-compatible",
    name="refund-policy",
    price=PRICE,
    base_url="http://127.0.0.1:8000/v1",  # a vLLM / llama.cpp / LiteLLM server on this host
    api_key_env=None,  # a hosted API names its key variable here, e.g. "OPENAI_API_KEY"
)
# Routed by the fleet's document: [models."refund-policy"] lists the deployments that serve it,
# their keys' variables and prices (examples/fleet.toml); the price here is only a fallback.
ROUTED = ModelRef(provider="routes", name="refund-policy", price=PRICE)


def make_agent(
    name: str = "support_store",
    on_unknown: OnUnknown = OnUnknown.STOP,
    budget: Budget | None = None,
    loop: LoopShape = LoopShape.REACT,
    model: ModelRef = SCRIPTED,
    policy: Callable[[str], Any] = RefundPolicy.from_goal,
) -> AgentModule:
    """Build the agent module; tests vary the unknown-outcome rule, the budget, the model, the
    loop shape and its scripted policy (made from the goal)."""
    tools = [get_order, search_policy, refund_tool(on_unknown), email_tool(on_unknown)]
    profile = AgentProfile(
        name=name,
        model=model,
        catalog=Catalog.of(t.spec for t in tools),
        loop=loop,
        budget=budget or Budget(),
    )
    return AgentModule(
        profile=profile,
        make_backend=SupportStoreBackend,
        make_policy=policy,
    )


agent = make_agent()
agent_lookup = make_agent("support_store_lookup", on_unknown=OnUnknown.LOOKUP)
agent_local = make_agent("support_store_local", model=LOCAL_SERVER)  # OpenAI-compatible API
agent_routed = make_agent("support_store_routed", model=ROUTED)  # the fleet document's routes
# The same refund as a plan: ReWOO plans once and solves once; plan-execute-replan re-plans
# when a step's result is an error (its first plan reads the wrong order).
agent_rewoo = make_agent(
    "support_store_rewoo", loop=LoopShape.REWOO, policy=lambda goal: RewooRefund()
)
agent_plan = make_agent(
    "support_store_plan",
    loop=LoopShape.PLAN_EXECUTE,
    budget=Budget(max_replans=1),
    policy=lambda goal: ReplanningRefund(),
)
