"""A trajectory's execution chain as Server-Sent Events, from a given row on, until its stop.

Each chain row is one event: ``id`` its chain index, ``event`` its kind, ``data`` the row's JSON.
A client that reconnects with ``Last-Event-ID: n`` gets the rows from ``n + 1`` on, so nothing
is lost or repeated across a reconnection (the chain is append-only and gapless). The stream
ends after the ``stop`` row, or once the record has ended and no row is left. Rows are found by
polling the chain's tail every ``poll_s`` (one ``LRANGE`` that is empty while nothing happens),
with a comment line every ``keepalive_s`` so proxies keep the connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kernel.chain import ChainRow, RowKind
from kernel.modeljson import model_json
from kernel.states import TERMINAL
from store.base import TrajectoryStore

POLL_S = 0.005
KEEPALIVE_S = 15.0
STATE_EVERY_S = 1.0  # how often an idle stream looks whether the run ended without a stop row


def frame(row: ChainRow) -> bytes:
    """One SSE event of ``row``."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        row.index,
        row.kind.value.encode(),
        model_json(row),
    )


@dataclass
class ChainFollower:
    """Follows one trajectory's chain (see the module docstring)."""

    store: TrajectoryStore
    tenant: str
    trajectory_id: str
    poll_s: float = POLL_S
    keepalive_s: float = KEEPALIVE_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def events(self, after: int | None, follow: bool = True) -> Iterator[bytes]:
        """The events after chain index ``after`` (None: from the first row); without
        ``follow``, only the rows already written."""
        start = 0 if after is None else after + 1
        last_sent = last_state = self.clock()
        while True:
            rows = self.store.read(self.tenant, self.trajectory_id, start)
            for row in rows:
                yield frame(row)
                start = row.index + 1
                if row.kind is RowKind.STOP:
                    return
            if not follow:
                return
            now = self.clock()
            if rows:
                last_sent = now
            elif now - last_state >= STATE_EVERY_S:
                last_state = now
                if self._ended(start):
                    return
            if now - last_sent >= self.keepalive_s:
                last_sent = now
                yield b": keepalive\n\n"
            self.sleep(self.poll_s)

    def _ended(self, start: int) -> bool:
        rec = self.store.load(self.tenant, self.trajectory_id)
        return rec.state in TERMINAL and rec.chain_length <= start


def parse_last_event_id(raw: str | None) -> int | None:
    """The chain index a ``Last-Event-ID`` names; None when absent; ValueError when not one."""
    if raw is None or raw == "":
        return None
    index = int(raw)
    if index < 0:
        raise ValueError("negative")
    return index
