"""The gate's pre-debit never under-counts what the provider counts (issue [every-path] item 7).

A READY trajectory's next call is pre-debited at its gate by :func:`router.wire.notices.
call_input`: the view's estimate plus the model's margin, its message framing and the tool
schemas it is sent, as the kernel reserves it. The run goes through the OpenAI-compatible
provider to the loopback server; each request the server received is counted as a provider
counts a chat request (every message's content and a few tokens of framing each, the reply's
priming, and the tool definitions as sent), with the same character-based estimator the kernel
uses for text. Every pre-debit covers its request; the view's bare estimate (the old pre-debit)
does not.
"""

from __future__ import annotations

import json
from typing import Any

from examples.support_store import PRICE, make_agent
from examples.support_store.backend import SupportStoreBackend
from kernel.agent import ModelRef
from kernel.budget import Budget
from kernel.context import KernelContext, StepResult
from kernel.events import Admit, Event
from kernel.record import TrajectoryRecord
from kernel.render import estimate_tokens, render
from kernel.states import LifecycleState, StopReason
from router.wire.notices import call_input
from tests.kernel.harness import new_record
from tests.providers.conftest import Serve
from tests.providers.fake_replies import Reply
from worker.embedded import EmbeddedRunner, RunResult
from worker.providers import OpenAICompatible

PER_MESSAGE = 3  # a chat message's framing (role, separators), as OpenAI documents it
PRIMING = 3  # the reply's priming
MODEL = ModelRef(provider="openai-compatible", name="refund-policy", price=PRICE)


def provider_count(request: dict[str, Any]) -> int:
    """The input tokens a provider counts for ``request``."""
    messages = request.get("messages", [])
    text = sum(estimate_tokens(str(m.get("content") or "")) for m in messages)
    tools = request.get("tools")
    schemas = estimate_tokens(json.dumps(tools, separators=(",", ":"))) if tools else 0
    return text + PER_MESSAGE * len(messages) + PRIMING + schemas


class PreDebits(EmbeddedRunner):
    """The embedded runner, noting each READY record's pre-debit as its call is admitted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pre_debits: list[tuple[int, int]] = []  # (call_input, the view's bare estimate)

    def apply(self, rec: TrajectoryRecord, event: Event, out: RunResult) -> StepResult:
        if isinstance(event, Admit) and rec.state is LifecycleState.READY:
            self.pre_debits.append((call_input(rec, self.ctx), estimate_tokens(render(rec))))
        return super().apply(rec, event, out)


def test_the_pre_debit_covers_every_request_the_provider_counts(serve: Serve) -> None:
    server = serve(
        [
            Reply(tool_calls=[("get_order", json.dumps({"order_id": "ord_1001"}))]),
            Reply(tool_calls=[("search_policy", json.dumps({"query": "damaged item refund"}))]),
            Reply(content=json.dumps({"type": "final", "outcome": "completed", "text": "Done."})),
        ]
    )
    agent = make_agent(model=MODEL)
    tools = list(agent.profile.catalog.tools.values())
    model = OpenAICompatible(base_url=server.base_url, model="refund-policy", tools=tools)
    runner = PreDebits(KernelContext(agent.profile), model, SupportStoreBackend())
    out = runner.run(new_record(Budget()))
    assert out.record.stop_reason is StopReason.DONE
    counted = [provider_count(s.request) for s in server.seen]
    assert len(counted) == len(runner.pre_debits) == 3
    for (pre_debit, bare), count in zip(runner.pre_debits, counted, strict=True):
        print(f"pre-debit {pre_debit} (bare view {bare}) for {count} counted")
        assert pre_debit >= count, f"the gate admitted {pre_debit} for {count} counted"
    assert any(bare < count for (_, bare), count in zip(runner.pre_debits, counted, strict=True))
