"""One turn of one trajectory on a fleet worker: the model call and the tool calls it proposes.

:meth:`TurnRunner.run` loads the record and checks the message (:mod:`worker.turn_checks`),
carries out the committed commands (:mod:`worker.turn_commands`), commits each outcome by
compare-and-set before carrying out what it asks for, and ends the turn
(:mod:`worker.turn_ending`); the values it hands between those stages are in
:mod:`worker.turn_stages`. Nothing reaches a model or a tool that the store does not hold; a
lost race re-steps the same event on the reloaded record; a stale message changes nothing; each
message ends in exactly one notice or one hand-back, then its custody entry is released. With a
:class:`~worker.follow_on.FollowOn`, turns admitted here follow in the same call, and an
outcome that only leaves the trajectory READY waits to be committed with the next turn's
admission. An optional :class:`TurnObserver` is told of each turn and commit. See
docs/adr/0040-turn-runner.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from kernel.context import KernelContext, StepResult
from kernel.errors import ReinsError
from kernel.events import (
    CancelCall,
    Enqueue,
    Event,
    Recover,
)
from kernel.record import TrajectoryRecord
from router.fleet.commits import advance
from router.fleet.observe import AdmissionObserver, provider_of
from router.wire.custody import Custody
from router.wire.feed import CancelListener, Feed
from router.wire.notices import Notice, NoticeKind, ready_notice
from router.wire.turns import HandBackWhy, TurnMessage
from store.base import TrajectoryStore
from worker import turn_checks as checks
from worker.fleet_agents import TurnTools
from worker.follow_on import FollowOn
from worker.leases import LeaseKeeper
from worker.providers.base import InFlightCalls
from worker.tool_gates import ToolGates
from worker.turn_checks import HandBackInstead, Ignored, Opening
from worker.turn_commands import CommandCarrier, Metered
from worker.turn_ending import NO_USAGE, TurnEnding
from worker.turn_stages import (
    Ended,
    FollowOnTurn,
    Started,
    deferred,
    ending_of,
    idle,
    leaves_ready,
    news,
    resumed,
    try_step,
)

log = logging.getLogger("reins.worker.turn")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TurnReport:
    """How a turn ended: the notice kind, why, and how far the record's version moved."""

    outcome: NoticeKind
    reason: str
    advanced: int  # versions committed during the turn (0: the record did not change)
    version: int


class TurnObserver(AdmissionObserver):
    """Told of each turn's wall time as well as of each commit
    (``ops.observability.metrics.Metrics`` is one)."""

    def on_turn(self, worker: str, seconds: float) -> None:
        """One turn took ``seconds`` of wall time on ``worker`` (however it ended)."""

    def on_recall(self, tenant: str, hit: bool) -> None:
        """A ``recall_facts`` call of ``tenant`` found something (``hit``) or nothing."""

    def on_embedding_fallback(self, tenant: str) -> None:
        """A ``recall_facts`` call of ``tenant`` was ranked by the text index alone: the
        embedder (``REINS_EMBEDDINGS_URL``) failed or timed out."""

    def on_affinity(self, worker: str, hit: bool) -> None:
        """A turn with a previous turn started on ``worker``; ``hit``: this worker ran that
        previous turn (as far as its memory of recent trajectories reaches)."""

    def on_follow_on(self, worker: str) -> None:
        """``worker`` ran a turn it admitted itself, chained after the previous one."""

    def on_hand_back(self, worker: str, why: HandBackWhy) -> None:
        """``worker`` gave a turn message back unstarted, for ``why``."""

    def on_queue(self, worker: str, depth: int, oldest_age_s: float) -> None:
        """``worker``'s queue held ``depth`` messages, the oldest admitted ``oldest_age_s`` ago
        (0 when empty); told at each heartbeat."""


#: Trajectories a worker remembers running, for the affinity it reports (the oldest go first).
AFFINITY_MEMORY = 50_000


class TurnRunner:
    """Carries out turn messages; one instance per worker, called from many threads at once."""

    def __init__(
        self,
        *,
        store: TrajectoryStore,
        tools: TurnTools,
        feed: Feed,
        worker: str,
        calls_in_flight: InFlightCalls | None = None,
        listener: CancelListener | None = None,
        clock: Callable[[], float] = time.time,
        custody: Custody | None = None,
        observer: TurnObserver | None = None,
        leases: LeaseKeeper | None = None,
        follow_on: FollowOn | None = None,
        max_call_s: float = float("inf"),
        tool_gates: ToolGates | None = None,
        look_first: bool = False,
    ) -> None:
        calls_in_flight = (
            calls_in_flight if calls_in_flight is not None else InFlightCalls()
        )  # len() 0 is falsy
        self._carrier = CommandCarrier(
            tools,
            calls_in_flight,
            listener,
            clock,
            max_call_s,
            tool_gates,
            on_recall=self._on_recall,
            look_first=look_first,
            on_fallback=self._on_fallback,
        )
        self._ending = TurnEnding(feed, worker, custody, leases)
        self.store = store
        self.tools, self.calls_in_flight, self.clock = tools, calls_in_flight, clock
        self.feed, self.worker = feed, worker
        self.observer = observer or TurnObserver()
        self.follow_on = follow_on  # None: every READY turn goes back to a router
        self._providers: dict[str, str] = {}  # agent -> provider label of its model calls
        self._lock = threading.Lock()
        self._delays_ms: list[float] = []
        self._ran: OrderedDict[str, int] = OrderedDict()  # trajectory -> the last turn run here
        self.active = 0  # turns running now
        self.turns = 0  # turns taken since start

    def _on_recall(self, tenant: str, hit: bool) -> None:
        self.observer.on_recall(tenant, hit)  # the observer in place now (tests replace it)

    def _on_fallback(self, tenant: str) -> None:
        self.observer.on_embedding_fallback(tenant)

    # --- the entry points ----------------------------------------------------------------------

    def run(self, msg: TurnMessage, *, redelivered: bool = False) -> TurnReport:
        """Carry one turn through (see the module docstring); never raises for bad input.

        With a :class:`~worker.follow_on.FollowOn`, the turns it admits here follow in the same
        call; the report is the last turn's.
        """
        task_began = time.monotonic()
        report, nxt = self._turn(msg, redelivered, None, task_began)
        while nxt is not None:
            self.observer.on_follow_on(self.worker)
            report, nxt = self._turn(nxt.msg, False, nxt, task_began)
        return report

    def hand_back(self, msg: TurnMessage, why: HandBackWhy) -> None:
        """Give ``msg`` back unstarted, instead of its notice: a router sends it on under the
        same call ids (a member that cannot read the record is not sent it again)."""
        self._ending.hand_back(msg, why)
        self.observer.on_hand_back(self.worker, why)

    def push_kept(self) -> int:
        """Push again the turn-end notices whose push failed; returns how many went."""
        return self._ending.push_kept()

    def take_delays(self) -> list[float]:
        """The admission-to-start delays (ms) measured since the last call."""
        with self._lock:
            out, self._delays_ms = self._delays_ms, []
        return out

    # --- one turn ------------------------------------------------------------------------------

    def _turn(
        self, msg: TurnMessage, redelivered: bool, held: FollowOnTurn | None, task_began: float
    ) -> tuple[TurnReport, FollowOnTurn | None]:
        """Run one turn and account for it; whatever goes wrong still ends in one notice."""
        began, started = time.perf_counter(), self.clock()
        with self._lock:
            self.active += 1
            self.turns += 1
            if msg.admitted_at > 0:
                self._delays_ms.append(max(started - msg.admitted_at, 0.0) * 1000.0)
        holder = self._ending.keep_lease(msg)
        nxt: FollowOnTurn | None = None
        try:
            with self.observer.tracer.turn(msg, self.worker):
                report, nxt = self._run(msg, redelivered, held, task_began)
        except Ignored as why:
            log.warning(
                "ignored turn message for %s/%s (v%d, epoch %d) on %s: %s",
                msg.tenant,
                msg.trajectory_id,
                msg.version,
                msg.epoch,
                self.worker,
                why,
            )
            report = TurnReport(NoticeKind.IDLE, f"ignored: {why}", 0, msg.version)
            # An ignored message ran nothing: its lease is settled by the turn that holds it
            # (or lapses with a holder that died), never by this notice.
            if holder:
                self._ending.let_go(msg)
            self._ending.notify(msg, idle(msg), holder=False)
        except HandBackInstead as back:
            log.warning(
                "handed back turn of %s/%s (v%d) on %s: %s",
                msg.tenant,
                msg.trajectory_id,
                msg.version,
                self.worker,
                back,
            )
            self.hand_back(msg, back.why)
            report = TurnReport(NoticeKind.IDLE, f"handed back: {back}", 0, msg.version)
        except Exception:  # a bug or an unreachable store: the record stays for recovery
            log.exception("turn of %s/%s failed on %s", msg.tenant, msg.trajectory_id, self.worker)
            report = TurnReport(NoticeKind.IDLE, "failed", 0, msg.version)
            self._ending.notify(msg, idle(msg), holder=holder)
        finally:
            with self._lock:
                self.active -= 1
            self.observer.on_turn(self.worker, time.perf_counter() - began)
        return report, nxt

    def _run(
        self, msg: TurnMessage, redelivered: bool, held: FollowOnTurn | None, task_began: float
    ) -> tuple[TurnReport, FollowOnTurn | None]:
        turn = self._start(msg, redelivered) if held is None else resumed(held)
        first = turn.first
        self._note_affinity(turn.rec)
        follow_on = self.follow_on
        end = self._carry_out(
            turn, follow_on is not None and follow_on.may_follow_on(msg, task_began)
        )
        nxt: FollowOnTurn | None = None
        if end.kind is NoticeKind.READY:
            end, nxt = self._hand_over(msg, end, turn, task_began)
        else:
            self._notify(msg, end)
        version = end.rec.record_version
        return TurnReport(end.kind, end.reason, version - first, version), nxt

    def _ready(self, rec: TrajectoryRecord, msg: TurnMessage) -> Notice:
        """The READY notice of ``rec``, its next call pre-debited as its agent reserves it."""
        try:
            ctx: KernelContext | None = self.tools.agents.context(rec.agent)
        except ReinsError:  # it ran here a moment ago; if it cannot load now, the view alone
            ctx = None
        return ready_notice(rec, msg.call_id, self.clock(), self.tools.route(rec.agent), ctx)

    def _notify(self, msg: TurnMessage, end: Ended) -> None:
        """Push the one notice of a turn that ended here (``end``, committed)."""
        rec = end.rec
        if end.kind is NoticeKind.READY:
            notice = self._ready(rec, msg)
        else:
            if end.kind is NoticeKind.FINISHED:
                self._carrier.remember_episode(rec)
            notice = Notice(
                end.kind, rec.tenant, rec.trajectory_id, rec.record_version, msg.call_id
            )
        self._ending.notify(msg, notice, end.used_tokens, end.metered)

    def _note_affinity(self, rec: TrajectoryRecord) -> None:
        """Remember that this worker runs ``rec``'s current turn; report whether it ran the one
        before (a first turn has none to compare with)."""
        with self._lock:
            before = self._ran.pop(rec.trajectory_id, None)
            self._ran[rec.trajectory_id] = rec.turn
            if len(self._ran) > AFFINITY_MEMORY:
                self._ran.popitem(last=False)
        if rec.turn > 1 and before != rec.turn:  # the same turn again is a redelivery
            self.observer.on_affinity(self.worker, before == rec.turn - 1)

    def _start(self, msg: TurnMessage, redelivered: bool) -> Started:
        """Load the record, check the message against it and queue what the turn carries out."""
        rec = checks.load(self.store, msg)
        opening = checks.opening(rec, msg, redelivered)
        ctx = checks.context(self.tools, rec)
        turn = Started(rec, ctx, rec.record_version, deque())
        if opening is Opening.REQUEUE:
            # The turn ended READY but its notice may be lost: requeue it, changing nothing.
            turn.todo.append(Enqueue())
            log.info("redelivered turn of %s: READY, requeued", rec.trajectory_id)
        elif opening in (Opening.RECOVER, Opening.CANCELED):
            turn.rec, result = self._commit(rec, Recover(now=self.clock(), worker=self.worker), ctx)
            turn.todo.extend(result.commands if result else ())
            log.info("turn of %s: %s", turn.rec.trajectory_id, opening.value)
        else:
            checks.check_in_flight(rec, msg)
            turn.todo.extend(msg.commands)
        return turn

    def _carry_out(self, turn: Started, defer: bool = False) -> Ended:
        """Carry out the queued commands, committing each outcome before what it asks for.

        ``defer``: an outcome that leaves the trajectory READY with nothing else to do, the
        turn's last, is stepped and not committed (:class:`Pending`): asks nothing of anyone,
        so it waits for the next turn's admission (unless the reply brought quota news, which
        a router's gates must see)."""
        rec, todo, ctx = turn.rec, turn.todo, turn.ctx
        ended, reason, used = NoticeKind.IDLE, "nothing left to do", NO_USAGE
        last: Metered | None = None
        while todo:
            cmd = todo.popleft()
            ending = ending_of(cmd, rec)
            if ending is not None:
                ended, reason = ending
                continue
            if isinstance(cmd, CancelCall):
                self.calls_in_flight.cancel(cmd.call_id)
                self.feed.publish_cancel(rec.tenant, rec.trajectory_id, cmd.call_id)
                continue
            event, metered = self._carrier.carry_out(rec, cmd)
            if metered is not None:
                last = metered
                if metered.used_tokens is not None:
                    used = metered.used_tokens
            stepped = try_step(rec, event, ctx) if defer and not todo and not news(last) else None
            if stepped is not None and leaves_ready(rec, stepped):
                return deferred(rec, event, stepped, used, last)
            rec, result = self._commit(rec, event, ctx, stepped)
            if result is None:
                ended, reason = NoticeKind.IDLE, "the kernel refused an outcome (logged)"
                break
            if result.quarantined is not None:
                log.info("%s: reply quarantined (%s)", rec.trajectory_id, result.quarantined.why)
            todo.extend(result.commands)
        return Ended(rec, ended, reason, used, last)

    def _hand_over(
        self, msg: TurnMessage, end: Ended, turn: Started, task_began: float
    ) -> tuple[Ended, FollowOnTurn | None]:
        """A turn ended READY: admit its successor here (:mod:`worker.follow_on`), or push the
        READY notice that has a router requeue it. Returns how the turn ended (a pending last
        step landed, and what it asked carried out) and the turn that follows, if any; a turn
        that did not end READY after all has its notice pushed here too."""
        rec, used, ctx = end.rec, end.used_tokens, turn.ctx
        follow_on = self.follow_on
        if follow_on is None or news(end.metered) or not follow_on.may_follow_on(msg, task_began):
            end = self._land(turn, end)
            self._notify(msg, end)
            return end, None
        notice = self._ready(rec, msg)
        self._ending.let_go(msg)
        pending = end.pending
        landed: list[Ended] = []
        try:
            admitted = follow_on.admit(
                rec if pending is None else pending.before,
                msg,
                notice,
                ctx,
                used,
                pending.result if pending is not None else None,
                lambda: landed.append(self._land(turn, end)),
            )
        except Exception:  # nothing settled: the notice carries the lease to a router
            log.exception("could not admit the follow-on turn of %s", rec.trajectory_id)
            end = landed[0] if landed else self._land(turn, end)
            self._notify(msg, end)
            return end, None
        if admitted is None:  # the lease is settled
            end = landed[0] if landed else self._land(turn, end)
            self._notify(replace(msg, lease=""), end)
            return end, None
        if pending is not None and self.observer.tracer.enabled:
            self.observer.tracer.committed(pending.result, self.tools.route(rec.agent))
        result, nxt = admitted
        return end, FollowOnTurn(nxt, result.record, ctx, tuple(result.commands))

    def _land(self, turn: Started, end: Ended) -> Ended:
        """Commit a turn's pending last step the ordinary way (a lost race steps it again on the
        stored record, which may ask for more: that is carried out too); ``end`` as it was
        when nothing is pending."""
        pending = end.pending
        if pending is None:
            return end
        rec, result = self._commit(pending.before, pending.event, turn.ctx, pending.result)
        if result is None:
            why = "the kernel refused an outcome (logged)"
            return Ended(rec, NoticeKind.IDLE, why, end.used_tokens, end.metered)
        turn.rec, turn.todo = rec, deque(result.commands)
        tail = self._carry_out(turn)
        return replace(tail, used_tokens=end.used_tokens, metered=end.metered)

    def _commit(
        self,
        rec: TrajectoryRecord,
        event: Event,
        ctx: KernelContext,
        stepped: StepResult | None = None,
    ) -> tuple[TrajectoryRecord, StepResult | None]:
        """Step ``event`` (``stepped``: already stepped on ``rec``) and commit it by
        compare-and-set; on a lost race reload and re-step.

        Returns the newest record and the step's result, or None when the kernel refused the
        event on the current record (logged; nothing was written).
        """
        provider = self._provider(rec.agent)
        done = advance(self.store, rec, event, ctx, self.observer, provider, stepped=stepped)
        tracer = self.observer.tracer
        if tracer.enabled and done.committed and done.result is not None:
            tracer.committed(done.result, self.tools.route(rec.agent))
        if done.refusal is not None:
            log.warning(
                "%s: the kernel refused %s: %s", rec.trajectory_id, event.type, done.refusal
            )
        return done.record, done.result

    def _provider(self, agent: str) -> str:
        """The provider this worker calls for ``agent`` (its model overrides applied)."""
        found = self._providers.get(agent)
        if found is None:
            found = self._providers[agent] = provider_of(self.tools.route(agent))
        return found
