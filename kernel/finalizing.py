"""The funded closing step of FINALIZING (seed 004 10.4.4, 10.9.1-10.9.2, table 9 "finalize").

When a stop is decided and the agent declares closing work (``AgentProfile.closing``), the run
stays in FINALIZING for one model call that writes its report. The call is admitted like any
other, registered and reserved before it is sent, but against what the run has left with the
finalization reserve released to it (the reserve exists for this); its timeout is the budget's
``finalize_s``, a time allowance of its own counted from the stop, so an expired exploration
clock never leaves a cleanup without a bound. The run ends when the call answers, fails, is
recovered from a lost worker, or its allowance passes (a ``Tick``); whichever comes first.
A closing step the reserve cannot fund is skipped, and the chain says so.

Nothing here changes a record's state: :meth:`kernel.context.Draft.stop` takes the edges;
the closing call's answer is folded by :func:`kernel.fold.on_model_reply`, and a call that will
not answer is abandoned by :func:`kernel.control.abandon_closing`.
"""

from __future__ import annotations

from typing import Any, Protocol

from kernel.agent import AgentProfile
from kernel.amounts import model_call_liability
from kernel.errors import AdmissionRefused
from kernel.events import CallModel
from kernel.fastmodel import construct
from kernel.jsontext import sorted_text
from kernel.record import ClosingStep, Operation, TrajectoryRecord
from kernel.render import Estimator, render
from kernel.states import LifecycleState, StopReason


class Funding(Protocol):
    """What admitting the closing call needs of the kernel's context (``KernelContext``)."""

    @property
    def agent(self) -> AgentProfile: ...

    @property
    def estimator(self) -> Estimator: ...

    def reserved_input(self, estimated: int) -> int: ...


#: The longest closing report the record keeps (characters).
MAX_REPORT_CHARS = 4000


def closing_view(rec: TrajectoryRecord, instructions: str, stop: StopReason) -> str:
    """The closing call's input: the state view, the stop, and what is asked of the model."""
    return render(rec, {"stop": stop.value, "ask": instructions})


def begin(
    rec: TrajectoryRecord, ctx: Funding, now: float, detail: str | None
) -> tuple[CallModel | None, dict[str, Any]]:
    """Admit the closing call of ``rec`` (in FINALIZING, its stop recorded), if its agent
    declares one for this stop and none ran yet. Returns the command to send (None: nothing
    to send) and what the chain row says of it; on a command, ``rec`` holds the registered,
    reserved call and its :class:`ClosingStep`."""
    closing = ctx.agent.closing
    stop = rec.stop_reason
    if closing is None or stop is None or stop not in closing.stops or rec.closing is not None:
        return None, {}
    view = closing_view(rec, closing.instructions, stop)
    cap = closing.max_output_tokens
    tokens_in = ctx.reserved_input(ctx.estimator(view))
    liability = model_call_liability(ctx.agent.model.price, tokens_in, cap)
    call_id = f"{rec.trajectory_id}/m{rec.turn + 1}"
    attempt = f"{call_id}/a1"
    try:
        rec.ledger.admit(attempt, liability, finalizing=True)
    except AdmissionRefused as refused:
        why = f"the reserve cannot fund it: {refused.dimension} short"
        return None, {"closing": "not_funded", "why": why}
    rec.operations[call_id] = Operation.model_call(call_id, attempt, rec.control_epoch, liability)
    rec.turn += 1
    allowance = rec.budget.finalize_s
    rec.closing = construct(
        ClosingStep, call_id=call_id, since=now, until=round(now + allowance, 6), detail=detail
    )
    command = construct(
        CallModel,
        call_id=call_id,
        attempt_id=attempt,
        view=view,
        max_output_tokens=cap,
        timeout_s=allowance,
    )
    row = {"closing": "admitted", "call_id": call_id, "finalize_s": allowance}
    row["reserved"] = liability.model_dump(mode="json")
    return command, row


def awaiting(rec: TrajectoryRecord, call_id: str | None = None) -> bool:
    """True while ``rec`` waits in FINALIZING for its closing call (``call_id``, if named)."""
    closing = rec.closing
    if closing is None or rec.state is not LifecycleState.FINALIZING:
        return False
    op = rec.operations.get(closing.call_id)
    if op is None or not op.eligible:
        return False
    return call_id is None or call_id == closing.call_id


def report_text(content: Any) -> str:
    """The report a closing reply carries: its ``text`` field, or the whole reply as text."""
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        text = str(content["text"])
    elif isinstance(content, str):
        text = content
    else:
        text = sorted_text(content)
    return text[:MAX_REPORT_CHARS]
