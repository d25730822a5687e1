"""The claim side of the Redis admitter: the next calls by DRR, each claimed with its gate debit.

One run of ``lua/claim.lua`` picks by weighted deficit round-robin, debits the call's route
under the new claim id, deducts the charge and takes the call out of its queue, for up to
``count`` calls; no other claim, in any replica, can return the same call until this one ends
(:mod:`router.admission.redis.confirms`, :mod:`router.admission.redis.lapsed`).
:class:`FollowOnClaims` queues a
returning call and claims it in the same run. Design: ``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from router.admission.claims import Claim, ClaimBatch, EndedTurn, ReturningCall
from router.admission.drr import ReadyCall
from router.admission.gates import NO_SETTLEMENT, GateSettlement
from router.admission.local import scheduling_charge
from router.admission.redis.claims import ClaimAttempt, call_from, claims_from
from router.admission.redis.gates import RedisGates
from router.admission.redis.in_flight import TurnsInFlight
from router.admission.redis.state import AdmitterState
from store.redis_client import text


class RedisClaims:
    """Claims the next calls by DRR, passing each through its route's gate."""

    def __init__(self, state: AdmitterState) -> None:
        self._state = state
        self._claim = state.script("pick.lua", "gates.lua", "claim.lua")

    def nominate(self) -> Claim | None:
        """Claim the next call that passes its gate, or None (nothing queued, or all gated)."""
        return self.claim().claim

    def claim(
        self,
        tries: int = 0,
        *,
        depths: bool = False,
        expect: str = "",
        skip: Sequence[int] = (),
        closed: Sequence[str] = (),
    ) -> ClaimAttempt:
        """One claim (the arguments as :meth:`claim_many`'s)."""
        batch = self.claim_many(1, tries, depths=depths, expect=expect, skip=skip, closed=closed)
        return ClaimAttempt(batch.claims[0] if batch.claims else None, batch.refused, batch.reason)

    def claim_many(
        self,
        count: int,
        tries: int = 0,
        *,
        depths: bool = False,
        expect: str = "",
        skip: Sequence[int] = (),
        closed: Sequence[str] = (),
    ) -> ClaimBatch:
        """Up to ``count`` claims in one script run, as many :meth:`claim` calls in a row.

        ``tries``: gate refusals at most (0: one per lane in rotation); ``expect``: claim only
        that trajectory (reason "moved" if another comes first); ``skip`` and ``closed``: lanes
        and routes passed over (:func:`router.admission.drr.nominate`).
        """
        state = self._state
        args = (state.now(), tries, state.claim_ttl, "1" if depths else "0", "claim", expect)
        reply = self._claim(state.keys, (*args, count, len(skip), *skip, *closed), retry=False)
        if int(reply[0]) == -3:
            return ClaimBatch((), 0, "moved")
        return state.parsed(claims_from, reply, depths)

    def admit_next(
        self, check: Callable[[ReadyCall], bool], confirm: Callable[[Claim], float]
    ) -> ReadyCall | None:
        """The next call ``check`` and its gate accept, claimed and then confirmed.

        Each step peeks at the nomination (nothing claimed), runs ``check``, and claims that very
        call; a refused tenant is skipped where it stands and its route closed for this call.
        """
        state = self._state
        skip: list[int] = []
        closed: list[str] = []
        for _ in range(max(state.rotation_length(), 1)):
            args = (state.now(), 1, state.claim_ttl, "0", "peek", "", 1, len(skip))
            reply = self._claim(state.keys, (*args, *skip, *closed), retry=False)
            if int(reply[0]) != -2:
                return None
            call = state.parsed(call_from, text(reply[2]), text(reply[3]))
            if check(call):
                attempt = self.claim(1, expect=call.trajectory_id, skip=skip, closed=closed)
                if attempt.claim is not None:
                    confirm(attempt.claim)
                    return call
                if attempt.reason == "moved":  # another replica changed the state: look again
                    continue
            skip.append(int(text(reply[1])))
            if call.route:
                closed.append(call.route)
        return None


class FollowOnClaims:
    """Queues a returning trajectory's call and claims it in the same script run."""

    def __init__(self, state: AdmitterState, gates: RedisGates | None) -> None:
        self._state = state
        self._gates = gates
        self._in_flight = TurnsInFlight(state)
        self._returning = state.script(
            "queue.lua", "pick.lua", "gates.lua", "returning.lua", "claim.lua"
        )

    def claim_returning(
        self, call: ReturningCall, *, settle: GateSettlement = NO_SETTLEMENT
    ) -> tuple[bool, Claim | None]:
        """Queue the call back at READY, then claim it at once if that overtakes nobody.

        The contract is :meth:`router.admission.redis.admitter.RedisAdmitter.claim_returning`'s.
        """
        state = self._state
        tenant, tid, input_tokens, output_allowance, service_class, route = call
        lane, klass, cfg = state.lanes.resolve(tenant, service_class, returning=True)
        charge = scheduling_charge(tid, input_tokens, output_allowance)
        if charge > cfg.largest_call_tokens:
            if settle.lease and self._gates is not None:
                used = settle.used_tokens if settle.used_tokens >= 0 else None
                self._gates.settle(settle.route, settle.lease, used)
            # Its turn ended all the same (ADR 0123).
            self._in_flight.end([EndedTurn(tenant, tid, "")])
            return False, None
        call_args = (tid, lane, klass, input_tokens, output_allowance, charge, route or "")
        args = (state.now(), 0, state.claim_ttl, "1", "direct", tid, 1, 0, *settle, *call_args)
        reply = self._returning(state.keys, args, retry=False)
        if int(reply[0]) == -1:
            return False, None
        if int(reply[0]) == -3:
            return True, None
        batch = state.parsed(claims_from, reply, True)
        return True, batch.claims[0] if batch.claims else None
