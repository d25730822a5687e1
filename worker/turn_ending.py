"""How a turn leaves this worker: its one notice, or its hand-back, and then its custody entry.

Each message ends in exactly one notice or one hand-back. The gate lease is let go first (the
router settles it from the notice, or the member the turn goes to keeps it), and the turn is
released from this worker's custody after it, only if they still name the version carried
out. Failures are logged, never raised: a notice (with its release) that could not be pushed is
kept and pushed again by :meth:`TurnEnding.push_kept` (the worker's heartbeat), so a turn that
failed, or ended while Redis was out of reach, leaves custody and is found by the router's sweeps
once Redis answers. See docs/adr/0040-turn-runner.md.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import replace

from router.wire.custody import Custody
from router.wire.feed import Feed
from router.wire.notices import Notice
from router.wire.turns import HandBack, HandBackWhy, TurnMessage
from worker.leases import LeaseKeeper
from worker.turn_commands import Metered

log = logging.getLogger("reins.worker.turn")
NO_USAGE = -1  # Notice.used_tokens when the turn saw no usage
KEEP_AT_MOST = 10_000  # notices kept for a later push while Redis is out of reach


class TurnEnding:
    """Pushes a worker's notices and hand-backs and releases its custody; thread-safe."""

    def __init__(
        self,
        feed: Feed,
        worker: str,
        custody: Custody | None,
        leases: LeaseKeeper | None,
    ) -> None:
        self.feed, self.worker = feed, worker
        self.custody = custody  # None: nothing is held (no reconciler recovers this worker)
        self.leases = leases  # None: gate leases are not kept alive here
        # pushes that failed, oldest first (the oldest dropped past the bound)
        self._kept: deque[tuple[TurnMessage, Notice]] = deque(maxlen=KEEP_AT_MOST)
        self._lock = threading.Lock()

    def keep_lease(self, msg: TurnMessage) -> bool:
        """The turn under ``msg`` started: keep its gate lease alive until it ends. False when
        another turn of this process holds the lease (``msg`` is a duplicate)."""
        if self.leases is not None:
            return self.leases.hold(msg.route, msg.lease, msg.lease_ttl_s)
        return True

    def let_go(self, msg: TurnMessage) -> None:
        """Stop renewing the turn's gate lease (its notice or its next holder settles it)."""
        if self.leases is not None and msg.lease:
            self.leases.drop(msg.lease)

    def notify(
        self,
        msg: TurnMessage,
        notice: Notice,
        used_tokens: int = NO_USAGE,
        metered: Metered | None = None,
        *,
        holder: bool = True,
    ) -> None:
        """Push the turn's one notice, carrying the gate lease and what the last reply said of
        the provider's quota back to the router, and release the custody entry in the same
        round trip. Not the lease's ``holder`` (a duplicate message, which ran nothing): the
        notice carries no lease, so the turn that holds it is the only one to settle it."""
        if not holder:
            self._push_or_keep(msg, notice)
            return
        self.let_go(msg)  # the router settles the lease on the notice: renew it no more
        if msg.lease or used_tokens >= 0:
            notice = replace(
                notice, lease=msg.lease, lease_route=msg.route, used_tokens=used_tokens
            )
        if metered is not None and metered.feedback and msg.route:
            retry = -1.0 if metered.retry_after_s is None else max(metered.retry_after_s, 0.0)
            notice = replace(
                notice,
                lease_route=msg.route,
                retry_after_s=retry,
                rate_limits=dict(metered.rate_limits),
            )
        self._push_or_keep(msg, notice)

    def _push_or_keep(self, msg: TurnMessage, notice: Notice) -> None:
        if not self._push(msg, notice):
            with self._lock:
                self._kept.append((msg, notice))

    def push_kept(self) -> int:
        """Push again the notices whose push failed, oldest first, until one fails again;
        returns how many went."""
        pushed = 0
        while True:
            with self._lock:
                if not self._kept:
                    return pushed
                msg, notice = self._kept.popleft()
            if not self._push(msg, notice):
                with self._lock:
                    self._kept.appendleft((msg, notice))
                return pushed
            pushed += 1

    def _push(self, msg: TurnMessage, notice: Notice) -> bool:
        """The notice, then the custody release, in one round trip; False if it failed."""
        pipe = self.feed.batch()  # the notice, then the release: one round trip
        entry = (self.worker, msg.tenant, msg.trajectory_id, msg.version)
        try:
            self.feed.push(notice, pipeline=pipe)
            if self.custody is not None:
                self.custody.release(*entry, pipeline=pipe)
            replies = pipe.execute(raise_on_error=False)
            if isinstance(replies[0], Exception):
                raise replies[0]
            if self.custody is not None:
                self.custody.released_on(replies[-1], *entry)
        except Exception as exc:  # kept: pushed again at the next heartbeat
            log.warning(
                "could not push the notice of %s (or release its custody entry): %s; kept",
                msg.trajectory_id,
                exc,
            )
            return False
        return True

    def hand_back(self, msg: TurnMessage, why: HandBackWhy) -> None:
        """Give ``msg`` back unstarted, instead of its notice: a router sends it on under the
        same call ids (a member that cannot read the record is not sent it again)."""
        self.let_go(msg)  # the member the turn goes to keeps its lease alive
        refused = msg.refused_by + ((self.worker,) if why is HandBackWhy.SCHEMA else ())
        try:
            self.feed.hand_back(HandBack(self.worker, why, replace(msg, refused_by=refused)))
        except Exception:  # kept in the custody: recovered if this member goes away
            log.exception("could not hand back the turn of %s", msg.trajectory_id)
            return
        self.release(msg)

    def release(self, msg: TurnMessage) -> None:
        """Release the custody entry of ``msg``'s version, if this worker keeps custody."""
        if self.custody is not None:
            try:  # after the notice: a lost release only leaves an entry the turn moved past
                self.custody.release(self.worker, msg.tenant, msg.trajectory_id, msg.version)
            except Exception:
                log.exception("could not release the custody entry of %s", msg.trajectory_id)
