"""The shared admitter's turns in flight per tenant: counted at the claim, ended exactly once.

A claim (``lua/claim.lua``) enters its trajectory into its lane's hash ``{P:adm}:f:<lane>``
(trajectory id -> claim id) in the same script that takes the call, and a lane with as many
entries as its tenant's ``max_in_flight`` is passed over until one leaves. An entry leaves when
its turn ends: the turn's notice (:meth:`InFlight.end` with the claim id it carried), a claim
declined or dropped (``lua/resolve.lua``), a worker's follow-on claim (``lua/returning.lua``), a
cancel or a recovery (:class:`router.submit.RouterApi`), or the drift sweep
(:mod:`router.inflight_sweep`). Ending is idempotent: an entry that names another claim (the
trajectory was admitted again since) stays. Design: ``docs/adr/0123-tenant-caps.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.redis_state import AdmitterState
from store.redis_client import text

#: (tenant, trajectory id, claim id or "" for whichever claim is no longer pending)
Ended = tuple[str, str, str]


class InFlight:
    """Ends turns in flight and reads them, for the admitter facade and the drift sweep."""

    def __init__(self, state: AdmitterState) -> None:
        self._state = state
        self._script = state.script("inflight.lua")

    def end(self, turns: Iterable[Ended]) -> int:
        """End each turn (idempotent, one round trip); returns how many entries left.

        A tenant the layout does not know (yet) is looked up again once; a turn of a tenant
        never configured has no entry, so it is skipped.
        """
        args: list[object] = ["end"]
        for tenant, tid, claim in turns:
            lane = self._lane(tenant)
            if lane is not None:
                args += (lane, tid, claim)
        if len(args) == 1:
            return 0
        return int(self._script(self._state.keys, args, retry=True))

    def count(self, tenant: str) -> int:
        """How many turns of ``tenant`` are in flight now (0 for an unknown tenant)."""
        lane = self._lane(tenant)
        if lane is None:
            return 0
        return int(self._state.client.hlen(f"{self._state.tag}:f:{lane}"))

    def page(self, lane: int, cursor: int, count: int) -> tuple[int, list[tuple[str, str]]]:
        """One HSCAN page of ``lane``'s turns in flight whose claim is no longer pending:
        (next cursor, 0 at the end of a walk; [(trajectory id, claim id), ...])."""
        reply = self._script(self._state.keys, ("page", lane, cursor, count), retry=True)
        flat = [text(v) for v in reply[1:]]
        return int(text(reply[0])), list(zip(flat[::2], flat[1::2], strict=True))

    def _lane(self, tenant: str) -> int | None:
        lane = self._state.lanes.lane_of.get(tenant)
        if lane is None:
            self._state.reload()
            lane = self._state.lanes.lane_of.get(tenant)
        return lane
