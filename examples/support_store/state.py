"""Where the support store keeps its orders, effects, stored results and fences.

The backend's logic is the same whatever holds its state; the state only has to make two
things atomic: run a write under an idempotency key at most once, and check and remember the
highest fence each key was called or looked up with (docs/adr/0046-fencing.md). The in-memory
state is for one process; the Redis state is one service every worker shares and that outlives
any worker.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import redis

from kernel.tools import FENCED

Order = dict[str, Any]
Effect = list[Any]  # ["refund", order_id, cents] or ["email", order_id]
WriteFn = Callable[[Order | None], tuple[dict[str, Any], Order | None, list[Effect]]]
REFUSED: dict[str, Any] = {"status": "error", "code": FENCED}  # a write under an older fence


class Written(StrEnum):
    """What became of a write handed to :meth:`StoreState.write_once`."""

    RAN = "ran"  # the write ran: its result, stored with its effects when ok
    REPLAYED = "replayed"  # the key already had a result: that one, nothing ran
    FENCED = "fenced"  # the key was seen with a newer fence: refused, nothing ran


SEED_ORDERS: dict[str, Order] = {
    "ord_1001": {"customer": "cu_ana", "total": 4200, "refunded": 0, "status": "delivered"},
    "ord_1004": {"customer": "cu_ana", "total": 15000, "refunded": 0, "status": "delivered"},
}


class StoreState(ABC):
    """Orders, the effects ledger, results stored by (key, tool) and the highest fence seen
    for each key.

    ``deduplicate=False`` makes it a service that cannot de-duplicate: a repeated key runs its
    write again (its result is still stored, for lookups), so only fences keep a late write of
    an older attempt out. The support store itself de-duplicates; tests use both. Every write
    that passes its fence is counted by key and tool, whatever it then does (ran, replayed,
    or failed the store's rules: :meth:`write_attempts`), so a client that sends one write
    twice shows there even when the second changed nothing; a write its fence refused is
    counted apart (:meth:`fenced_writes`).
    """

    deduplicate: bool = True

    @abstractmethod
    def order(self, order_id: str) -> Order | None:
        """A copy of one order, or None."""

    @abstractmethod
    def lookup(self, key: str, tool: str, fence: int) -> dict[str, Any] | None:
        """Atomically: remember ``fence`` for ``key`` if it is the highest yet, and return the
        stored result of a write under ``key``, or None if none took effect."""

    @abstractmethod
    def write_once(
        self, key: str, tool: str, order_id: str, fn: WriteFn, fence: int
    ) -> tuple[dict[str, Any], Written]:
        """Atomically: refuse if ``key`` was seen with a fence above ``fence`` (FENCED, counted);
        else remember ``fence`` for it, and if the key already has a result for ``tool`` return
        it (REPLAYED, when de-duplicating); otherwise run ``fn`` on the order, and if its
        result is ok store the new order, the effects and the result under the key (RAN)."""

    @abstractmethod
    def effects(self) -> list[Effect]:
        """Every effect, in order."""

    @abstractmethod
    def fenced_writes(self) -> int:
        """How many writes were refused for an older fence."""

    @abstractmethod
    def write_attempts(self) -> dict[str, int]:
        """How many writes passed their fence, by ``<tool> <key>`` (each at least 1)."""


class MemoryState(StoreState):
    """State in this process, behind one lock."""

    def __init__(self, orders: dict[str, Order] | None = None, deduplicate: bool = True) -> None:
        self._orders = json.loads(json.dumps(orders if orders is not None else SEED_ORDERS))
        self._done: dict[str, dict[str, dict[str, Any]]] = {}
        self._effects: list[Effect] = []
        self._fences: dict[str, int] = {}
        self._fenced = 0
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.deduplicate = deduplicate

    def order(self, order_id: str) -> Order | None:
        with self._lock:
            found = self._orders.get(order_id)
            return dict(found) if found is not None else None

    def lookup(self, key: str, tool: str, fence: int) -> dict[str, Any] | None:
        with self._lock:
            self._fences[key] = max(self._fences.get(key, 0), fence)
            return self._done.get(key, {}).get(tool)

    def write_once(
        self, key: str, tool: str, order_id: str, fn: WriteFn, fence: int
    ) -> tuple[dict[str, Any], Written]:
        with self._lock:
            if fence < self._fences.get(key, 0):
                self._fenced += 1
                return dict(REFUSED), Written.FENCED
            attempt = f"{tool} {key}"
            self._attempts[attempt] = self._attempts.get(attempt, 0) + 1
            self._fences[key] = fence
            done = self._done.get(key, {}).get(tool)
            if done is not None and self.deduplicate:
                return done, Written.REPLAYED
            current = self._orders.get(order_id)
            result, new_order, effects = fn(dict(current) if current is not None else None)
            if result.get("status") == "ok":
                if new_order is not None:
                    self._orders[order_id] = new_order
                self._effects.extend(effects)
                self._done.setdefault(key, {})[tool] = result
            return result, Written.RAN

    def effects(self) -> list[Effect]:
        with self._lock:
            return [list(e) for e in self._effects]

    def fenced_writes(self) -> int:
        with self._lock:
            return self._fenced

    def write_attempts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._attempts)

    def orders(self) -> dict[str, Order]:
        """A copy of every order (for invariant checks)."""
        with self._lock:
            copied: dict[str, Order] = json.loads(json.dumps(self._orders))
            return copied


class RedisState(StoreState):
    """State in Redis, shared by every worker. A write is an optimistic WATCH/MULTI transaction
    over the key's fence, its stored result and the order, so it takes effect at most once and
    never under an older fence; a lookup is one script (``lookup.lua``) that raises the key's
    fence and reads its result, which aborts any write it overtakes."""

    def __init__(
        self, client: redis.Redis, prefix: str, seed: bool = True, deduplicate: bool = True
    ) -> None:
        self.r, self.p = client, f"{prefix}:store"
        self.deduplicate = deduplicate
        # A backend of its own, not reins: its one script is sent whole (EVAL) each time.
        self._lookup_lua = (Path(__file__).parent / "lookup.lua").read_text(encoding="utf-8")
        if seed:
            for oid, order in SEED_ORDERS.items():
                self.r.set(f"{self.p}:order:{oid}", json.dumps(order), nx=True)

    def order(self, order_id: str) -> Order | None:
        raw = self.r.get(f"{self.p}:order:{order_id}")
        return json.loads(raw) if raw is not None else None

    def lookup(self, key: str, tool: str, fence: int) -> dict[str, Any] | None:
        keys = (f"{self.p}:fence:{key}", f"{self.p}:done:{key}")
        raw = self.r.eval(self._lookup_lua, 2, *keys, fence, tool)
        return json.loads(raw) if raw is not None else None

    def write_once(
        self, key: str, tool: str, order_id: str, fn: WriteFn, fence: int
    ) -> tuple[dict[str, Any], Written]:
        fence_key = f"{self.p}:fence:{key}"
        done_key, order_key = f"{self.p}:done:{key}", f"{self.p}:order:{order_id}"
        for _ in range(1000):
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(fence_key, done_key, order_key)  # type: ignore[no-untyped-call]
                    seen = int(pipe.get(fence_key) or 0)
                    if fence < seen:
                        self.r.incr(f"{self.p}:fenced")
                        return dict(REFUSED), Written.FENCED
                    raw = pipe.hget(done_key, tool)
                    if raw is not None and self.deduplicate:
                        pipe.multi()
                        if fence > seen:
                            pipe.set(fence_key, fence)
                        pipe.hincrby(f"{self.p}:attempts", f"{tool} {key}", 1)
                        pipe.execute()
                        return json.loads(raw), Written.REPLAYED
                    raw_order = pipe.get(order_key)
                    current = json.loads(raw_order) if raw_order is not None else None
                    result, new_order, effects = fn(current)
                    pipe.multi()
                    if fence > seen:
                        pipe.set(fence_key, fence)
                    if result.get("status") == "ok":
                        if new_order is not None:
                            pipe.set(order_key, json.dumps(new_order))
                        for effect in effects:
                            pipe.rpush(f"{self.p}:effects", json.dumps(effect))
                        pipe.hset(done_key, tool, json.dumps(result))
                    pipe.hincrby(f"{self.p}:attempts", f"{tool} {key}", 1)
                    pipe.execute()
                    return result, Written.RAN
                except redis.WatchError:
                    continue
        raise RuntimeError(f"write under {key} kept conflicting")

    def effects(self) -> list[Effect]:
        return [json.loads(e) for e in self.r.lrange(f"{self.p}:effects", 0, -1)]

    def fenced_writes(self) -> int:
        return int(self.r.get(f"{self.p}:fenced") or 0)

    def write_attempts(self) -> dict[str, int]:
        raw: dict[bytes, bytes] = self.r.hgetall(f"{self.p}:attempts")  # type: ignore[assignment]
        return {k.decode(): int(v) for k, v in raw.items()}
