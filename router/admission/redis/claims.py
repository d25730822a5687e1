"""The Redis admitter's claims as its scripts answer them, and what the reconciler reports.

A :class:`~router.admission.claims.Claim` of the shared admitter is held exclusively by one
admitter until it confirms, declines or withdraws it, or the reconciler reaps it after its
deadline (``docs/adr/0003-redis-admitter-claims.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kernel.errors import SnapshotNotFound, SubmissionRefused
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState
from router.admission.claims import Claim, ClaimBatch
from router.admission.drr import ReadyCall
from router.admission.gates import GateReading
from router.admission.lanes import LaneIndex
from store.redis_client import text

#: Whether a trajectory is still READY in the store: (tenant, trajectory id) -> bool.
Readiness = Callable[[str, str], bool]


@dataclass(frozen=True, slots=True)
class ClaimAttempt:
    """One claim script run: the claim, or None and how many nominations the gates refused."""

    claim: Claim | None
    refused: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What one :meth:`RedisAdmitter.reconcile` pass did with lapsed claims."""

    requeued: tuple[str, ...]
    dropped: tuple[str, ...]


class _Loads(Protocol):
    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord: ...


def store_readiness(store: _Loads) -> Readiness:
    """Readiness read from the trajectory store: the record exists and is READY."""

    def ready(tenant: str, trajectory_id: str) -> bool:
        try:
            return store.load(tenant, trajectory_id).state is LifecycleState.READY
        except SnapshotNotFound:
            return False

    return ready


def call_from(lanes: LaneIndex, trajectory_id: str, data: str) -> ReadyCall:
    """A queued call from its stored form, ``lane|class|input|output|charge|ready_at|route``.

    Raises IndexError for a lane or class ``lanes`` does not know (reload it: the state was
    reconfigured by another process)."""
    lane, klass, inp, out, charge, ready_at, route = data.split("|", 6)
    return ReadyCall(
        trajectory_id,
        lanes.name(int(lane)),
        lanes.class_name(int(lane), int(klass)),
        int(inp),
        int(out),
        int(charge),
        float(ready_at),
        route,
    )


def claims_from(lanes: LaneIndex, reply: Sequence[Any], depths: bool) -> ClaimBatch:
    """The claims in a claim.lua reply (layout in its header); IndexError as :func:`call_from`."""
    count = int(reply[0])
    width = (len(reply) - 5) // count if count else 10
    claims = []
    for n in range(count):
        row = reply[5 + n * width : 5 + (n + 1) * width]
        data = text(row[2])
        call = call_from(lanes, text(row[1]), data)
        lane, klass = (int(v) for v in data.split("|", 2)[:2])
        gate = None
        if call.route:
            gate = GateReading(call.route, True, "ok", *(int(v) for v in row[4:10]))
        after = [int(v) for v in row[10:]]
        before = list(after)
        if before:
            before[lane] += 1  # the claimed call was READY in its queue until now
        claims.append(
            Claim(
                lane,
                klass,
                call,
                claim_id=text(row[0]),
                seq=int(row[3]),
                gate=gate,
                depths=tuple(after),
                backlogged=lanes.backlogged(before),
            )
        )
    return ClaimBatch(tuple(claims), int(reply[1]), text(reply[2]), text(reply[4]))


def enqueued_from(
    lanes: LaneIndex, entries: Sequence[tuple[Any, ...]], reply: Sequence[Any]
) -> list[ReadyCall | SubmissionRefused]:
    """Per entry of an enqueue.lua run (layout in its header): the queued call or its refusal."""
    ready_at = float(text(reply[0]))
    answers: list[ReadyCall | SubmissionRefused] = []
    for entry, status in zip(entries, reply[1:], strict=True):
        tid, lane, klass, input_tokens, output_allowance, charge, route, _ = entry
        cfg = lanes.tenants[lane]
        if int(status) == -1:
            answers.append(SubmissionRefused(f"trajectory {tid} is already queued"))
        elif int(status) < -1:
            answers.append(
                SubmissionRefused(
                    f"tenant {cfg.name!r} already has {-2 - int(status):,} READY trajectories "
                    f"queued (max_ready {cfg.max_ready:,}); retry later"
                )
            )
        else:
            name = lanes.class_name(lane, klass)
            answers.append(
                ReadyCall(
                    tid, cfg.name, name, input_tokens, output_allowance, charge, ready_at, route
                )
            )
    return answers
