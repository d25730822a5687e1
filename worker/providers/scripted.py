"""Scripted providers behind the model protocol (:class:`~worker.models.Model`).

:class:`~worker.models.ScriptedModel` answers from a policy with scripted latency and usage.
:class:`ReplayProvider` answers with the model replies of a :class:`~worker.recording.Recording`
(for instance one made against a real API through the recorder), in order, so a run can be
driven again by exactly what a model said, with real tools or the replayed ones.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kernel.events import ReplyStatus
from kernel.tools import ToolSpec
from worker.models import ModelReply
from worker.recording import ModelInput, Recording


class ReplayProvider:
    """Answers each call with the next recorded model reply; calls no model.

    A call past the last recorded reply is FAULTED (the run diverged from the recording),
    never an exception.
    """

    def __init__(self, recording: Recording) -> None:
        self.replies = [i.reply for i in recording.inputs if isinstance(i, ModelInput)]
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
        """The next recorded reply, as it was recorded."""
        if cancel is not None and cancel.is_set():
            return ModelReply(status=ReplyStatus.CANCELED, detail="canceled before it was sent")
        if self.calls >= len(self.replies):
            return ModelReply(
                status=ReplyStatus.FAULTED,
                detail=f"the recording holds {len(self.replies)} model replies; call "
                f"{self.calls + 1} diverged from it",
            )
        self.calls += 1
        return self.replies[self.calls - 1]
