"""A worker gives no model or tool call more than ``REINS_MAX_TURN_S``, whatever the command
allows: the routers' sweeps count on a turn's version moving at least that often."""

from __future__ import annotations

from typing import Any

from kernel.budget import Budget
from kernel.events import CallModel, DispatchTool, ReplyStatus
from tests.kernel.harness import new_record
from worker.models import ModelReply
from worker.providers.base import InFlightCalls
from worker.turn_commands import CommandCarrier


class Seen:
    """A model and a backend that note the timeout they were given."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def call(self, view: str, max_output_tokens: int, timeout_s: float, **kw: Any) -> ModelReply:
        self.timeouts.append(timeout_s)
        return ModelReply(status=ReplyStatus.CANCELED)

    def backend_call(self, *args: Any, **kw: Any) -> tuple[dict[str, Any], float]:
        self.timeouts.append(args[4])
        return {"status": "ok"}, 0.0


class Tools:
    memory = None  # TurnTools's memory bank: none here

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def model(self, agent: str, goal: str) -> Seen:
        return self.seen

    def backend(self, agent: str) -> Any:
        seen = self.seen

        class Backend:
            call = staticmethod(seen.backend_call)

        return Backend()


def test_no_call_is_given_more_than_the_cap() -> None:
    seen = Seen()
    tools: Any = Tools(seen)
    carrier = CommandCarrier(tools, InFlightCalls(), None, lambda: 0.0, max_call_s=3.0)
    rec = new_record(Budget())
    long = CallModel(
        call_id="m1", attempt_id="m1/a1", view="{}", max_output_tokens=10, timeout_s=500
    )
    short = CallModel(
        call_id="m2", attempt_id="m2/a1", view="{}", max_output_tokens=10, timeout_s=1
    )
    carrier.call_model(rec, long)
    carrier.call_model(rec, short)
    tool = DispatchTool(
        call_id="t1",
        attempt_id="t1/a1",
        tool="get_order",
        args={},
        idempotency_key="k",
        timeout_s=900,
        fence=1,
    )
    carrier.call_tool(rec, tool)
    assert seen.timeouts == [3.0, 1, 3.0]
