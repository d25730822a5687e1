"""Record a run's inputs from the world, and replay them through the kernel without it.

A :class:`Recording` keeps the initial record and, in order, everything that came from outside
the kernel: each model reply, each tool (or lookup) result, and each external event (an
approval decision, a control request). Replay runs the same embedded runner from the initial
record with a model and a backend that answer from the recording, so the kernel really runs
again: the same inputs give the same final record byte for byte, and a changed input changes
the outcome. No model and no tool is called during a replay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel.chain import ChainRow
from kernel.context import KernelContext
from kernel.events import ApprovalDecided, ControlRequested, Tick
from kernel.record import TrajectoryRecord
from kernel.tools import ToolBackend, ToolSpec
from worker.embedded import Clock, Commit, EmbeddedRunner, RunResult
from worker.models import Model, ModelReply

External = Annotated[ApprovalDecided | ControlRequested | Tick, Field(discriminator="type")]


class ModelInput(BaseModel):
    """A model reply, as the provider returned it."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["model"] = "model"
    reply: ModelReply


class ToolInput(BaseModel):
    """A tool or lookup result and the seconds it took."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["tool"] = "tool"
    tool: str
    key: str
    result: dict[str, Any]
    seconds: float
    lookup: bool = False


class EventInput(BaseModel):
    """An event from outside: a reviewer's decision, an operator's control, a tick."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["event"] = "event"
    event: External


Input = Annotated[ModelInput | ToolInput | EventInput, Field(discriminator="kind")]


class Recording(BaseModel):
    """Everything needed to re-run a trajectory without the world."""

    initial: str  # the initial record's JSON
    inputs: list[Input] = Field(default_factory=list)
    final: str | None = None  # the final record's JSON when it was recorded, for checking

    def save(self, path: str | Path) -> None:
        """Write the recording as JSON."""
        Path(path).write_text(self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        """Read a recording written by :meth:`save`."""
        return cls.model_validate_json(Path(path).read_text())


class RecordingModel:
    """Wraps a model and keeps its replies."""

    def __init__(self, inner: Model, recording: Recording) -> None:
        self.inner, self.recording = inner, recording

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        reply = self.inner.call(view, max_output_tokens, timeout_s, tools=tools, cancel=cancel)
        self.recording.inputs.append(ModelInput(reply=reply))
        return reply


class RecordingBackend:
    """Wraps a tool backend and keeps the results of the tools that touch the world."""

    def __init__(self, inner: ToolBackend, recording: Recording) -> None:
        self.inner, self.recording = inner, recording

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        result, secs = self.inner.call(
            user, tool, args, key, timeout_s, approval=approval, fence=fence
        )
        self.recording.inputs.append(ToolInput(tool=tool, key=key, result=result, seconds=secs))
        return result, secs

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        result, secs = self.inner.lookup(tool, key, fence=fence)
        self.recording.inputs.append(
            ToolInput(tool=tool, key=key, result=result, seconds=secs, lookup=True)
        )
        return result, secs


class ReplayExhausted(Exception):
    """The kernel asked for more than the recording holds: the replay diverged."""


class _Tape:
    def __init__(self, inputs: list[Any]) -> None:
        self.inputs, self.pos = inputs, 0

    def peek(self) -> Any:
        return self.inputs[self.pos] if self.pos < len(self.inputs) else None

    def take(self, kind: str) -> Any:
        item = self.peek()
        if item is None or item.kind != kind:
            found = "the end" if item is None else item.kind
            raise ReplayExhausted(f"replay wanted a {kind} input at {self.pos}, found {found}")
        self.pos += 1
        return item


class ReplayModel:
    """Answers from the recording; calls no model."""

    def __init__(self, tape: _Tape) -> None:
        self.tape = tape

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        reply: ModelReply = self.tape.take("model").reply
        return reply


class ReplayBackend:
    """Answers from the recording; calls no tool (so fences, which the replayed kernel gives
    out again exactly as it did, are not checked)."""

    def __init__(self, tape: _Tape) -> None:
        self.tape = tape

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        item = self.tape.take("tool")
        return dict(item.result), item.seconds

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        item = self.tape.take("tool")
        return dict(item.result), item.seconds


class RecordingRunner:
    """An embedded runner that records what the world answered, for replay."""

    def __init__(
        self,
        ctx: KernelContext,
        model: Model,
        backend: ToolBackend,
        commit: Commit | None = None,
        bind: Callable[[TrajectoryRecord], ToolBackend] | None = None,
    ) -> None:
        self.recording: Recording | None = None
        self._ctx, self._model, self._backend, self._commit = ctx, model, backend, commit
        self._bind = bind  # as the embedded runner's: the backend for one run's calls
        self.runner: EmbeddedRunner | None = None

    def start(self, rec: TrajectoryRecord) -> RunResult:
        """Record from the initial record on."""
        recording = self.recording = Recording(initial=rec.to_json().decode())
        bind, bound = self._bind, None
        if bind is not None:

            def bound(run: TrajectoryRecord) -> ToolBackend:
                return RecordingBackend(bind(run), recording)

        self.runner = EmbeddedRunner(
            self._ctx,
            RecordingModel(self._model, recording),
            RecordingBackend(self._backend, recording),
            commit=self._commit,
            bind=bound,
        )
        out = self.runner.run(rec)
        self.recording.final = out.record.to_json().decode()
        return out

    def deliver(
        self, rec: TrajectoryRecord, event: ApprovalDecided | ControlRequested | Tick
    ) -> RunResult:
        """Deliver an external event (recorded) and run on."""
        assert self.recording is not None and self.runner is not None, "start() first"
        self.recording.inputs.append(EventInput(event=event))
        out = self.runner.run(rec, event)
        self.recording.final = out.record.to_json().decode()
        return out


class ReplayResult(BaseModel):
    """The replayed record, its chain, and where the replay left the recording if it diverged."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    record: TrajectoryRecord
    rows: list[ChainRow] = Field(default_factory=list)
    diverged: str | None = None


def replay(recording: Recording, ctx: KernelContext) -> ReplayResult:
    """Re-run the kernel from the initial record with the recorded inputs only.

    If the kernel asks for an input the recording does not hold (or leaves inputs unused),
    the replay diverged: the result carries the record as far as it got and says where.
    """
    tape = _Tape(list(recording.inputs))
    runner = EmbeddedRunner(ctx, ReplayModel(tape), ReplayBackend(tape), clock=Clock())
    rec = TrajectoryRecord.from_json(recording.initial)
    rows: list[ChainRow] = []
    try:
        out = runner.run(rec)
        rec, rows = out.record, rows + out.rows
        while (item := tape.peek()) is not None:
            if item.kind != "event":
                raise ReplayExhausted(f"recording has an unused {item.kind} input at {tape.pos}")
            tape.pos += 1
            out = runner.run(rec, item.event)
            rec, rows = out.record, rows + out.rows
    except ReplayExhausted as exc:
        return ReplayResult(record=runner.last or rec, rows=rows, diverged=str(exc))
    return ReplayResult(record=rec, rows=rows)
