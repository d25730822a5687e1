"""What an ended run still owes, settled by the reconciler (seed 004, the settlement rule).

At the stop every operation still open passes to the reconciler with its reservation
(:meth:`Draft.stop`). A :class:`~kernel.events.Reconcile` event is the reconciler's pass over
them; the reconciler decides when (after a grace for late evidence, on a bounded schedule):

- a write whose tool can be asked (``on_unknown=LOOKUP``) is looked up under its key, with a
  fence newer than every attempt, so the answer stays true. Found settles it at its charge;
  absent settles it as sent without effect, and nothing is sent again: the run is over. A
  lookup is one call on the backend, admitted like any other against what the run has left,
  the finalization reserve included. That reserve is what guarantees a run that spent its
  tool calls can still be reconciled.
- anything else is written off: a model call whose bill never came, a read, a write that
  cannot be asked, one whose lookup the budget cannot fund, or one asked
  :data:`MAX_LOOKUPS` times without an answer. It is charged its whole reservation, so
  nothing is released without evidence, and the ledger closes. A written-off write's effect
  stays unknown; its chain row says so, for a person to check.

Late evidence still settles an operation the normal way (:mod:`kernel.results`) until then.
"""

from __future__ import annotations

from kernel.amounts import ONE_TOOL_CALL, ZERO, tool_call_charge
from kernel.chain import RowKind
from kernel.context import Draft
from kernel.errors import AdmissionRefused, IllegalTransition
from kernel.events import LookupEffect
from kernel.events import ToolResulted as ToolResultEvent
from kernel.record import Operation, OpKind, OpStatus, SettlementOwner
from kernel.states import LIVE
from kernel.tools import OnUnknown, ToolKind, ToolSpec

#: Lookups of one write the reconciler sends before it writes the write off.
MAX_LOOKUPS = 5
#: The attempt ids of the reconciler's lookups: ``<call id>/r<n>``.
LOOKUP_MARK = "/r"


def on_reconcile(draft: Draft) -> None:
    """Look up, or write off, every operation the reconciler owns (module docstring)."""
    rec = draft.rec
    if rec.state in LIVE:
        raise IllegalTransition(
            rec.state.value, rec.state.value, "reconcile", "a live run's operations are its own"
        )
    owed = [
        op
        for op in rec.operations.values()
        if op.open and op.settlement_owner is SettlementOwner.RECONCILER
    ]
    if not owed:
        draft.note = "nothing owed"
        return
    catalog = draft.ctx.agent.catalog
    for op in owed:
        spec = catalog.get(op.tool or "") if op.kind is OpKind.TOOL else None
        if (
            spec is None
            or spec.kind is not ToolKind.WRITE
            or spec.on_unknown is not OnUnknown.LOOKUP
        ):
            write_off(draft, op, "no lookup" if op.kind is OpKind.TOOL else "no bill came")
        elif lookups(op) >= MAX_LOOKUPS:
            write_off(draft, op, f"{MAX_LOOKUPS} lookups went unanswered")
        elif not _look_up(draft, op, spec):
            write_off(draft, op, "no budget left for a lookup")


def lookups(op: Operation) -> int:
    """The reconciler's lookups of ``op`` so far."""
    return sum(1 for a in op.attempts if LOOKUP_MARK in a)


def _look_up(draft: Draft, op: Operation, spec: ToolSpec) -> bool:
    """Admit and send one lookup of ``op``'s key; False if the budget cannot fund it."""
    attempt = f"{op.call_id}{LOOKUP_MARK}{lookups(op) + 1}"
    try:
        draft.rec.ledger.admit(attempt, ONE_TOOL_CALL, finalizing=True)
    except AdmissionRefused:
        return False
    op.status = OpStatus.UNKNOWN
    send_lookup(draft, op, attempt, spec.name)
    return True


def send_lookup(draft: Draft, op: Operation, attempt: str, tool: str) -> None:
    """Register ``attempt`` on ``op`` and ask the tool whether its key took effect, under
    the draft's fence (so every earlier attempt is shut out before the answer is read)."""
    op.attempts.append(attempt)
    draft.commands.append(
        LookupEffect(
            call_id=op.call_id,
            attempt_id=attempt,
            tool=tool,
            idempotency_key=op.idempotency_key,
            fence=draft.fence,
        )
    )


def on_answer(draft: Draft, op: Operation, ev: ToolResultEvent) -> None:
    """A lookup's answer on an ended run: found settles the write at its charge, absent as
    sent without effect (the lookup's fence shut every attempt out); nothing is re-sent. An
    answer that cannot tell (``unknown``) pays for its lookup and leaves the rest owed."""
    rec = draft.rec
    led = rec.ledger
    status = ev.result.get("status")
    if status == "unknown":
        if ev.attempt_id in led.reservations:
            led.book(ev.attempt_id, ONE_TOOL_CALL)
        draft.note = f"{op.call_id}: the lookup could not tell; still owed"
        return
    found = status != "absent"
    sends = [a for a in op.attempts if LOOKUP_MARK not in a and a in led.reservations]
    for attempt in op.attempts:
        held = led.reservations.get(attempt)
        if held is None:
            continue
        if LOOKUP_MARK in attempt or not found:
            led.book(attempt, ONE_TOOL_CALL)  # a call was made; no effect came of it
        elif attempt == sends[-1]:  # one effect, charged once: its bill, or the worst case
            led.book(attempt, tool_call_charge(ev.charge) if ev.charge is not None else held)
        else:
            led.book(attempt, ONE_TOOL_CALL)
    op.status = OpStatus.SETTLED
    effect = "found" if found else "absent"
    op.evidence = {"attempt": ev.attempt_id, **ev.result, "reconciled": effect}
    draft.row(
        RowKind.TOOL,
        call_id=op.call_id,
        tool=op.tool,
        args=op.args,
        outcome="reconciled",
        duration_s=ev.latency_s,
        detail={"key": op.idempotency_key, "attempt": ev.attempt_id, "effect": effect},
    )


def write_off(draft: Draft, op: Operation, why: str) -> None:
    """Close ``op`` without evidence: each open reservation is charged in full (the worst
    case becomes the cost, nothing is released). A write's effect stays unknown."""
    led = draft.rec.ledger
    charged = ZERO
    for attempt in op.attempts:
        held = led.reservations.get(attempt)
        if held is not None:
            led.book(attempt, held)
            charged += held.dollars
    op.status = OpStatus.SETTLED
    effect = "unknown" if op.kind is OpKind.TOOL and _writes(draft, op) else "none"
    op.evidence = {**(op.evidence or {}), "reconciled": "written_off", "effect": effect}
    draft.row(
        RowKind.TOOL if op.kind is OpKind.TOOL else RowKind.MODEL,
        call_id=op.call_id,
        tool=op.tool,
        outcome="written_off",
        detail={"why": why, "effect": effect, "charged_dollars": str(charged)},
    )


def _writes(draft: Draft, op: Operation) -> bool:
    spec = draft.ctx.agent.catalog.get(op.tool or "")
    return spec is None or spec.kind is ToolKind.WRITE
