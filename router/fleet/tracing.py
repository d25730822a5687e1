"""What a process tells its tracer: spans of one trajectory's admissions, turns and calls.

The dispatcher and the turn runner report to ``observer.tracer`` (an observer of
:mod:`router.fleet.observe` carries one) and never name a tracing library. The base :class:`Tracer`
records nothing and costs a method call; ``ops.observability.tracing.OtelTracer`` overrides it with
OpenTelemetry spans when the standard ``OTEL_*`` variables configure an exporter.

One trace per trajectory: its trace id is a stable hash of ``tenant/trajectory_id``
(:func:`trace_id_of`), so every process that touches the trajectory writes into the same trace
without asking anyone, and the turn message carries the admission span's W3C ``traceparent``
(``TurnMessage.trace``) so a worker's turn span is the child of the router span that sent it.

Contract for every method: it never raises into the caller and never blocks on I/O (spans are
exported from a background thread, and dropped when its queue is full).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import xxhash

from kernel.chain import ChainRow
from kernel.context import StepResult
from kernel.record import TrajectoryRecord
from router.wire.turns import TurnMessage


def trace_id_of(tenant: str, trajectory_id: str) -> int:
    """The 128-bit trace id of a trajectory's one trace (never 0, which W3C forbids)."""
    return xxhash.xxh3_128_intdigest(f"{tenant}/{trajectory_id}".encode()) or 1


def root_span_id_of(tenant: str, trajectory_id: str) -> int:
    """The 64-bit span id of the trajectory's own span, the root of its trace (never 0)."""
    return xxhash.xxh3_64_intdigest(f"{tenant}/{trajectory_id}/invoke_agent".encode()) or 1


class Tracer:
    """Told what to make spans of; this base makes none (tracing off)."""

    #: True when spans are recorded (callers may skip building what only a span reads).
    enabled = False

    def admitted(self, rec: TrajectoryRecord, began: float, sent_by: str) -> str:
        """``sent_by`` committed ``rec``'s admission, which began at ``began`` (epoch seconds);
        returns the ``traceparent`` its turn message carries ("" for none)."""
        return ""

    def turn(self, msg: TurnMessage, worker: str) -> AbstractContextManager[None]:
        """The span of one turn on ``worker``, current while the block runs."""
        return _NOTHING

    def committed(self, result: StepResult, route: str) -> None:
        """``result`` was committed during the current turn; its model calls went to ``route``
        (``provider/model``): a span per model call and tool call its chain rows record."""

    def stopped(self, rec: TrajectoryRecord, row: ChainRow) -> None:
        """``rec`` was committed with its stop ``row``, by whichever process ended the run: the
        trajectory's own span, the root of its trace."""


_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()

#: The tracer of a process without tracing.
NO_TRACER = Tracer()
