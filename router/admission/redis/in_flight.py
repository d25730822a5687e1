"""The shared admitter's turns in flight per tenant: counted at the claim, ended exactly once.

A claim (``lua/claim.lua``) enters its trajectory into its lane's hash ``{P:adm}:f:<lane>``
(trajectory id -> claim id) in the same script that takes the call, and a lane with as many entries
as its tenant's ``max_in_flight`` is passed over until one leaves. An entry leaves when its turn
ends: the turn's notice (:meth:`InFlight.end` with the claim id it carried), a claim declined or
dropped (``lua/resolve.lua``), a worker's follow-on claim (``lua/returning.lua``), a cancel or a
recovery (:class:`router.process.submit.RouterApi`), or the drift sweep
(:mod:`router.process.in_flight_sweep`). Ending is idempotent: an entry that names another claim
(the trajectory was admitted again since) stays. Design: ``docs/adr/0123-tenant-caps.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from router.admission.claims import EndedTurn
from router.admission.redis.state import AdmitterState
from store.redis_client import text


class ClaimedTurn(NamedTuple):
    """A turn in flight: its trajectory and the claim it was admitted under."""

    trajectory_id: str
    claim_id: str


class InFlightPage(NamedTuple):
    """A page of a lane's turns in flight; ``cursor`` continues the walk (0: it is done)."""

    cursor: int
    turns: list[ClaimedTurn]


class TurnsInFlight:
    """Ends turns in flight and reads them, for the admitter facade and the drift sweep."""

    def __init__(self, state: AdmitterState) -> None:
        self._state = state
        self._script = state.script("in_flight.lua")

    def end(self, turns: Iterable[EndedTurn]) -> int:
        """End each turn (idempotent, one round trip); returns how many entries left. A turn's
        claim id "" ends whichever claim is no longer pending.

        A tenant the layout does not know (yet) is looked up again once; a turn of a tenant
        never configured has no entry, so it is skipped.
        """
        args: list[object] = ["end"]
        for turn in turns:
            lane = self._lane(turn.tenant)
            if lane is not None:
                args += (lane, turn.trajectory_id, turn.claim_id)
        if len(args) == 1:
            return 0
        return int(self._script(self._state.keys, args, retry=True))

    def count(self, tenant: str) -> int:
        """How many turns of ``tenant`` are in flight now (0 for an unknown tenant)."""
        lane = self._lane(tenant)
        if lane is None:
            return 0
        return int(self._state.client.hlen(f"{self._state.tag}:f:{lane}"))

    def page(self, lane: int, cursor: int, count: int) -> InFlightPage:
        """One HSCAN page of ``lane``'s turns in flight whose claim is no longer pending."""
        reply = self._script(self._state.keys, ("page", lane, cursor, count), retry=True)
        flat = [text(v) for v in reply[1:]]
        turns = [ClaimedTurn(t, c) for t, c in zip(flat[::2], flat[1::2], strict=True)]
        return InFlightPage(int(text(reply[0])), turns)

    def _lane(self, tenant: str) -> int | None:
        lane = self._state.lanes.lane_of.get(tenant)
        if lane is None:
            self._state.reload()
            lane = self._state.lanes.lane_of.get(tenant)
        return lane
