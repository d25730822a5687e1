"""Test helpers: the support-store policy as a server script, and one kernel turn at a time."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from examples.support_store import make_agent
from kernel.agent import PolicyFn
from kernel.budget import Budget
from kernel.context import KernelContext, StepResult
from kernel.events import Admit, CallModel, Command, DispatchTool, Event
from kernel.record import TrajectoryRecord
from kernel.render import estimate_tokens
from kernel.step import step
from tests.kernel.harness import new_record
from tests.providers.fake_openai import view_of
from tests.providers.fake_replies import Reply, Script
from worker.models import ModelReply


def policy_script(policy: PolicyFn) -> Script:
    """The server answers as the scripted provider would: the same policy over the same view,
    tool proposals as tool calls (plan step as an argument), plans and finals as JSON text,
    usage estimated as the scripted model estimates it, latency reported in a header."""

    def script(request: dict[str, Any], n: int) -> Reply:
        view = view_of(request)
        out = policy(json.loads(view), n)
        reply, latency = out if isinstance(out, tuple) else (out, 1.5)
        raw = reply if isinstance(reply, str) else json.dumps(reply)
        answer = Reply(
            prompt_tokens=estimate_tokens(view),
            completion_tokens=estimate_tokens(raw),
            latency_ms=latency * 1000,
        )
        kind = reply.get("type") if isinstance(reply, dict) else None
        if kind in ("tool", "tools"):
            calls = [reply] if kind == "tool" else reply["calls"]
            answer.tool_calls = [(c["name"], json.dumps(_with_step(c))) for c in calls]
        else:
            answer.content = raw
        return answer

    return script


def _with_step(call: dict[str, Any]) -> dict[str, Any]:
    args = dict(call["args"])
    if "plan_step" in call:
        args["plan_step"] = call["plan_step"]
    return args


@dataclass
class KernelTurns:
    """Drive the step function by hand, keeping every command it emitted."""

    budget: Budget = field(default_factory=Budget)
    commands: list[Command] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ctx = KernelContext(make_agent(budget=self.budget).profile)
        self.rec: TrajectoryRecord = new_record(self.budget)

    def apply(self, event: Event) -> StepResult:
        result = step(self.rec, event, self.ctx)
        self.rec = result.record
        self.commands += result.commands
        self.results.append(result)
        return result

    def admit(self) -> CallModel:
        calls = [c for c in self.apply(Admit(now=0.0)).commands if isinstance(c, CallModel)]
        assert len(calls) == 1, self.results[-1]
        return calls[0]

    def reply(self, call: CallModel, reply: ModelReply, now: float = 1.0) -> StepResult:
        return self.apply(reply.replied(call.call_id, now))

    @property
    def dispatches(self) -> list[DispatchTool]:
        return [c for c in self.commands if isinstance(c, DispatchTool)]
