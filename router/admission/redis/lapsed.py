"""Claims of the Redis admitter whose deadline passed unconfirmed, resolved by any replica.

A claim still pending at its deadline means its dispatcher died or stalled between the claim
and its confirmation. Its trajectory is looked up: a call still READY goes back to the head of its
queue, any other claim is dropped; either way its gate debit is released (``lua/resolve.lua``,
which acts only once the deadline has passed, so replicas may reconcile at once). Design:
``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

from router.admission.lanes import LaneIndex
from router.admission.redis.claims import Readiness, Reconciled
from router.admission.redis.state import AdmitterState
from store.redis_client import text


class LapsedClaims:
    """Finds claims past their deadline and requeues or drops each."""

    def __init__(self, state: AdmitterState) -> None:
        self._state = state
        self._resolve = state.script("queue.lua", "gates.lua", "resolve.lua")

    def reconcile(self, ready: Readiness, limit: int = 100) -> Reconciled:
        """Resolve up to ``limit`` claims past their deadline (see the module docstring)."""
        state = self._state
        client, tag = state.client, state.tag
        now = state.time()
        lapsed = client.zrangebyscore(f"{tag}:pend", "-inf", now, start=0, num=limit)
        requeued: list[str] = []
        dropped: list[str] = []
        for raw in lapsed:
            cid = text(raw)
            packed = client.hget(f"{tag}:claims", cid)
            if packed is None:
                continue  # confirmed or declined since the range was read
            fields = text(packed).split("|", 11)  # lost|lostc|emptied|cemptied|<7 of data>|tid
            tid, lane = fields[-1], int(fields[4])
            tenant = state.parsed(LaneIndex.name, lane)
            op = "requeue" if ready(tenant, tid) else "reap"
            reply = self._resolve(state.keys, (op, cid, repr(now)), retry=False)
            if int(reply[0]) == 1:
                (requeued if op == "requeue" else dropped).append(tid)
        return Reconciled(tuple(requeued), tuple(dropped))
