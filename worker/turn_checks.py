"""Whether a received turn message applies to the record, checked before anything is done.

A check that fails raises :class:`Ignored` (the turn is a no-op: logged, one IDLE notice) or
:class:`HandBackInstead` (this member cannot run the turn: it goes back unstarted). Neither
changes the record. A redelivered message is settled from the record (``Recover``), or only
requeued if its turn already ended READY; it never sends a call again blindly. See
docs/adr/0040-turn-runner.md.
"""

from __future__ import annotations

import enum

from kernel import finalizing
from kernel.context import KernelContext
from kernel.errors import InvalidInput, ReinsError, StoreError, UnsupportedSchema
from kernel.events import CallModel, LookupEffect
from kernel.record import ControlKind, Operation, SettlementOwner, TrajectoryRecord
from kernel.states import LIVE, LifecycleState
from router.wire.turns import HandBackWhy, TurnMessage, WorkerCommand
from store.base import TrajectoryStore
from worker.fleet_agents import TurnTools

S = LifecycleState


class Ignored(Exception):
    """The message does not apply to the record; the reason is logged, nothing changes."""


class HandBackInstead(Exception):
    """This member cannot carry the turn out; it goes back, unstarted, to another member."""

    def __init__(self, why: HandBackWhy, detail: str) -> None:
        super().__init__(detail)
        self.why = why


class Opening(enum.Enum):
    """How a received message starts its turn."""

    CARRY_OUT = "carry out the message's commands"
    RECOVER = "redelivered mid-call: recover from the record"
    CANCELED = "canceled before it started: recover, which carries the cancel out"
    REQUEUE = "redelivered after it ended READY: requeue, changing nothing"


def load(store: TrajectoryStore, msg: TurnMessage) -> TrajectoryRecord:
    """The message's record; raises :class:`Ignored` or :class:`HandBackInstead` if unreadable."""
    try:
        return store.load(msg.tenant, msg.trajectory_id)
    except StoreError as exc:
        raise Ignored(f"cannot load the record ({exc})") from None
    except UnsupportedSchema as exc:  # written by a newer build: left as it is, for one
        raise HandBackInstead(HandBackWhy.SCHEMA, str(exc)) from None
    except InvalidInput as exc:
        raise Ignored(f"cannot read the record ({exc})") from None


def context(tools: TurnTools, rec: TrajectoryRecord) -> KernelContext:
    """The kernel context of ``rec``'s agent; :class:`Ignored` if it cannot be loaded here."""
    try:
        return tools.agents.context(rec.agent)
    except ReinsError as exc:
        raise Ignored(f"agent {rec.agent!r} cannot be loaded here ({exc})") from None


def opening(rec: TrajectoryRecord, msg: TurnMessage, redelivered: bool) -> Opening:
    """How ``msg`` starts on ``rec``; raises :class:`Ignored` for a stale version or epoch.

    A message opened to CARRY_OUT is still to pass :func:`check_in_flight`.
    """
    if redelivered and ended_ready(rec, msg):
        return Opening.REQUEUE
    if canceled_unstarted(rec, msg):
        return Opening.CANCELED
    check_current(rec, msg)  # a stale message stops here, changing nothing
    if redelivered and (rec.state in (S.CALLING_MODEL, S.WAITING_TOOL) or finalizing.awaiting(rec)):
        return Opening.RECOVER
    return Opening.CARRY_OUT


def check_current(rec: TrajectoryRecord, msg: TurnMessage) -> None:
    """Refuse a message whose version or epoch is not the record's, unless the record only
    took in late evidence since (:func:`still_sent`)."""
    if rec.record_version != msg.version and not still_sent(rec, msg):
        raise Ignored(
            f"stale version: the message expects v{msg.version}, "
            f"the record is at v{rec.record_version} ({rec.state.value})"
        )
    if rec.control_epoch != msg.epoch:
        raise Ignored(
            f"stale epoch: the message was admitted under control epoch {msg.epoch}, "
            f"the record is at epoch {rec.control_epoch}"
        )


def canceled_unstarted(rec: TrajectoryRecord, msg: TurnMessage) -> bool:
    """True when a cancel withdrew the model call ``msg`` carries before any worker ran it to
    its end: the record still waits in the call, under a later epoch, for a reply that nobody
    will bring unless this message's call is sent. Sending it would spend for a run that is
    over; recovering the turn carries the cancel out now instead of after the stranded sweep.
    A copy still running elsewhere only brings late evidence (settled, never acted on)."""
    pending = rec.pending_control
    if pending is None or pending.kind is not ControlKind.CANCEL:
        return False
    if rec.state is not S.CALLING_MODEL or rec.control_epoch <= msg.epoch or not msg.commands:
        return False
    for cmd in msg.commands:
        op = rec.operations.get(cmd.call_id)
        if not isinstance(cmd, CallModel) or op is None or not op.open or op.eligible:
            return False
        if op.attempts[-1] != cmd.attempt_id:
            return False
    return True


def still_sent(rec: TrajectoryRecord, msg: TurnMessage) -> bool:
    """True when ``rec`` moved past the message's version without leaving the turn it sent:
    the same epoch, and every command's call still open, eligible and at the attempt the
    message carries. Only evidence of other calls moves a record so (a withdrawn call's late
    reply, a late write refused for its fence, a progress line); it must not strand the turn."""
    if rec.record_version < msg.version or rec.control_epoch != msg.epoch or not msg.commands:
        return False
    acting = S.CALLING_MODEL if isinstance(msg.commands[0], CallModel) else S.WAITING_TOOL
    if rec.state is not acting and not finalizing.awaiting(rec, msg.call_id or None):
        return False
    for cmd in msg.commands:
        op = rec.operations.get(cmd.call_id)
        if op is None or not op.open or not op.eligible or op.attempts[-1] != cmd.attempt_id:
            return False
    return True


def check_in_flight(rec: TrajectoryRecord, msg: TurnMessage) -> None:
    """Every command must name an operation the record holds as in flight and eligible; in
    FINALIZING, the closing step's call; on an ended run, only the reconciler's latest lookup
    of a call it still owes (kernel.owed)."""
    if not msg.commands:
        raise Ignored("the message carries no command")
    ended = rec.state not in LIVE
    for cmd in msg.commands:
        op = rec.operations.get(cmd.call_id)
        if isinstance(cmd, CallModel) and finalizing.awaiting(rec, cmd.call_id):
            continue  # the closing step's call of a run in FINALIZING (kernel.finalizing)
        if ended:
            if not _owed_lookup(op, cmd):
                raise Ignored(
                    f"call {cmd.call_id}: the run has ended; only the reconciler's latest "
                    "lookup of a call it still owes is carried out"
                )
            continue
        if op is None or not op.open or not op.eligible:
            raise Ignored(f"call {cmd.call_id} is not in flight in the record")
        if isinstance(cmd, CallModel) and rec.state is not S.CALLING_MODEL:
            raise Ignored(f"call {cmd.call_id}: the record is {rec.state.value}")


def _owed_lookup(op: Operation | None, cmd: WorkerCommand) -> bool:
    """True for the reconciler's latest lookup of an operation it still owes."""
    if op is None or not op.open or op.settlement_owner is not SettlementOwner.RECONCILER:
        return False
    return isinstance(cmd, LookupEffect) and op.attempts[-1] == cmd.attempt_id


def ended_ready(rec: TrajectoryRecord, msg: TurnMessage) -> bool:
    """A redelivered message whose turn is the record's last one and ended READY: its worker
    died after the READY commit, perhaps before the notice that requeues it."""
    return (
        rec.state is S.READY
        and bool(msg.call_id)
        and msg.call_id == f"{rec.trajectory_id}/m{rec.turn}"
        and rec.record_version > msg.version
    )
