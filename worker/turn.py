"""One turn of one trajectory on a fleet worker: the model call and the tool calls it proposes.

:meth:`TurnRunner.run` takes a :class:`~router.feed.TurnMessage` and carries the turn through:
load the record, check that the message is current, carry out the commands the router
committed, fold each outcome into the record with the step function, and carry out what that
step asks for, until the step ends the turn (READY again, held for approval, finished) or has
nothing left to do (the trajectory was paused, interrupted or canceled while the turn ran).

Contracts:

* **Register before send.** Every step that changed the record is committed by compare-and-set
  before the commands it produced are carried out; nothing goes to a model or a tool that the
  store does not already hold, with its reservation and idempotency key.
* **Events are facts.** A commit that loses its race reloads the record and steps the same
  event again: a control request that landed meanwhile is then honoured (a paused trajectory's
  reply is settled and quarantined, never acted on).
* **Stale messages do nothing.** A message whose expected version or control epoch is not the
  record's, or whose call is no longer in flight, is ignored with a logged reason and the
  record is left as it is. A message Celery redelivers (its first worker died, or the
  visibility timeout ran out) whose version still matches may or may not have been carried
  out: the kernel's ``Recover`` settles that from the record, and no call is sent again
  blindly. A redelivered message whose turn already ended READY only requeues the trajectory
  (its notice may have died with the worker); the record does not change. A turn its worker
  left further along (a tool registered, its result not in) is recovered by the router's
  reconciler (:mod:`router.reconcile`) once the worker's heartbeat lapses, not by the stale
  message.
* **Holdings.** After a turn's notice is pushed, the turn is released from this worker's
  holdings (only if they still name the version carried out), so the router's reconciler
  recovers exactly the turns a dead worker still held.
* **One notice per message.** However the turn ends, even ignored, the worker pushes exactly
  one notice to the ready feed, so the router can requeue the trajectory and settle the gate;
  or, for a turn it cannot start (a record of a schema this build does not read, or a drain
  whose grace ran out), one hand-back, which a router sends on to another member with the
  same call ids and gate lease (:class:`~router.feed.HandBack`). Nothing is changed first.
* **Chained turns.** With a :class:`~worker.chain.TurnChain`, a turn that ends READY may be
  followed in the same call by the trajectory's next turn, admitted here when that overtakes
  nobody in the shared admitter (:mod:`worker.chain`); the message's one notice is then the last
  turn's, or the READY notice of the turn the chain left to a router (its lease settled).
* **Observed, not metered here.** An optional :class:`TurnObserver` (Prometheus metrics from
  ``ops``) is told each turn's wall time, each step committed (after its compare-and-set) and
  each compare-and-set lost; without one, nothing is reported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from kernel.context import KernelContext, StepResult
from kernel.errors import (
    InvalidInput,
    ReinsError,
    StoreError,
    UnsupportedSchema,
)
from kernel.events import (
    CallModel,
    CancelCall,
    Command,
    DispatchTool,
    Enqueue,
    Event,
    Finish,
    HoldForApproval,
    LookupEffect,
    Recover,
    ToolResulted,
)
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState
from kernel.tools import ToolKind
from router.commits import advance
from router.feed import (
    CancelListener,
    Feed,
    HandBack,
    HandBackWhy,
    Notice,
    NoticeKind,
    TurnMessage,
    ready_notice,
)
from router.observe import AdmissionObserver, provider_of
from router.reconcile import Holdings
from store.base import TrajectoryStore
from worker.backend import dispatch
from worker.chain import TurnChain
from worker.fleet_agents import TurnTools
from worker.leases import LeaseKeeper
from worker.providers.base import InflightCalls

S = LifecycleState
log = logging.getLogger("reins.worker.turn")


@dataclass(frozen=True, slots=True)
class TurnReport:
    """How a turn ended: the notice kind, why, and how far the record's version moved."""

    outcome: NoticeKind
    reason: str
    advanced: int  # versions committed during the turn (0: the record did not change)
    version: int


class TurnObserver(AdmissionObserver):
    """Told of each turn's wall time as well as of each commit (``ops.metrics.Metrics`` is one)."""

    def on_turn(self, worker: str, seconds: float) -> None:
        """One turn took ``seconds`` of wall time on ``worker`` (however it ended)."""


@dataclass(frozen=True, slots=True)
class _Chained:
    """A turn admitted on this worker (:mod:`worker.chain`): its message, the record its
    admission committed and the admission's commands."""

    msg: TurnMessage
    rec: TrajectoryRecord
    ctx: KernelContext
    commands: tuple[Command, ...]


class _Ignored(Exception):
    """The message does not apply to the record; the reason is logged, nothing changes."""


class _HandBack(Exception):
    """This member cannot carry the turn out; it goes back, unstarted, to another member."""

    def __init__(self, why: HandBackWhy, detail: str) -> None:
        super().__init__(detail)
        self.why = why


class TurnRunner:
    """Carries out turn messages; one instance per worker, called from many threads at once."""

    def __init__(
        self,
        *,
        store: TrajectoryStore,
        tools: TurnTools,
        feed: Feed,
        worker: str,
        inflight: InflightCalls | None = None,
        listener: CancelListener | None = None,
        clock: Callable[[], float] = time.time,
        holdings: Holdings | None = None,
        observer: TurnObserver | None = None,
        leases: LeaseKeeper | None = None,
        chain: TurnChain | None = None,
    ) -> None:
        self.store, self.tools, self.feed, self.worker = store, tools, feed, worker
        self.observer = observer or TurnObserver()
        self.leases = leases  # the turn's gate lease is kept alive while it runs
        self.chain = chain  # None: every READY turn goes back to a router
        self._providers: dict[str, str] = {}  # agent -> provider label of its model calls
        self.holdings = holdings  # released after each notice (router.reconcile)
        self.inflight = inflight if inflight is not None else InflightCalls()  # len() 0 is falsy
        self.listener = listener
        self.clock = clock
        self._lock = threading.Lock()
        self._delays_ms: list[float] = []
        self.active = 0  # turns running now
        self.turns = 0  # turns taken since start

    # --- the entry point -----------------------------------------------------------------------

    def run(self, msg: TurnMessage, *, redelivered: bool = False) -> TurnReport:
        """Carry one turn through (see the module docstring); never raises for bad input.

        With a :class:`~worker.chain.TurnChain`, the turns it admits here follow in the same
        call; the report is the last turn's.
        """
        task_began = time.monotonic()
        report, nxt = self._turn(msg, redelivered, None, task_began)
        while nxt is not None:
            report, nxt = self._turn(nxt.msg, False, nxt, task_began)
        return report

    def _turn(
        self, msg: TurnMessage, redelivered: bool, held: _Chained | None, task_began: float
    ) -> tuple[TurnReport, _Chained | None]:
        began, started = time.perf_counter(), self.clock()
        with self._lock:
            self.active += 1
            self.turns += 1
            if msg.admitted_at > 0:
                self._delays_ms.append(max(started - msg.admitted_at, 0.0) * 1000.0)
        if self.leases is not None:
            self.leases.hold(msg.route, msg.lease, msg.lease_ttl_s)
        used = [-1]
        nxt: _Chained | None = None
        try:
            report, nxt = self._run(msg, redelivered, used, held, task_began)
        except _Ignored as why:
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
            self._notify(msg, self._idle(msg))
        except _HandBack as back:
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
            self._notify(msg, self._idle(msg))
        finally:
            with self._lock:
                self.active -= 1
            self.observer.on_turn(self.worker, time.perf_counter() - began)
        return report, nxt

    @staticmethod
    def _idle(msg: TurnMessage) -> Notice:
        return Notice(NoticeKind.IDLE, msg.tenant, msg.trajectory_id, msg.version, msg.call_id)

    def take_delays(self) -> list[float]:
        """The admission-to-start delays (ms) measured since the last call."""
        with self._lock:
            out, self._delays_ms = self._delays_ms, []
        return out

    # --- the turn ------------------------------------------------------------------------------

    def _run(
        self,
        msg: TurnMessage,
        redelivered: bool,
        used: list[int],
        held: _Chained | None,
        task_began: float,
    ) -> tuple[TurnReport, _Chained | None]:
        todo: deque[Command] = deque()
        if held is not None:  # admitted here: the record it committed, the admission's commands
            rec, ctx, first = held.rec, held.ctx, held.rec.record_version
            todo.extend(held.commands)
        else:
            rec = self._load(msg)
            ctx, first = self._start(rec, msg, redelivered, todo)
        ended, reason = NoticeKind.IDLE, "nothing left to do"
        while todo:
            cmd = todo.popleft()
            if isinstance(cmd, Enqueue):
                ended, reason = NoticeKind.READY, "ready"
                continue
            if isinstance(cmd, HoldForApproval):
                ended, reason = NoticeKind.HELD, f"held for approval {cmd.approval_id}"
                log.info("%s held for approval %s", rec.trajectory_id, cmd.approval_id)
                continue
            if isinstance(cmd, Finish):
                ended, reason = NoticeKind.FINISHED, f"finished: {cmd.stop.value}"
                continue
            if isinstance(cmd, CancelCall):
                self.inflight.cancel(cmd.call_id)
                self.feed.publish_cancel(rec.tenant, rec.trajectory_id, cmd.call_id)
                continue
            event = self._carry_out(rec, cmd, used)
            rec, result = self._commit(rec, event, ctx)
            if result is None:
                ended, reason = NoticeKind.IDLE, "the kernel refused an outcome (logged)"
                break
            if result.quarantined is not None:
                log.info("%s: reply quarantined (%s)", rec.trajectory_id, result.quarantined.why)
            todo.extend(result.commands)
        report = TurnReport(ended, reason, rec.record_version - first, rec.record_version)
        if ended is not NoticeKind.READY:
            notice = Notice(ended, rec.tenant, rec.trajectory_id, rec.record_version, msg.call_id)
            self._notify(msg, notice, used[0])
            return report, None
        notice = ready_notice(rec, msg.call_id, self.clock(), self.tools.route(rec.agent))
        chain = self.chain
        if chain is None or not chain.may_chain(msg, task_began):
            self._notify(msg, notice, used[0])
            return report, None
        self._let_go(msg)
        try:
            admitted = chain.admit(rec, msg, notice, ctx, used[0])
        except Exception:  # nothing settled: the notice carries the lease to a router
            log.exception("could not chain the next turn of %s", rec.trajectory_id)
            self._notify(msg, notice, used[0])
            return report, None
        if admitted is None:
            self._notify(replace(msg, lease=""), notice, used[0])  # the lease is settled
            return report, None
        result, nxt = admitted
        return report, _Chained(nxt, result.record, ctx, tuple(result.commands))

    def _start(
        self, rec: TrajectoryRecord, msg: TurnMessage, redelivered: bool, todo: deque[Command]
    ) -> tuple[KernelContext, int]:
        """Check a received message against the record; queue what the turn carries out."""
        lost_notice = redelivered and _ended_ready(rec, msg)
        if not lost_notice:
            self._check_current(rec, msg)  # a stale message stops here, changing nothing
        ctx = self._context(rec)
        first = rec.record_version
        if lost_notice:
            # The turn ended READY but its notice may be lost: requeue it, changing nothing.
            todo.append(Enqueue())
            log.info("redelivered turn of %s: READY, requeued", rec.trajectory_id)
        elif redelivered and rec.state in (S.CALLING_MODEL, S.WAITING_TOOL):
            rec, result = self._commit(rec, Recover(now=self.clock(), worker=self.worker), ctx)
            todo.extend(result.commands if result else ())
            log.info("redelivered turn of %s: recovered from the record", rec.trajectory_id)
        else:
            self._check_in_flight(rec, msg)
            todo.extend(msg.commands)
        return ctx, first

    def _load(self, msg: TurnMessage) -> TrajectoryRecord:
        try:
            return self.store.load(msg.tenant, msg.trajectory_id)
        except StoreError as exc:
            raise _Ignored(f"cannot load the record ({exc})") from None
        except UnsupportedSchema as exc:  # written by a newer build: left as it is, for one
            raise _HandBack(HandBackWhy.SCHEMA, str(exc)) from None
        except InvalidInput as exc:
            raise _Ignored(f"cannot read the record ({exc})") from None

    @staticmethod
    def _check_current(rec: TrajectoryRecord, msg: TurnMessage) -> None:
        """Refuse a message whose version or epoch is not the record's."""
        if rec.record_version != msg.version:
            raise _Ignored(
                f"stale version: the message expects v{msg.version}, "
                f"the record is at v{rec.record_version} ({rec.state.value})"
            )
        if rec.control_epoch != msg.epoch:
            raise _Ignored(
                f"stale epoch: the message was admitted under control epoch {msg.epoch}, "
                f"the record is at epoch {rec.control_epoch}"
            )

    def _context(self, rec: TrajectoryRecord) -> KernelContext:
        try:
            return self.tools.agents.context(rec.agent)
        except ReinsError as exc:
            raise _Ignored(f"agent {rec.agent!r} cannot be loaded here ({exc})") from None

    @staticmethod
    def _check_in_flight(rec: TrajectoryRecord, msg: TurnMessage) -> None:
        """Every command must name an operation the record holds as in flight and eligible."""
        if not msg.commands:
            raise _Ignored("the message carries no command")
        for cmd in msg.commands:
            op = rec.operations.get(cmd.call_id)
            if op is None or not op.open or not op.eligible:
                raise _Ignored(f"call {cmd.call_id} is not in flight in the record")
            if isinstance(cmd, CallModel) and rec.state is not S.CALLING_MODEL:
                raise _Ignored(f"call {cmd.call_id}: the record is {rec.state.value}")

    def _carry_out(self, rec: TrajectoryRecord, cmd: Command, used: list[int]) -> Event:
        """Do what one command asks, outside any lock; report back with its event."""
        if isinstance(cmd, CallModel):
            token = self.inflight.open(cmd.call_id)
            try:
                if self.listener is not None and self.listener.recently_canceled(cmd.call_id):
                    token.set()
                model = self.tools.model(rec.agent, rec.goal)
                reply = model.call(cmd.view, cmd.max_output_tokens, cmd.timeout_s, cancel=token)
            finally:
                self.inflight.close(cmd.call_id)
            if reply.usage is not None:
                u = reply.usage
                used[0] = u.uncached_input + u.cached_input + u.output
            return reply.replied(cmd.call_id, self.clock())
        if isinstance(cmd, DispatchTool | LookupEffect):
            return self._tool(rec, cmd)
        raise TypeError(f"not a command a worker carries out: {cmd!r}")  # pragma: no cover

    def _tool(self, rec: TrajectoryRecord, cmd: DispatchTool | LookupEffect) -> ToolResulted:
        backend = self.tools.backend(rec.agent)
        looked_up = isinstance(cmd, LookupEffect)
        try:
            result, secs = dispatch(backend, rec.user, cmd)
        except Exception as exc:  # the backend failed mid-call: for a write, outcome unknown
            log.warning("%s: tool %s raised %r", rec.trajectory_id, cmd.tool, exc)
            result, secs = {"status": "unknown", "code": "backend_error"}, 0.0
            spec = self.tools.agents.get(rec.agent)[0].profile.catalog.get(cmd.tool)
            if spec is not None and spec.kind is ToolKind.READ:
                result = {"status": "error", "code": "backend_error"}
        return ToolResulted(
            now=self.clock(),
            call_id=cmd.call_id,
            attempt_id=cmd.attempt_id,
            result=result,
            latency_s=secs,
            looked_up=looked_up,
        )

    def _commit(
        self, rec: TrajectoryRecord, event: Event, ctx: KernelContext
    ) -> tuple[TrajectoryRecord, StepResult | None]:
        """Step ``event`` and commit it by compare-and-set; on a lost race reload and re-step.

        Returns the newest record and the step's result, or None when the kernel refused the
        event on the current record (logged; nothing was written).
        """
        done = advance(self.store, rec, event, ctx, self.observer, self._provider(rec.agent))
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

    def _notify(self, msg: TurnMessage, notice: Notice, used_tokens: int = -1) -> None:
        """Push the turn's one notice, carrying the gate lease back to the router."""
        self._let_go(msg)  # the router settles the lease on the notice: renew it no more
        if msg.lease or used_tokens >= 0:
            notice = replace(
                notice, lease=msg.lease, lease_route=msg.route, used_tokens=used_tokens
            )
        pipe = self.feed.batch()  # the notice, then the release: one round trip
        holding = (self.worker, msg.tenant, msg.trajectory_id, msg.version)
        try:
            self.feed.push(notice, pipeline=pipe)
            if self.holdings is not None:
                self.holdings.release(*holding, pipeline=pipe)
            replies = pipe.execute(raise_on_error=False)
            if isinstance(replies[0], Exception):
                raise replies[0]
            if self.holdings is not None:
                self.holdings.released_on(replies[-1], *holding)
        except Exception:  # the feed is a hint; a kept holding is one the turn moved past
            log.exception(
                "could not push the notice of %s (or release its holding)", msg.trajectory_id
            )

    def hand_back(self, msg: TurnMessage, why: HandBackWhy) -> None:
        """Give ``msg`` back unstarted, instead of its notice: a router sends it on under the
        same call ids (a member that cannot read the record is not sent it again)."""
        self._let_go(msg)  # the member the turn goes to keeps its lease alive
        refused = msg.refused_by + ((self.worker,) if why is HandBackWhy.SCHEMA else ())
        try:
            self.feed.hand_back(HandBack(self.worker, why, replace(msg, refused_by=refused)))
        except Exception:  # kept in the holdings: recovered if this member goes away
            log.exception("could not hand back the turn of %s", msg.trajectory_id)
            return
        self._release(msg)

    def _let_go(self, msg: TurnMessage) -> None:
        if self.leases is not None and msg.lease:
            self.leases.drop(msg.lease)

    def _release(self, msg: TurnMessage) -> None:
        if self.holdings is not None:
            try:  # after the notice: a lost release only leaves a holding the turn moved past
                self.holdings.release(self.worker, msg.tenant, msg.trajectory_id, msg.version)
            except Exception:
                log.exception("could not release the holding of %s", msg.trajectory_id)


def _ended_ready(rec: TrajectoryRecord, msg: TurnMessage) -> bool:
    """A redelivered message whose turn is the record's last one and ended READY: its worker
    died after the READY commit, perhaps before the notice that requeues it."""
    return (
        rec.state is S.READY
        and bool(msg.call_id)
        and msg.call_id == f"{rec.trajectory_id}/m{rec.turn}"
        and rec.record_version > msg.version
    )
