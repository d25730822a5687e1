"""A small simulated fleet that reports through :class:`ops.observability.metrics.Metrics`.

The admitter is the real :class:`router.admission.local.Admitter` with three tenants of weights
3:2:1, all kept backlogged, driven on a simulated clock; a provider gate refuses a fixed
fraction of nominations. Turns are real kernel runs of the support-store agent on the embedded
runner, committed through :meth:`Metrics.metered_commit`. Everything is deterministic.
"""

from __future__ import annotations

import random

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from kernel.budget import Budget
from kernel.chain import ChainRow
from kernel.context import KernelContext
from kernel.errors import ConcurrentModification
from kernel.record import TrajectoryRecord
from ops.observability.metrics import Metrics
from router.admission.local import Admitter
from router.admission.tenants import AdmissionConfig
from router.fleet.observe import provider_of
from router.placement.membership import MemberRecord
from tests.support import ManualClock
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel

WEIGHTS = {"acme": 3, "globex": 2, "initech": 1}
ROUTES = ("openai/gpt-4o-mini", "anthropic/claude-haiku")
WORKERS = ("worker-0", "worker-1", "worker-2")
BACKLOG = 40  # READY calls each tenant keeps queued
GATE_EVERY = 97  # the gate refuses about 1% of nominations


def admission_config() -> AdmissionConfig:
    """Three tenants, weights 3:2:1, room for their backlog."""
    return AdmissionConfig.from_mapping(
        {
            "quantum_tokens": 8000,
            "credit_cap_tokens": 64000,
            "tenants": [
                {"name": n, "weight": w, "max_ready": 1000, "largest_call_tokens": 20000}
                for n, w in WEIGHTS.items()
            ],
        }
    )


class Workload:
    """The simulated fleet; :meth:`chunk` runs one slice of it and reports to ``metrics``."""

    def __init__(self, metrics: Metrics, seed: int = 7) -> None:
        self.metrics = metrics
        self.rng = random.Random(seed)
        self.clock = ManualClock()
        config = admission_config()
        metrics.on_config(config)
        self.admitter = Admitter(config, self.clock)
        self.submitted = 0
        self.nominations = 0
        self.admitted = {t: 0 for t in WEIGHTS}
        self.charge = {t: 0 for t in WEIGHTS}
        self.runs = 0
        self.conflicts = 0
        for tenant in WEIGHTS:
            for _ in range(BACKLOG):
                self._submit(tenant)

    def _submit(self, tenant: str) -> None:
        self.submitted += 1
        self.admitter.submit(
            tenant,
            f"{tenant}-{self.submitted}",
            input_tokens=self.rng.randint(500, 12000),
            output_allowance=1000,
            route=ROUTES[self.submitted % len(ROUTES)],
        )

    def admit(self, n: int) -> None:
        """``n`` admissions through the gate, each queue refilled so every tenant stays busy."""
        done = 0
        while done < n:
            self.clock.now += 0.01
            nomination = self.admitter.nominate()
            assert nomination is not None, "every tenant is backlogged"
            self.nominations += 1
            call = nomination.call
            if self.nominations % GATE_EVERY == 0:
                self.admitter.decline(nomination)
                self.metrics.on_gate_refused(provider_of(call.route), "tpm")
                continue
            wait = self.admitter.confirm(nomination)
            self.metrics.on_admission(call, wait)
            self.admitted[call.tenant] += 1
            self.charge[call.tenant] += call.charge
            self._submit(call.tenant)
            done += 1
        self.metrics.on_figures(self.admitter.figures())

    def turns(self, n: int) -> None:
        """``n`` real kernel runs (alternately completing and hitting max_steps), timed turns."""
        for _ in range(n):
            self.runs += 1
            tenant = list(WEIGHTS)[self.runs % len(WEIGHTS)]
            budget = Budget() if self.runs % 2 else Budget(max_steps=2)
            agent = make_agent(budget=budget)
            runner = EmbeddedRunner(
                KernelContext(agent.profile),
                ScriptedModel(RefundPolicy()),
                SupportStoreBackend(),
                commit=self.metrics.metered_commit(_stored, agent.profile.model.provider),
            )
            record = TrajectoryRecord.create(
                trajectory_id=f"run-{self.runs}",
                tenant=tenant,
                user="cu_ana",  # the support store's customer who owns ord_1001
                goal="refund the damaged item on order ord_1001",
                agent="examples.support_store:agent",
                budget=budget,
                now=0.0,
            )
            runner.run(record)
            worker = WORKERS[self.runs % len(WORKERS)]
            self.metrics.on_turn(worker, 0.2 + 0.1 * (self.runs % 5))
        lost = self.metrics.metered_commit(_lost)
        try:
            lost(record, record, [])
        except ConcurrentModification:
            self.conflicts += 1  # counted, and still raised to the worker
        else:
            raise AssertionError("the metered hook swallowed a lost compare-and-set")

    def fleet_state(self) -> None:
        """Membership and held approvals, as the router reads them from Redis."""
        self.metrics.on_membership(
            [
                MemberRecord("worker-0", 1.0, 0.0, draining=False, live=True),
                MemberRecord("worker-1", 1.0, 0.0, draining=False, live=True),
                MemberRecord("worker-2", 1.0, 0.0, draining=True, live=True),
            ]
        )
        self.metrics.on_held_approvals({t: i for i, t in enumerate(WEIGHTS)})

    def chunk(self, admissions: int = 1000, runs: int = 3) -> None:
        """One slice of simulated work."""
        self.admit(admissions)
        self.turns(runs)
        self.fleet_state()

    def shares(self) -> dict[str, float]:
        """Each tenant's share of the charge admitted so far (the ground truth)."""
        total = sum(self.charge.values())
        return {t: c / total for t, c in self.charge.items()}


def _stored(before: TrajectoryRecord, after: TrajectoryRecord, rows: list[ChainRow]) -> None:
    """A store hook that always wins (the workload has no store)."""


def _lost(before: TrajectoryRecord, after: TrajectoryRecord, rows: list[ChainRow]) -> None:
    raise ConcurrentModification(after.trajectory_id, before.record_version, 99)


def expected_shares() -> dict[str, float]:
    """Weight over the sum of weights: every tenant stays backlogged."""
    total = sum(WEIGHTS.values())
    return {t: w / total for t, w in WEIGHTS.items()}
