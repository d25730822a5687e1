"""The tool backend protocol a runner dispatches to."""

from __future__ import annotations

from typing import Any, Protocol

from kernel.events import DispatchTool, LookupEffect


class ToolBackend(Protocol):
    """Runs tool calls for one agent. Results are dicts with a ``status``; latency is reported.

    Contract: a write under an idempotency key takes effect at most once; a repeated key
    returns the stored result. A write that outlives its timeout may still take effect, and
    then reports ``{"status": "unknown"}``.
    """

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
    ) -> tuple[dict[str, Any], float]:
        """Run one call; return (result, seconds spent)."""
        ...

    def lookup(self, tool: str, key: str) -> tuple[dict[str, Any], float]:
        """Whether the effect of ``key`` happened: its stored result, or status ``absent``."""
        ...


def dispatch(
    backend: ToolBackend, user: str, cmd: DispatchTool | LookupEffect
) -> tuple[dict[str, Any], float]:
    """Carry out one tool command: a lookup of its idempotency key, or the call itself."""
    if isinstance(cmd, LookupEffect):
        return backend.lookup(cmd.tool, cmd.idempotency_key)
    return backend.call(
        user, cmd.tool, cmd.args, cmd.idempotency_key, cmd.timeout_s, approval=cmd.approval_digest
    )
