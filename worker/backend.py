"""Carrying out the kernel's tool commands against a :class:`~kernel.tools.ToolBackend`."""

from __future__ import annotations

from typing import Any

from kernel.events import DispatchTool, LookupEffect
from kernel.tools import ToolBackend


def dispatch(
    backend: ToolBackend, user: str, cmd: DispatchTool | LookupEffect
) -> tuple[dict[str, Any], float]:
    """Carry out one tool command: a lookup of its idempotency key, or the call itself; either
    carries the command's fencing token."""
    if isinstance(cmd, LookupEffect):
        return backend.lookup(cmd.tool, cmd.idempotency_key, fence=cmd.fence)
    return backend.call(
        user,
        cmd.tool,
        cmd.args,
        cmd.idempotency_key,
        cmd.timeout_s,
        approval=cmd.approval_digest,
        fence=cmd.fence,
    )
