"""A provider's "not now" is backpressure (seed 004 10.8.2): a model reply REJECTED with nothing
used goes back to READY without telling the model, counting an error or a step; the record
names the route, the API's view shows the wait, and a stated bound ends a run no provider will
serve."""

from __future__ import annotations

from api.views import trajectory_of
from kernel.amounts import Usage
from kernel.backpressure import MAX_REJECTIONS
from kernel.events import CallModel, Enqueue, ModelReplied, ReplyStatus
from kernel.states import LifecycleState, StopReason
from tests.kernel.driver import READ, Driver

S = LifecycleState
ROUTE = "openai/gpt-4o-mini"


def refuse(d: Driver, call: CallModel, route: str | None = ROUTE) -> None:
    """The provider answers ``call`` 429: nothing used, a retry-after given."""
    d.now += 0.01
    d.apply(
        ModelReplied(
            now=d.now,
            call_id=call.call_id,
            status=ReplyStatus.REJECTED,
            content=None,
            usage=Usage(),
            latency_s=0.01,
            retry_after_s=2.0,
            route=route,
        )
    )


def test_refusals_past_the_error_limit_neither_reach_the_model_nor_fail_the_run() -> None:
    d = Driver()
    limit = d.rec.budget.max_same_error
    for n in range(1, limit + 3):
        refuse(d, d.admit())
        assert d.rec.state is S.READY and d.commands(Enqueue), "back to its queue, asked again"
        assert d.rec.rejections == n and d.rec.rejected_by == ROUTE
        assert d.rec.error_streak.count == 0 and d.rec.stalls == 0, "no error, no step"
        assert d.rec.last_observation is None, "the model is not told"
        assert d.last is not None and [r.outcome for r in d.last.rows] == ["REJECTED", "waiting"]
        assert d.last.rows[1].detail == {"on": ROUTE, "in_a_row": n, "retry_after_s": 2.0}
        assert d.rec.ledger.steps.actual == 0, "a refused call used no step"
    (waiting,) = trajectory_of(d.rec).waiting
    assert waiting.tool == "model" and waiting.on == f"{ROUTE} ({limit + 2} refused)"
    assert waiting.call_id == f"{d.rec.trajectory_id}/m{d.rec.turn + 1}"
    d.reply(d.admit(), READ)
    assert d.rec.rejections == 0 and d.rec.rejected_by is None, "an answer ends the wait"
    assert d.rec.state is S.WAITING_TOOL and trajectory_of(d.rec).waiting == []


def test_a_refusal_without_a_routed_answer_names_the_agents_own_route() -> None:
    d = Driver()
    refuse(d, d.admit(), route=None)
    model = d.ctx.agent.model
    assert d.rec.rejected_by == f"{model.provider}/{model.name}"


def test_a_provider_that_never_serves_ends_the_run_at_the_stated_bound() -> None:
    d = Driver()
    for _ in range(MAX_REJECTIONS):
        refuse(d, d.admit())
    assert d.rec.state is S.FAILED and d.rec.stop_reason is StopReason.FAILED
    rows = [r for result in d.history for r in result.rows]
    said = f"{ROUTE} refused {MAX_REJECTIONS} calls in a row"
    assert any(r.outcome == "failed" and r.error == said for r in rows), "the stop names why"


def test_a_rejection_that_used_tokens_is_still_an_error_the_model_sees() -> None:
    d = Driver()
    d.reply(d.admit(), None, status=ReplyStatus.REJECTED)  # the driver's usage: 120 tokens
    assert d.rec.rejections == 0 and d.rec.error_streak.count == 1
    assert d.rec.last_observation == {"status": "error", "code": "reply_rejected"}
