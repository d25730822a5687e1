"""The scratchpad: the model's own past steps in its view, bounded by compaction.

An agent whose profile sets a :class:`ScratchpadPolicy` sees, beside the state view, the
steps it took (its proposal and what came back), oldest first. Unbounded, step i re-sends
every step before it and a run's input grows quadratically (seed 001 section 4.1). With
``max_tokens`` set, once the next view would pass it, the oldest steps are folded into a
summary by a model call the kernel admits like any other; the ``window`` most recent steps
always stay verbatim (rule 1: past the cap with only the window left, the run carries on over
it). Folding changes the view only: the chain keeps every step (rule 2).

These functions are pure; :mod:`kernel.compaction` drives them from the step function, and
the arithmetic test drives them directly. Design: ``docs/adr/0141-scratchpad-compaction.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field

from kernel.fastmodel import Mutable
from kernel.jsontext import sorted_text
from kernel.modeljson import json_native

Estimator = Callable[[str], int]

COMPACT_INSTRUCTION = (
    "Fold these earlier steps into the summary: keep every fact, id, amount and decision a "
    'later step may need. Reply {"type": "summary", "text": "..."}.'
)


@dataclass(frozen=True)
class ScratchpadPolicy:
    """An agent's scratchpad: the cap on its tokens (None: unbounded), the steps always kept
    verbatim, and the output allowance of a compaction call."""

    max_tokens: int | None = None
    window: int = 2
    summary_max_tokens: int = 512

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_scratchpad_tokens: {self.max_tokens} is not positive")
        if self.window < 1:
            raise ValueError(f"scratchpad window: {self.window} must keep at least one step")


@json_native
class PadStep(Mutable):
    """One step as the model sees it in the scratchpad, and its estimated tokens."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    text: str
    tokens: int


@json_native
class Scratchpad(Mutable):
    """The scratchpad of one run: the summary of folded steps, then the unfolded steps."""

    model_config = ConfigDict(extra="forbid")

    summary: str = ""
    summary_tokens: int = 0
    steps: list[PadStep] = Field(default_factory=list)
    folded: int = 0  # steps folded into the summary so far
    proposal: Any = None  # this turn's proposal, until its observation completes the step
    compacting: str | None = None  # the call id of the compaction in flight
    fold_count: int = 0  # how many of the oldest steps that compaction folds

    def clone(self) -> Scratchpad:
        """A copy the kernel may change (its steps are values, shared)."""
        new = self.model_copy()
        new.steps = list(self.steps)
        return new


def tokens(pad: Scratchpad) -> int:
    """The scratchpad's share of the view: its summary and every unfolded step."""
    return pad.summary_tokens + sum(s.tokens for s in pad.steps)


def add_step(pad: Scratchpad, turn: int, step: dict[str, Any], estimator: Estimator) -> None:
    """Append one completed step (proposal and observation) as the model will see it."""
    text = sorted_text(step)
    pad.steps.append(PadStep(turn=turn, text=text, tokens=estimator(text)))


def steps_to_fold(pad: Scratchpad, base_tokens: int, policy: ScratchpadPolicy) -> int:
    """How many of the oldest steps to fold before the next call: 0 when there is no cap, when
    the view fits under it, or when only the recent window is left (rule 1)."""
    if policy.max_tokens is None or base_tokens + tokens(pad) <= policy.max_tokens:
        return 0
    return max(len(pad.steps) - policy.window, 0)


def compaction_view(pad: Scratchpad, count: int) -> str:
    """The input of the call that folds the ``count`` oldest steps into the summary."""
    return sorted_text(
        {
            "task": "compact",
            "instruction": COMPACT_INSTRUCTION,
            "summary": pad.summary,
            "steps": [s.text for s in pad.steps[:count]],
        }
    )


def fold(pad: Scratchpad, count: int, summary: str, estimator: Estimator) -> None:
    """Replace the ``count`` oldest steps with ``summary`` (which covers the old summary)."""
    pad.summary = summary
    pad.summary_tokens = estimator(summary)
    pad.steps = pad.steps[count:]
    pad.folded += count


def history(pad: Scratchpad) -> dict[str, Any]:
    """The scratchpad as it enters the model's view."""
    return {"summary": pad.summary, "steps": [s.text for s in pad.steps]}
