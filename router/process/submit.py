"""What a router offers its callers: submit a job, request control, decide an approval.

Functions a trusted caller (an API layer, the CLI, a test) calls with the tenant it
authenticated; a job body that names a tenant is refused. Bad input changes nothing:
:meth:`RouterApi.submit` validates before it writes and refuses with a
:class:`~kernel.errors.InvalidInput`; a new job is one READY record at version 1, created by
compare-and-set, then queued. :meth:`RouterApi.deliver` steps an event on the stored record,
commits it by compare-and-set (stepping again after a lost race) and carries out what the step
asked; a request the kernel refuses raises its error and leaves the record as it was.
Design: ``docs/adr/0011-router-api.md``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.context import KernelContext, StepResult
from kernel.errors import (
    InvalidInput,
    ReinsError,
    SnapshotExists,
    StoreError,
    SubmissionRefused,
    UnknownAgent,
    UnknownTenant,
)
from kernel.events import (
    ApprovalDecided,
    CancelCall,
    ControlRequested,
    Enqueue,
    Event,
    Finish,
    HoldForApproval,
    Recover,
)
from kernel.memory import MemoryKind, Visibility, ms
from kernel.memory_tools import MemoryPolicy, episode_view, goal_tags
from kernel.record import ControlKind, TrajectoryRecord
from kernel.states import ACTING, LifecycleState
from router.admission.gates import GateConfig
from router.admission.local import Admitter
from router.admission.queue import AdmissionQueue
from router.admission.tenants import AdmissionConfig
from router.fleet.agents import AgentCache
from router.fleet.commits import advance
from router.fleet.episodes import Episodes
from router.fleet.observe import CommitObserver
from router.placement.ring import Ring
from router.process.dispatch import Sender, placement_key
from router.wire.feed import Feed, route_of
from router.wire.notices import call_input, ready_notice
from router.wire.turns import TurnMessage, worker_commands
from store.base import TrajectoryStore
from store.memory_base import MemoryBank

log = logging.getLogger("reins.router.api")
_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class JobSpec(BaseModel):
    """The body of a submission: what to run and for whom, never which tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: str = Field(min_length=3, max_length=300, description="MODULE:AGENT")
    goal: str = Field(min_length=1, max_length=20_000)
    user: str = Field(min_length=1, max_length=200, description="the end user the run acts for")
    budget: dict[str, str | int | float] = Field(default_factory=dict, description="overrides")
    trajectory_id: str | None = Field(None, pattern=_ID)
    service_class: str | None = None


@dataclass(frozen=True, slots=True)
class Submission:
    """A job accepted: its trajectory, at version 1 in READY and queued."""

    tenant: str
    trajectory_id: str
    version: int
    input_tokens: int
    output_allowance: int
    route: str


class RouterApi:
    """Submission, control and approvals for one deployment (see the module docstring).

    ``admitter``: the shared (Redis) admitter, when the fleet has one; otherwise READY work
    goes through the feed to the router that admits. ``sender`` and ``ring`` are needed only
    to send the tool dispatch an approval admits. ``observer`` is told of each step delivered
    and each commit lost.
    """

    def __init__(
        self,
        *,
        store: TrajectoryStore,
        feed: Feed,
        config: AdmissionConfig,
        agents: AgentCache | None = None,
        gate_config: GateConfig | None = None,
        admitter: AdmissionQueue | None = None,
        sender: Sender | None = None,
        ring: Callable[[], Ring] | None = None,
        clock: Callable[[], float] = time.time,
        observer: CommitObserver | None = None,
        memory: MemoryBank | None = None,
    ) -> None:
        self.store, self.feed, self.config = store, feed, config
        self.memory = memory  # where earlier runs' episodes are recalled from (None: nowhere)
        self.episodes = Episodes(memory, clock)  # and where the runs it ends leave theirs
        self.observer = observer or CommitObserver()
        self.agents = agents or AgentCache()
        self.gate_config, self.admitter = gate_config, admitter
        self.sender, self.ring, self.clock = sender, ring, clock

    # --- submission ----------------------------------------------------------------------------

    def _recall_episodes(
        self, rec: TrajectoryRecord, policy: MemoryPolicy | None
    ) -> list[dict[str, Any]]:
        """The episodes of earlier runs the profile wants in the first view, ranked by tag
        overlap with the goal, then recency; none (logged) when memory does not answer."""
        if self.memory is None or policy is None or policy.recall_episodes < 1:
            return []
        caller = Visibility(rec.tenant, rec.user, rec.agent)
        try:
            found = self.memory.recall(
                caller,
                MemoryKind.EPISODE,
                goal_tags(rec.goal),
                ms(self.clock()),
                policy.recall_episodes,
            )
        except (StoreError, InvalidInput) as exc:
            log.warning("%s: episodes not recalled: %s", rec.trajectory_id, exc)
            return []
        return [episode_view(i) for i in found]

    def submit(self, tenant: str, body: JobSpec | Mapping[str, Any]) -> Submission:
        """Create and queue a trajectory for ``tenant`` (trusted), or refuse changing nothing."""
        cfg = self.config.tenant(tenant)
        if cfg is None:
            known = ", ".join(t.name for t in self.config.tenants)
            raise UnknownTenant(f"tenant {tenant!r} is not configured; known: {known}")
        job = self._job(body)
        if not cfg.allows(job.agent):  # before anything is imported
            raise UnknownAgent(
                f"agent {job.agent!r} is not among those tenant {tenant!r} may run; "
                f"allowed: {', '.join(cfg.agents or ()) or 'none'}"
            )
        agent, ctx = self.agents.get(job.agent)
        budget = agent.profile.budget.with_overrides(f"{k}={v}" for k, v in job.budget.items())
        now = self.clock()
        rec = TrajectoryRecord.create(
            trajectory_id=job.trajectory_id or f"traj-{uuid.uuid4().hex[:16]}",
            tenant=tenant,
            user=job.user,
            goal=job.goal,
            agent=job.agent,
            budget=budget,
            now=now,
            service_class=job.service_class,
        )
        rec.episodes = self._recall_episodes(rec, agent.profile.memory) or None
        route = self._route(route_of(agent.profile.model.provider, agent.profile.model.name))
        tokens, allowance = call_input(rec, ctx), budget.max_output_tokens
        # The admitter's own edge checks (tenant, class, call size, budget maxima, route), on a
        # scratch admitter so nothing is queued yet; then the backlog, read from the store.
        Admitter(self.config, self.clock).submit(
            tenant,
            rec.trajectory_id,
            input_tokens=tokens,
            output_allowance=allowance,
            service_class=job.service_class,
            budget=budget,
            route=route,
        )
        backlog = self.store.count(tenant, LifecycleState.READY)
        if backlog >= cfg.max_ready:
            raise SubmissionRefused(
                f"tenant {tenant!r} already has {backlog:,} READY trajectories "
                f"(max_ready {cfg.max_ready:,}); retry later",
                code="backlog_full",
            )
        try:
            self.store.create(rec)
        except SnapshotExists:
            raise SubmissionRefused(
                f"trajectory {rec.trajectory_id} already exists in tenant {tenant!r}",
                code="already_exists",
                field="trajectory_id",
            ) from None
        self._queue(rec, route)
        return Submission(
            tenant, rec.trajectory_id, rec.record_version, tokens, allowance, route or ""
        )

    @staticmethod
    def _job(body: JobSpec | Mapping[str, Any]) -> JobSpec:
        if isinstance(body, JobSpec):
            return body
        if "tenant" in body:
            raise SubmissionRefused(
                "a job must not name its tenant: the tenant comes from the caller's credential",
                code="tenant_in_job",
                field="tenant",
            )
        try:
            return JobSpec.model_validate(dict(body))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "job"
            raise SubmissionRefused(
                f"job refused: {where}: {first['msg']}",
                code="invalid_job",
                field=str(first["loc"][0]) if first["loc"] else None,
            ) from None

    def _route(self, route: str) -> str | None:
        cfg = self.gate_config
        return route if cfg is not None and route in cfg.routes else None

    def _queue(self, rec: TrajectoryRecord, route: str | None) -> None:
        """Put a READY record in its tenant's queue (the shared admitter, or the feed)."""
        try:
            ctx: KernelContext | None = self.agents.context(rec.agent)
        except ReinsError:  # its agent cannot be loaded here: the view's estimate alone
            ctx = None
        if self.admitter is None:
            self.feed.push(ready_notice(rec, "", self.clock(), route or "", ctx))
            return
        tokens, allowance = call_input(rec, ctx), rec.budget.max_output_tokens
        try:
            self.admitter.requeue(
                rec.tenant,
                rec.trajectory_id,
                input_tokens=tokens,
                output_allowance=allowance,
                service_class=rec.service_class,
                route=route,
            )
        except SubmissionRefused as exc:  # already queued: nothing to do
            log.debug("%s: %s", rec.trajectory_id, exc)

    # --- events from outside -------------------------------------------------------------------

    def control(
        self,
        tenant: str,
        trajectory_id: str,
        kind: ControlKind | str,
        requested_by: str,
        *,
        instructions: str | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Pause, resume, cancel, kill or interrupt; returns the kernel's acknowledgement."""
        try:
            control = ControlKind(kind)
        except ValueError:
            known = ", ".join(k.value for k in ControlKind)
            raise InvalidInput(f"unknown control {kind!r}; known: {known}") from None
        event = ControlRequested(
            now=self.clock(),
            kind=control,
            request_id=request_id or f"ctl-{uuid.uuid4().hex[:12]}",
            requested_by=requested_by,
            instructions=instructions,
        )
        result = self.deliver(tenant, trajectory_id, event)
        return dict(result.ack or {"received": True, "note": result.note})

    def decide(
        self,
        tenant: str,
        trajectory_id: str,
        *,
        approval_id: str,
        held_version: int,
        digest: str,
        reviewer: str,
        approve: bool,
        comment: str = "",
    ) -> StepResult:
        """A reviewer's decision on a held proposal; it must name id, version and digest."""
        event = ApprovalDecided(
            now=self.clock(),
            approval_id=approval_id,
            held_version=held_version,
            digest=digest,
            reviewer=reviewer,
            approve=approve,
            comment=comment,
        )
        return self.deliver(tenant, trajectory_id, event)

    def deliver(self, tenant: str, trajectory_id: str, event: Event) -> StepResult:
        """Step ``event`` on the stored record, commit it, and carry out what it asks.

        Bad input raises (the kernel's refusal, or :class:`SnapshotNotFound` for a trajectory
        the tenant does not hold) and changes nothing.
        """
        rec = self.store.load(tenant, trajectory_id)
        ctx = self.agents.context(rec.agent)
        done = advance(self.store, rec, event, ctx, self.observer, ctx.agent.model.provider)
        if done.refusal is not None:
            raise done.refusal
        assert done.result is not None  # no ``still``: a step is taken or refused
        if done.committed:
            self._carry_out(done.result)
        return done.result

    def recover(
        self,
        rec: TrajectoryRecord,
        still: Callable[[TrajectoryRecord], bool] = lambda rec: False,
        by: str = "router",
    ) -> bool:
        """Deliver ``Recover`` to a turn stranded in ``rec``; False if nothing was written.

        After a lost race the record is reloaded and recovered again only while ``still``
        holds (by default never: the record moved on)."""
        ctx = self.agents.context(rec.agent)
        event = Recover(now=self.clock(), worker=by)
        provider = ctx.agent.model.provider
        done = advance(self.store, rec, event, ctx, self.observer, provider, still)
        if done.refusal is not None:
            raise done.refusal
        if done.committed and done.result is not None:
            self._carry_out(done.result)
        return done.committed

    def requeue(self, rec: TrajectoryRecord) -> None:
        """Put a READY record in its tenant's queue again (its notice may have been lost with
        the worker that pushed it); a record already queued is left as it is."""
        if rec.state is not LifecycleState.READY:
            raise InvalidInput(f"{rec.trajectory_id} is {rec.state.value}, not READY")
        model = self.agents.get(rec.agent)[0].profile.model
        self._queue(rec, self._route(route_of(model.provider, model.name)))

    def _carry_out(self, result: StepResult) -> None:
        rec, now = result.record, self.clock()
        self.episodes.after_loading(result, self.agents)  # a cancel, kill, tick or recovery
        if rec.state not in ACTING and self.admitter is not None:
            # A cancel, kill or recovery ended the turn: it counts against its tenant's
            # max_in_flight no more (before a requeue below can admit it again; ADR 0123).
            self.admitter.release(rec.tenant, rec.trajectory_id)
        for cmd in result.commands:
            if isinstance(cmd, CancelCall):
                heard = self.feed.publish_cancel(rec.tenant, rec.trajectory_id, cmd.call_id)
                log.info("cancel of %s published to %d listeners", cmd.call_id, heard)
            elif isinstance(cmd, Enqueue):
                self.requeue(rec)
            elif isinstance(cmd, HoldForApproval | Finish):
                log.info("%s: %s", rec.trajectory_id, cmd.type)
        if rec.state is not LifecycleState.READY and self.admitter is not None:
            self.admitter.withdraw(rec.trajectory_id)  # a stale queue entry, if any
        tools = worker_commands(result.commands)
        if tools:
            if self.sender is None or self.ring is None:
                raise InvalidInput("this router API cannot send turns (no sender or ring)")
            member = self.ring().lookup(placement_key(rec.tenant, rec.trajectory_id))
            msg = TurnMessage.of(rec, tools, now)
            self.sender(member, msg.to_payload())
