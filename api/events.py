"""A trajectory's execution chain as Server-Sent Events, from a given row on, until its stop.

Each chain row is one event: ``id`` its chain index, ``event`` its kind, ``data`` the row's JSON.
A client that reconnects with ``Last-Event-ID: n`` gets the rows from ``n + 1`` on, so nothing
is lost or repeated across a reconnection (the chain is append-only and gapless). The stream
ends after the ``stop`` row, or once the record has ended and no row is left, or once its
caller may no longer read it (``allowed``, asked every ``recheck_s``: a revoked key's stream
ends within the API's memory of keys). Rows are found by polling the chain's tail every
``poll_s`` with one ``LRANGE`` on an asyncio Redis client (empty while nothing happens), so a
follower holds no thread; a comment line goes out every ``keepalive_s`` so proxies keep the
connection.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from kernel.chain import ChainRow, RowKind
from kernel.errors import InvalidInput
from kernel.modeljson import model_json
from kernel.states import TERMINAL
from store.base import decode_row
from store.redis_store import RedisStore

POLL_S = 0.005
KEEPALIVE_S = 15.0
STATE_EVERY_S = 1.0  # how often an idle stream looks whether the run ended without a stop row
RECHECK_S = 5.0  # how often a stream asks whether its caller may still read it
REVOKED = b": the key or session no longer holds; the stream ends\n\n"
_INDEX = re.compile(r"[0-9]{1,19}")  # ASCII digits only: int() also takes "+1", " 1", "1_0"


def frame(row: ChainRow) -> bytes:
    """One SSE event of ``row``."""
    kind = row.kind.value.encode()
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (row.index, kind, model_json(row))


@dataclass
class ChainFollower:
    """Follows one trajectory's chain (see the module docstring).

    ``tail`` is an asyncio Redis client of the store's server; ``store`` the store itself, read
    (in a thread) only to see whether an idle run has ended. ``allowed`` (run in a thread,
    every ``recheck_s``, first ``recheck_s`` after the start) answers whether the caller may
    still read the stream; once it says no, a comment line says so and the stream ends.
    """

    tail: Any  # redis.asyncio.Redis
    store: RedisStore
    tenant: str
    trajectory_id: str
    poll_s: float = POLL_S
    keepalive_s: float = KEEPALIVE_S
    clock: Callable[[], float] = time.monotonic
    allowed: Callable[[], bool] | None = None
    recheck_s: float = RECHECK_S
    _next_check: float = field(default=0.0, init=False, repr=False)

    async def events(self, after: int | None, follow: bool = True) -> AsyncIterator[bytes]:
        """The events after chain index ``after`` (None: from the first row); without
        ``follow``, only the rows already written."""
        chain_key = self.store.trajectory_keys(self.tenant, self.trajectory_id)[1]
        start = 0 if after is None else after + 1
        last_sent = last_state = self.clock()
        self._next_check = last_sent + self.recheck_s
        while True:
            if await self._revoked():
                yield REVOKED
                return
            raw = await self.tail.lrange(chain_key, start, -1)
            for data in raw:
                row = decode_row(self.trajectory_id, data)
                yield frame(row)
                start = row.index + 1
                if row.kind is RowKind.STOP:
                    return
            if not follow:
                return
            now = self.clock()
            if raw:
                last_sent = now
            elif now - last_state >= STATE_EVERY_S:
                last_state = now
                if await anyio.to_thread.run_sync(self._ended, start):
                    return
            if now - last_sent >= self.keepalive_s:
                last_sent = now
                yield b": keepalive\n\n"
            await asyncio.sleep(self.poll_s)

    async def _revoked(self) -> bool:
        """True once ``allowed`` says no; it is asked every ``recheck_s`` at most."""
        if self.allowed is None or self.clock() < self._next_check:
            return False
        self._next_check = self.clock() + self.recheck_s
        return not await anyio.to_thread.run_sync(self.allowed)

    def _ended(self, start: int) -> bool:
        rec = self.store.load(self.tenant, self.trajectory_id)
        return rec.state in TERMINAL and rec.chain_length <= start


def last_event_index(raw: str | None, chain_length: int) -> int | None:
    """The chain index a ``Last-Event-ID`` names, None when absent. It must name a row the
    chain holds (0 to ``chain_length - 1``): the stream sent no other, and a number past
    Redis's integers would fail the read after the stream began. :class:`InvalidInput` naming
    the header otherwise."""
    if raw is None or raw == "":
        return None
    if not _INDEX.fullmatch(raw) or int(raw) >= chain_length:
        last = f"0 to {chain_length - 1}" if chain_length else "none yet"
        raise InvalidInput(
            f"Last-Event-ID must be the index of a row this chain holds ({last}); "
            "send none to read from the first row",
            code="last_event_id_out_of_range",
            field="Last-Event-ID",
        )
    return int(raw)
