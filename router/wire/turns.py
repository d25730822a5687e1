"""The turn message a router sends a worker through Celery, and the hand-back of one a member
gave back unstarted: the worker's half of the wire (the rest is :mod:`router.wire.feed`).

Both are JSON objects of their fields by name, with a ``format`` (:data:`TURN_FORMAT`); a
message without one is of format 1 (every build before formats were written), and a field this
build does not know is ignored, so adding a field never shifts another. A message of a newer
format is refused as malformed (a newer build's, for a worker that reads it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kernel.errors import InvalidInput
from kernel.events import CallModel, Command, DispatchTool, LookupEffect
from kernel.record import TrajectoryRecord

_COMMANDS: dict[str, type[CallModel | DispatchTool | LookupEffect]] = {
    "call_model": CallModel,
    "dispatch_tool": DispatchTool,
    "lookup_effect": LookupEffect,
}
#: The turn message and hand-back format this build writes and reads (module docstring).
TURN_FORMAT = 1
#: Commands a turn message may carry: the ones a worker carries out against the world.
WorkerCommand = CallModel | DispatchTool | LookupEffect


@dataclass(frozen=True, slots=True)
class TurnMessage:
    """What a router sends a worker: advance one trajectory by one turn.

    ``version`` and ``epoch`` are the record's at the commit that registered the commands; a
    worker that finds the record elsewhere ignores the message (a redelivery, or a control
    request that came first). ``commands`` are the kernel's, as committed: usually one
    ``CallModel``; after an approval, the ``DispatchTool`` it admitted.
    """

    tenant: str
    trajectory_id: str
    version: int
    epoch: int
    commands: tuple[WorkerCommand, ...]
    admitted_at: float
    sent_by: str = ""
    lease: str = ""  # the gate lease taken at admission, handed back in the turn's notice
    route: str = ""
    refused_by: tuple[str, ...] = ()  # members that handed it back unable to read the record
    lease_ttl_s: float = 0.0  # the gate lease lapses unless renewed this often (0: no lease)
    follow_on: int = 0  # turns the worker may admit after this one itself (worker.follow_on)
    trace: str = ""  # the admission span's W3C traceparent ("": not traced; router.fleet.tracing)

    @classmethod
    def of(
        cls,
        rec: TrajectoryRecord,
        commands: tuple[WorkerCommand, ...],
        admitted_at: float,
        **rest: Any,
    ) -> TurnMessage:
        """The message of ``rec``'s turn, at the version and epoch its commands were committed
        at; ``rest``: the other fields (sender, lease, route, ...)."""
        return cls(
            tenant=rec.tenant,
            trajectory_id=rec.trajectory_id,
            version=rec.record_version,
            epoch=rec.control_epoch,
            commands=commands,
            admitted_at=admitted_at,
            **rest,
        )

    @property
    def call_id(self) -> str:
        """The model call this turn carries out ("" when it carries none)."""
        for cmd in self.commands:
            if isinstance(cmd, CallModel):
                return cmd.call_id
        return ""

    def to_payload(self) -> dict[str, Any]:
        """The JSON-ready task argument."""
        return {
            "format": TURN_FORMAT,
            "tenant": self.tenant,
            "trajectory_id": self.trajectory_id,
            "version": self.version,
            "epoch": self.epoch,
            "commands": [c.model_dump(mode="json") for c in self.commands],
            "admitted_at": self.admitted_at,
            "sent_by": self.sent_by,
            "lease": self.lease,
            "route": self.route,
            "refused_by": list(self.refused_by),
            "lease_ttl_s": self.lease_ttl_s,
            "follow_on": self.follow_on,
            "trace": self.trace,
        }

    @classmethod
    def from_payload(cls, payload: Any) -> TurnMessage:
        """Parse a task argument; raise :class:`InvalidInput` for anything malformed."""
        try:
            _check_format(payload.get("format", 1), "turn message")
            commands = tuple(
                _COMMANDS[c["type"]].model_validate(c) for c in payload.get("commands", ())
            )
            return cls(
                tenant=str(payload["tenant"]),
                trajectory_id=str(payload["trajectory_id"]),
                version=int(payload["version"]),
                epoch=int(payload["epoch"]),
                commands=commands,
                admitted_at=float(payload.get("admitted_at", 0.0)),
                sent_by=str(payload.get("sent_by", "")),
                lease=str(payload.get("lease", "")),
                route=str(payload.get("route", "")),
                refused_by=tuple(str(m) for m in payload.get("refused_by", ())),
                lease_ttl_s=float(payload.get("lease_ttl_s", 0.0)),
                follow_on=_not_negative("follow_on", int(payload.get("follow_on", 0))),
                trace=str(payload.get("trace", "")),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidInput(f"malformed turn message: {exc}") from None


def _check_format(found: object, what: str) -> None:
    if found != TURN_FORMAT:
        raise ValueError(f"a {what} of format {found!r}; this build reads {TURN_FORMAT}")


def _not_negative(name: str, value: int) -> int:
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


class HandBackWhy(StrEnum):
    """Why a member gave a turn message back without starting it."""

    DRAINING = "draining"  # its drain grace ran out before it could start the turn
    SCHEMA = "schema"  # it cannot read the record (written by a newer build)


@dataclass(frozen=True, slots=True)
class HandBack:
    """A turn message a member gave back unstarted; a router sends it on to another member
    under the same call ids (nothing of it was carried out)."""

    member: str
    why: HandBackWhy
    message: TurnMessage

    def encode(self) -> bytes:
        body = {
            "format": TURN_FORMAT,
            "member": self.member,
            "why": self.why.value,
            "message": self.message.to_payload(),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> HandBack:
        """Parse a stored hand-back; raise :class:`InvalidInput` for anything malformed."""
        try:
            body = json.loads(raw)
            _check_format(body.get("format", 1), "hand-back")
            return cls(
                str(body["member"]),
                HandBackWhy(body["why"]),
                TurnMessage.from_payload(body["message"]),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidInput(f"malformed hand-back: {exc}") from None


def worker_commands(commands: Sequence[Command]) -> tuple[WorkerCommand, ...]:
    """The commands of a step that a worker must carry out, in order."""
    return tuple(c for c in commands if isinstance(c, CallModel | DispatchTool | LookupEffect))
