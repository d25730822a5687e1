"""An agent with asynchronous job tools, and a driver that speaks their events."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from examples.support_store import SCRIPTED
from kernel.agent import AgentProfile
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.events import CallModel, InputGiven, JobReported, JobStarted, StartJob
from kernel.job_specs import InputRequest, JobPolicy, JobStatus, OnPause
from kernel.record import Operation
from kernel.tools import Catalog, ToolSpec
from tests.kernel.driver import Driver

LIABILITY = Decimal("0.50")


class SuiteArgs(BaseModel):
    suite: str


def job_tool(name: str = "run_tests", on_pause: OnPause = OnPause.FINISH, timeout_s: float = 600):
    return ToolSpec(
        name=name,
        args_model=SuiteArgs,
        timeout_s=timeout_s,
        liability=LIABILITY,
        job=JobPolicy(poll_s=5.0, backoff=2.0, max_poll_s=40.0, max_polls=20, on_pause=on_pause),
    )


def job_profile(*specs: ToolSpec, budget: Budget) -> AgentProfile:
    return AgentProfile(
        name="repair",
        model=SCRIPTED,
        catalog=Catalog.of(specs or (job_tool(), job_tool("run_lint", OnPause.CANCEL))),
        budget=budget,
    )


def call(tool: str = "run_tests", suite: str = "unit") -> dict[str, Any]:
    return {"type": "tool", "name": tool, "args": {"suite": suite}}


class JobDriver(Driver):
    """The kernel driver with a job agent; ``start`` runs up to a started job."""

    def __init__(self, *specs: ToolSpec, budget: Budget | None = None) -> None:
        budget = budget or Budget(
            max_steps=20, max_tool_calls=20, max_tokens=100_000, deadline_s=1000, max_cost=5
        )
        super().__init__(budget)
        self.ctx = KernelContext(job_profile(*specs, budget=budget))

    def propose(self, *calls: dict[str, Any]) -> list[StartJob]:
        first: CallModel = self.admit()
        content = calls[0] if len(calls) == 1 else {"type": "tools", "calls": list(calls)}
        self.reply(first, content)
        return self.commands(StartJob)

    def started(self, cmd: StartJob, handle: str = "h1", now: float | None = None) -> None:
        self.now = self.now if now is None else now
        self.apply(
            JobStarted(now=self.now, call_id=cmd.call_id, attempt_id=cmd.attempt_id, handle=handle)
        )

    def start(self, tool: str = "run_tests") -> StartJob:
        (cmd,) = self.propose(call(tool))
        self.started(cmd)
        return cmd

    def report(
        self,
        cmd: StartJob,
        status: JobStatus,
        charge: str | None = None,
        result: dict[str, Any] | None = None,
        *,
        attempt: str | None = None,
        epoch: int | None = None,
        seq: int | None = None,
        ask: InputRequest | None = None,
        now: float | None = None,
    ) -> Any:
        self.now = self.now if now is None else now
        return self.apply(
            JobReported(
                now=self.now,
                call_id=cmd.call_id,
                attempt_id=attempt or cmd.attempt_id,
                epoch=cmd.epoch if epoch is None else epoch,
                status=status,
                result=result or {},
                charge=Decimal(charge) if charge is not None else None,
                seq=seq,
                input_request=ask,
            )
        )

    def answer(self, cmd: StartJob, input_id: str, answer: Any, by: str = "reviewer") -> Any:
        return self.apply(
            InputGiven(
                now=self.now, call_id=cmd.call_id, input_id=input_id, answer=answer, given_by=by
            )
        )

    def op(self, cmd: StartJob) -> Operation:
        return self.rec.operations[cmd.call_id]
