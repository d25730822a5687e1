"""The model protocol (view in; reply, usage and latency out) and the scripted model.

A model never raises for what a provider can do wrong: every outcome is a :class:`ModelReply`
with a normalised status. Latency is reported, not slept, so a simulated clock can advance.
Providers that speak to a real API (``worker.providers``) implement the same protocol.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import from_json

from kernel.agent import PolicyFn
from kernel.amounts import Usage
from kernel.events import ModelReplied, ReplyStatus
from kernel.fastmodel import construct
from kernel.jsontext import plain_text
from kernel.render import Estimator, estimate_tokens
from kernel.tools import ToolSpec


class ModelReply(BaseModel):
    """One model call's normalised outcome."""

    model_config = ConfigDict(frozen=True)

    status: ReplyStatus
    content: Any = None
    raw: str | None = None
    usage: Usage | None = None
    latency_s: float = 0.0
    timed_out: bool = False
    retry_after_s: float | None = None
    rate_limits: dict[str, str] = Field(default_factory=dict)  # x-ratelimit-* headers seen
    partial: str | None = None  # a canceled stream's output so far: diagnostics, never content
    detail: str | None = None  # why a call was not COMPLETED (HTTP status, bad chunk, ...)
    route: str | None = None  # the provider route that answered (a routed model's)
    fell_back: tuple[str, ...] = ()  # routes tried before it, each "route: status"

    def replied(self, call_id: str, now: float) -> ModelReplied:
        """The kernel event for this reply; a canceled stream's partial output rides in
        ``raw`` (diagnostics only: the kernel never turns ``raw`` into a proposal)."""
        fields = {
            "now": now,
            "call_id": call_id,
            "status": self.status,
            "content": self.content,
            "raw": self.raw if self.raw is not None else self.partial,
            "usage": self.usage,
            "latency_s": self.latency_s,
            "timed_out": self.timed_out,
            "retry_after_s": self.retry_after_s,
        }
        if self.route is not None:
            fields["route"] = self.route
        if self.fell_back:
            fields["fell_back"] = self.fell_back
        if type(now) is float and type(call_id) is str and self.latency_s >= 0:
            # All the event's validation would check: the rest is this validated reply's.
            return construct(ModelReplied, **fields)
        return ModelReplied(**fields)


class Model(Protocol):
    """A model, scripted or behind an API: a view in, a normalised reply out, never an
    exception for what the far side does.

    ``timeout_s`` is what is left of the trajectory's active-time deadline; ``tools`` defaults
    to the agent's catalog (a scripted model leaves them to its policy); ``cancel`` stops the
    call at once and the reply is then CANCELED, whatever had streamed (partial output is
    diagnostics only).
    """

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        """Answer one view within ``timeout_s`` seconds and ``max_output_tokens`` tokens."""
        ...


def parse_view(view: str) -> Any:
    """The view as data, exactly as ``json.loads`` gives it: pydantic-core's parser (about
    twice as fast, and a scripted model parses every view it is shown), or the standard
    library's for what that parser refuses (a lone surrogate escape, malformed text)."""
    try:
        return from_json(view)
    except ValueError:
        return json.loads(view)


SUMMARY_CHARS = 800  # the scripted summariser keeps the newest characters


def scripted_summary(request: dict[str, Any]) -> dict[str, Any]:
    """A deterministic summary for a compaction request (``kernel.scratchpad``): the old
    summary and each folded step's first characters, the newest kept within a bound."""
    parts = [str(request.get("summary") or "")]
    parts += [str(step)[:160] for step in request.get("steps") or []]
    return {"type": "summary", "text": " | ".join(p for p in parts if p)[-SUMMARY_CHARS:]}


def scripted_report(view: dict[str, Any]) -> dict[str, Any]:
    """A deterministic closing report (``kernel.finalizing``): the stop, and each plan step's
    status, from the view the closing call is shown."""
    closing = view.get("closing") or {}
    steps = ", ".join(f"{s.get('id')} {s.get('status')}" for s in view.get("plan") or [])
    text = f"Stopped ({closing.get('stop')})." + (f" Plan: {steps}." if steps else "")
    return {"type": "report", "text": text}


class ScriptedModel:
    """A model whose replies come from a policy function over the parsed view (a compaction
    request and a closing step are answered by :func:`scripted_summary`, :func:`scripted_report`).

    The policy returns a reply (a dict, or a string to be parsed as JSON) or a tuple
    ``(reply, latency_s)``; usage is estimated as the seeds do: the view's tokens in, the
    serialised reply's tokens out. A reply longer than the output cap comes back TRUNCATED,
    and a latency beyond the timeout comes back as a timed-out transport failure without usage.
    ``usage_factor`` makes it misreport as a real provider may: each reported count is the
    estimate times the factor, rounded up (output never past the cap).
    """

    def __init__(
        self,
        policy: PolicyFn,
        latency_s: float = 1.5,
        estimator: Estimator = estimate_tokens,
        usage_factor: float = 1.0,
    ) -> None:
        self.policy, self.latency_s, self.estimator = policy, latency_s, estimator
        self.usage_factor = usage_factor
        self.calls = 0

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        """Answer from the policy; the tools are the policy's business, and a call canceled
        before it starts sends nothing and reports no usage."""
        if cancel is not None and cancel.is_set():
            return ModelReply(status=ReplyStatus.CANCELED, detail="canceled before it was sent")
        data = parse_view(view)
        if isinstance(data, dict) and data.get("task") == "compact":
            out: Any = scripted_summary(data)  # the policy counts and sees its own steps only
        elif isinstance(data, dict) and "closing" in data:
            out = scripted_report(data)  # the run's closing step: its report, not a policy's step
        else:
            self.calls += 1
            out = self.policy(data, self.calls)
        reply, latency = out if isinstance(out, tuple) else (out, self.latency_s)
        if latency > timeout_s:
            return ModelReply(
                status=ReplyStatus.TRANSPORT_FAILURE, latency_s=max(timeout_s, 0.0), timed_out=True
            )
        raw = reply if isinstance(reply, str) else plain_text(reply)
        tokens_in, tokens_out = self.estimator(view), self.estimator(raw)
        if tokens_out > max_output_tokens:
            return ModelReply(
                status=ReplyStatus.TRUNCATED,
                raw=raw,
                usage=Usage(uncached_input=tokens_in, output=max_output_tokens),
                latency_s=latency,
            )
        try:
            content = json.loads(raw) if isinstance(reply, str) else reply
        except json.JSONDecodeError:
            content = None  # the kernel turns a non-proposal into a recoverable observation
        if self.usage_factor != 1.0:
            tokens_in = math.ceil(tokens_in * self.usage_factor)
            tokens_out = min(math.ceil(tokens_out * self.usage_factor), max_output_tokens)
        return _completed(content, raw, tokens_in, tokens_out, latency)


def _completed(content: Any, raw: str, tokens_in: int, tokens_out: int, latency: Any) -> ModelReply:
    """A COMPLETED reply, built without re-validation when its figures are already of the
    types validation would give (the estimator and the policy are injected: anything else is
    validated, and refused or coerced, as before)."""
    fields = {"status": ReplyStatus.COMPLETED, "content": content, "raw": raw, "latency_s": latency}
    if (
        type(latency) is float
        and type(tokens_in) is int
        and type(tokens_out) is int
        and tokens_in >= 0
        and tokens_out >= 0
    ):
        usage = construct(Usage, uncached_input=tokens_in, output=tokens_out)
        return construct(ModelReply, **fields, usage=usage)
    return ModelReply(**fields, usage=Usage(uncached_input=tokens_in, output=tokens_out))
