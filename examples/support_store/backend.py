"""The support store's tool backend, with the seeds' behaviour and latencies.

A repeated call key replays the stored result; a write that outlives its timeout still takes
effect but reports an unknown outcome; a refund above the automatic limit needs an approval
that reins granted for exactly those arguments. Writes and lookups are fenced: a write under a
key that was called or looked up with a newer fence is refused (``kernel.tools.ToolBackend``).
"""

from __future__ import annotations

from typing import Any

from examples.support_store.state import MemoryState, Order, StoreState, Written

AUTO_LIMIT = 5000  # cents
LATENCY = {"get_order": 0.4, "search_policy": 0.8, "issue_refund": 1.2, "send_status_email": 0.9}
REPLAY_S = 0.1
WRITES = frozenset({"issue_refund", "send_status_email"})
POLICY_TEXT = "Returns are accepted within 30 days of delivery. " * 90


def _err(code: str, **extra: Any) -> dict[str, Any]:
    return {"status": "error", "code": code, **extra}


class SupportStoreBackend:
    """Implements :class:`worker.backend.ToolBackend` over a :class:`StoreState`."""

    def __init__(self, state: StoreState | None = None, latency: dict[str, float] | None = None):
        self.state = state if state is not None else MemoryState()
        self.latency = {**LATENCY, **(latency or {})}
        self.calls = 0

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
        self.calls += 1
        secs = self.latency.get(tool, 0.5)
        if tool in WRITES:
            result, written = self._write(user, tool, args, key, approval, fence)
            if written is Written.FENCED:
                return result, REPLAY_S
            if written is Written.REPLAYED:
                return {**result, "replayed": True}, REPLAY_S
            if secs > timeout_s:  # it happened, but the caller only learns "unknown"
                return {"status": "unknown", "code": "timeout"}, max(timeout_s, 0.0)
            return result, secs
        result = self._read(user, tool, args)
        if secs > timeout_s:
            return _err("timeout"), max(timeout_s, 0.0)
        return result, secs

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        stored = self.state.lookup(key, tool, fence)
        if stored is None:
            return {"status": "absent", "key": key}, REPLAY_S
        return {**stored, "replayed": True}, REPLAY_S

    def effects(self) -> list[list[Any]]:
        """The effects ledger."""
        return self.state.effects()

    def fenced_writes(self) -> int:
        """How many writes were refused for an older fence."""
        return self.state.fenced_writes()

    # --- the store's rules ---------------------------------------------------------------

    def _read(self, user: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        if tool == "search_policy":
            return {"status": "ok", "text": POLICY_TEXT}
        order = self.state.order(str(args.get("order_id")))
        if order is None or order["customer"] != user:
            return _err("not_found")
        if tool == "get_order":
            return {
                "status": "ok",
                "order_status": order["status"],
                "total_cents": order["total"],
                "refunded_cents": order["refunded"],
            }
        return _err("unknown_tool")

    def _write(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        approval: str | None,
        fence: int,
    ) -> tuple[dict[str, Any], Written]:
        order_id = str(args.get("order_id"))

        def apply(order: Order | None) -> tuple[dict[str, Any], Order | None, list[list[Any]]]:
            if order is None or order["customer"] != user:
                return _err("not_found"), None, []
            if tool == "issue_refund":
                amount = int(args["amount_cents"])
                if amount > order["total"] - order["refunded"]:
                    return _err("invalid_state", detail="amount exceeds refundable"), None, []
                if amount > AUTO_LIMIT and approval is None:
                    return {"status": "needs_approval"}, None, []
                updated = {**order, "refunded": order["refunded"] + amount}
                result = {"status": "ok", "refunded_cents": updated["refunded"]}
                return result, updated, [["refund", order_id, amount]]
            email = ["email", order_id] + ([args["language"]] if "language" in args else [])
            return {"status": "ok", "sent": True}, None, [email]

        return self.state.write_once(key, tool, order_id, apply, fence)
