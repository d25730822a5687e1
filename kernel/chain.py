"""The execution chain: one append-only row per step, written as a by-product of running.

The chain is what happened; compaction changes what the model sees, never this. Rows carry the
ids that join them with traces (trajectory, step index, call id).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from kernel.fastmodel import pinned_values
from kernel.modeljson import json_native


@pinned_values
class RowKind(StrEnum):
    """What a chain row records."""

    MODEL = "model"  # one model call and how its reply was routed
    TOOL = "tool"  # one tool call and its outcome
    CONTROL = "control"  # a control request carried out (pause, resume, cancel, kill)
    APPROVAL = "approval"  # an approval decision
    STOP = "stop"  # the run's exit and its stop reason


@json_native
class ChainRow(BaseModel):
    """One row of the execution chain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectory_id: str
    tenant: str
    user: str
    index: int  # position in the chain, from 0, gapless
    step: int  # the model-call step this row belongs to
    kind: RowKind
    record_version: int  # the version this row was committed with
    at: float  # the injected clock's time
    call_id: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    outcome: str | None = None
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    duration_s: float = 0.0
    detail: dict[str, Any] | None = None
