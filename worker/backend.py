"""Carrying out the kernel's tool commands against a :class:`~kernel.tools.ToolBackend`."""

from __future__ import annotations

from typing import Any

from kernel.events import DispatchTool, LookupEffect
from kernel.tools import ToolBackend


def dispatch(
    backend: ToolBackend, user: str, cmd: DispatchTool | LookupEffect, *, look_first: bool = False
) -> tuple[dict[str, Any], float]:
    """Carry out one tool command: a lookup of its idempotency key, or the call itself; either
    carries the command's fencing token.

    ``look_first`` (a write whose tool resolves unknown outcomes by lookup): the key is looked
    up under the command's fence before the write is sent, and an effect found is answered as
    the call's result, replayed, without sending it. A store that acknowledged a commit and
    then lost it (Redis's everysec: up to its last second) may have the write registered again
    under the same key after its first attempt took effect; the lookup finds that effect, and
    its fence shuts out an attempt still on its way.
    """
    if isinstance(cmd, LookupEffect):
        return backend.lookup(cmd.tool, cmd.idempotency_key, fence=cmd.fence)
    if look_first:
        found, looked_s = backend.lookup(cmd.tool, cmd.idempotency_key, fence=cmd.fence)
        status = found.get("status")
        if status in ("error", "unknown"):  # nothing known of the key: nothing may be sent
            return {"status": "unknown", "code": "lookup_failed"}, looked_s
        if status != "absent":
            return {**found, "replayed": True}, looked_s
        result, secs = _call(backend, user, cmd)
        return result, secs + looked_s
    return _call(backend, user, cmd)


def _call(backend: ToolBackend, user: str, cmd: DispatchTool) -> tuple[dict[str, Any], float]:
    return backend.call(
        user,
        cmd.tool,
        cmd.args,
        cmd.idempotency_key,
        cmd.timeout_s,
        approval=cmd.approval_digest,
        fence=cmd.fence,
    )
