"""Seeded random models and budgets for the bound test (seed 000, "What the limits guarantee")."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

from examples.support_store.backend import SupportStoreBackend
from kernel.budget import Budget
from kernel.tools import OnUnknown

TOOLS = ["get_order", "issue_refund", "send_status_email", "search_policy", "delete_order"]
ORDERS = ["ord_1001", "ord_1004", "ord_9999"]


def random_policy(rng: random.Random) -> Any:
    latency = rng.choice([0.5, 1.5, 4.0])

    def fn(view: dict[str, Any], i: int) -> tuple[Any, float]:
        r = rng.random()
        if r < 0.08:
            outcome = rng.choice(["completed", "completed", "cannot_complete"])
            return {"type": "final", "outcome": outcome, "text": "done"}, latency
        if r < 0.16:
            steps = [{"id": "s1", "tool": rng.choice(["get_order", "nope"]), "depends_on": []}]
            if rng.random() < 0.3:
                steps.append({"id": "s2", "tool": "issue_refund", "depends_on": ["s1"]})
            return {"type": "plan", "steps": steps}, latency
        if r < 0.22:  # malformed replies: not JSON, unknown type, missing or mistyped fields
            return rng.choice(
                [
                    "{not json",
                    '{"type": "dance"}',
                    {"type": "tool"},
                    {"type": "tool", "name": 7},
                    {"type": "plan", "steps": "s1"},
                    [1, 2, 3],
                ]
            ), latency
        tool = rng.choice(TOOLS)
        args = {
            "order_id": rng.choice(ORDERS),
            "amount_cents": rng.choice([100, 3000, 8000, 99999]),
        }
        return {
            "type": "tool",
            "name": tool,
            "args": args,
            "plan_step": rng.choice([None, "s1", "s2"]),
        }, latency

    return fn


def random_budget(rng: random.Random) -> Budget:
    out = rng.choice([100, 200, 300])
    return Budget.build(
        max_steps=rng.randint(1, 12),
        max_tool_calls=rng.randint(1, 8),
        max_tokens=rng.choice([1500, 3000, 4000, 8000]),
        max_output_tokens=out,
        deadline_s=rng.choice([5.0, 10.0, 30.0, 60.0]),
        max_cost=rng.choice([Decimal("0.004"), Decimal("0.01"), Decimal("1.00"), Decimal("1.00")]),
        max_repeat=rng.randint(1, 3),
        max_stalls=rng.randint(2, 5),
        max_same_error=rng.randint(2, 4),
    )


def random_backend(rng: random.Random) -> SupportStoreBackend:
    slow = {
        "issue_refund": rng.choice([1.2, 1.2, 1.2, 45.0]),
        "send_status_email": rng.choice([0.9, 0.9, 45.0]),
    }
    return SupportStoreBackend(latency=slow)


def random_rule(rng: random.Random) -> OnUnknown:
    return rng.choice([OnUnknown.STOP, OnUnknown.STOP, OnUnknown.RESEND, OnUnknown.LOOKUP])
