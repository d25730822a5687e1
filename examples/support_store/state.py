"""Where the support store keeps its orders, effects and stored results.

The backend's logic is the same whatever holds its state; the state only has to make one
thing atomic: run a write under an idempotency key at most once. The in-memory state is for
one process; the Redis state is one service every worker shares and that outlives any worker.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import redis

Order = dict[str, Any]
Effect = list[Any]  # ["refund", order_id, cents] or ["email", order_id]
WriteFn = Callable[[Order | None], tuple[dict[str, Any], Order | None, list[Effect]]]

SEED_ORDERS: dict[str, Order] = {
    "ord_1001": {"customer": "cu_ana", "total": 4200, "refunded": 0, "status": "delivered"},
    "ord_1004": {"customer": "cu_ana", "total": 15000, "refunded": 0, "status": "delivered"},
}


class StoreState(ABC):
    """Orders, the effects ledger, and results stored by (key, tool)."""

    @abstractmethod
    def order(self, order_id: str) -> Order | None:
        """A copy of one order, or None."""

    @abstractmethod
    def stored(self, key: str, tool: str) -> dict[str, Any] | None:
        """The stored result of a write under ``key``, or None if it never took effect."""

    @abstractmethod
    def write_once(
        self, key: str, tool: str, order_id: str, fn: WriteFn
    ) -> tuple[dict[str, Any], bool]:
        """Atomically: if ``key`` already has a result for ``tool`` return it (replayed=True);
        otherwise run ``fn`` on the order, and if its result is ok store the new order, the
        effects and the result under the key. Returns (result, replayed)."""

    @abstractmethod
    def effects(self) -> list[Effect]:
        """Every effect, in order."""


class MemoryState(StoreState):
    """State in this process, behind one lock."""

    def __init__(self, orders: dict[str, Order] | None = None) -> None:
        self._orders = json.loads(json.dumps(orders if orders is not None else SEED_ORDERS))
        self._done: dict[str, dict[str, dict[str, Any]]] = {}
        self._effects: list[Effect] = []
        self._lock = threading.Lock()

    def order(self, order_id: str) -> Order | None:
        with self._lock:
            found = self._orders.get(order_id)
            return dict(found) if found is not None else None

    def stored(self, key: str, tool: str) -> dict[str, Any] | None:
        with self._lock:
            return self._done.get(key, {}).get(tool)

    def write_once(
        self, key: str, tool: str, order_id: str, fn: WriteFn
    ) -> tuple[dict[str, Any], bool]:
        with self._lock:
            done = self._done.get(key, {}).get(tool)
            if done is not None:
                return done, True
            current = self._orders.get(order_id)
            result, new_order, effects = fn(dict(current) if current is not None else None)
            if result.get("status") == "ok":
                if new_order is not None:
                    self._orders[order_id] = new_order
                self._effects.extend(effects)
                self._done.setdefault(key, {})[tool] = result
            return result, False

    def effects(self) -> list[Effect]:
        with self._lock:
            return [list(e) for e in self._effects]

    def orders(self) -> dict[str, Order]:
        """A copy of every order (for invariant checks)."""
        with self._lock:
            copied: dict[str, Order] = json.loads(json.dumps(self._orders))
            return copied


class RedisState(StoreState):
    """State in Redis, shared by every worker; a write is an optimistic WATCH/MULTI transaction
    over the key's stored result and the order, so it takes effect at most once."""

    def __init__(self, client: redis.Redis, prefix: str, seed: bool = True) -> None:
        self.r, self.p = client, f"{prefix}:store"
        if seed:
            for oid, order in SEED_ORDERS.items():
                self.r.set(f"{self.p}:order:{oid}", json.dumps(order), nx=True)

    def order(self, order_id: str) -> Order | None:
        raw = self.r.get(f"{self.p}:order:{order_id}")
        return json.loads(raw) if raw is not None else None

    def stored(self, key: str, tool: str) -> dict[str, Any] | None:
        raw = self.r.hget(f"{self.p}:done:{key}", tool)
        return json.loads(raw) if raw is not None else None

    def write_once(
        self, key: str, tool: str, order_id: str, fn: WriteFn
    ) -> tuple[dict[str, Any], bool]:
        done_key, order_key = f"{self.p}:done:{key}", f"{self.p}:order:{order_id}"
        for _ in range(1000):
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(done_key, order_key)  # type: ignore[no-untyped-call]
                    raw = pipe.hget(done_key, tool)
                    if raw is not None:
                        return json.loads(raw), True
                    raw_order = pipe.get(order_key)
                    current = json.loads(raw_order) if raw_order is not None else None
                    result, new_order, effects = fn(current)
                    if result.get("status") != "ok":
                        return result, False
                    pipe.multi()
                    if new_order is not None:
                        pipe.set(order_key, json.dumps(new_order))
                    for effect in effects:
                        pipe.rpush(f"{self.p}:effects", json.dumps(effect))
                    pipe.hset(done_key, tool, json.dumps(result))
                    pipe.execute()
                    return result, False
                except redis.WatchError:
                    continue
        raise RuntimeError(f"write under {key} kept conflicting")

    def effects(self) -> list[Effect]:
        return [json.loads(e) for e in self.r.lrange(f"{self.p}:effects", 0, -1)]
