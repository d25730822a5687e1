"""The values one turn hands between the stages of :class:`worker.turn.TurnRunner` (started,
carried out, ended, handed over to the next turn) and the pure decisions of how a turn ends."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from kernel.context import KernelContext, StepResult
from kernel.errors import ControlFlow, InvalidInput
from kernel.events import Command, Enqueue, Event, Finish, HoldForApproval
from kernel.record import TrajectoryRecord
from kernel.step import step
from router.wire.notices import Notice, NoticeKind
from router.wire.turns import TurnMessage
from worker.turn_commands import Metered

log = logging.getLogger("reins.worker.turn")


@dataclass(frozen=True, slots=True)
class FollowOnTurn:
    """A turn admitted on this worker (:mod:`worker.follow_on`): its message, the record its
    admission committed and the admission's commands."""

    msg: TurnMessage
    rec: TrajectoryRecord
    ctx: KernelContext
    commands: tuple[Command, ...]


@dataclass(slots=True)
class Started:
    """A turn about to carry out its commands: the record, its agent's context, the version
    the turn started from and the commands still to carry out."""

    rec: TrajectoryRecord
    ctx: KernelContext
    first: int
    todo: deque[Command]


@dataclass(frozen=True, slots=True)
class Pending:
    """A turn's last step, taken and not committed: it left the trajectory READY, and a
    follow-on admission commits it with the next turn's admission (one compare-and-set)."""

    before: TrajectoryRecord  # the stored record it was stepped on
    event: Event
    result: StepResult


@dataclass(frozen=True, slots=True)
class Ended:
    """A turn whose commands are all carried out: the newest record, how the turn ended and
    the model tokens its last metered call used."""

    rec: TrajectoryRecord
    kind: NoticeKind
    reason: str
    used_tokens: int
    metered: Metered | None = None  # the last model reply's meter (its quota feedback)
    pending: Pending | None = None  # the last step, when it is still to be committed


def resumed(held: FollowOnTurn) -> Started:
    """A turn admitted here: the record its admission committed, the admission's commands."""
    return Started(held.rec, held.ctx, held.rec.record_version, deque(held.commands))


def try_step(rec: TrajectoryRecord, event: Event, ctx: KernelContext) -> StepResult | None:
    """``event`` stepped on ``rec``, or None when the kernel refuses it (the ordinary commit
    steps it again and logs why)."""
    try:
        return step(rec, event, ctx)
    except (ControlFlow, InvalidInput):
        return None


def news(metered: Metered | None) -> bool:
    """True when a model reply said something of the provider's quota (a router's gates
    must see it: the turn ends with its notice)."""
    return metered is not None and metered.feedback


def deferred(
    rec: TrajectoryRecord, event: Event, result: StepResult, used: int, last: Metered | None
) -> Ended:
    """A turn ended READY by ``result``, a step of ``event`` on ``rec`` left to be committed
    with the next turn's admission."""
    if result.quarantined is not None:
        log.info("%s: reply quarantined (%s)", rec.trajectory_id, result.quarantined.why)
    pending = Pending(rec, event, result)
    return Ended(result.record, NoticeKind.READY, "ready", used, last, pending)


def leaves_ready(rec: TrajectoryRecord, result: StepResult) -> bool:
    """True when ``result`` changed ``rec`` and asks only that the trajectory be queued."""
    commands = result.commands
    return result.record is not rec and len(commands) == 1 and isinstance(commands[0], Enqueue)


def ending_of(cmd: Command, rec: TrajectoryRecord) -> tuple[NoticeKind, str] | None:
    """How ``cmd`` ends the turn, if it is one of the commands that end it."""
    if isinstance(cmd, Enqueue):
        return NoticeKind.READY, "ready"
    if isinstance(cmd, HoldForApproval):
        log.info("%s held for approval %s", rec.trajectory_id, cmd.approval_id)
        return NoticeKind.HELD, f"held for approval {cmd.approval_id}"
    if isinstance(cmd, Finish):
        return NoticeKind.FINISHED, f"finished: {cmd.stop.value}"
    return None


def idle(msg: TurnMessage) -> Notice:
    """The IDLE notice of a turn that changed nothing."""
    return Notice(NoticeKind.IDLE, msg.tenant, msg.trajectory_id, msg.version, msg.call_id)
