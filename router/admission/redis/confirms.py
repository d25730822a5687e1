"""How a claim of the Redis admitter ends when its dispatcher resolves it: confirm or decline.

A confirmation (``lua/confirm.lua``) keeps the claim's gate debit and counts the admission; a
decline (``lua/resolve.lua``) puts the call back at the head of its queue with the credit it had and
releases the debit. Either raises :class:`~kernel.errors.StaleNomination` (a confirmation its
subclass :class:`~kernel.errors.ClaimLapsed`) for a claim no longer pending, changing nothing.
Design: ``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from kernel.errors import ClaimLapsed, ReinsError, StaleNomination, StoreError
from router.admission.claims import AdmissionRecord, Claim
from router.admission.drr import Nomination
from router.admission.redis.state import AdmitterState
from store.redis_client import Batch, script_reply, text
from store.redis_store import CommitMark


class ClaimEnds:
    """Confirms and declines claims; each confirmation goes to ``record`` (the figures)."""

    def __init__(
        self, state: AdmitterState, record: Callable[[str, int, float, float], None]
    ) -> None:
        self._state = state
        self._record = record
        self._confirm = state.script("confirm.lua")
        self._committed = state.script("confirm.lua", "committed.lua")
        self._resolve = state.script("queue.lua", "gates.lua", "resolve.lua")

    def confirm(self, nomination: Nomination) -> float:
        """End a claim as admitted; returns the call's admission wait (s), or raises
        :class:`ClaimLapsed` if the claim is no longer pending."""
        wait = self.confirm_many([nomination])[0]
        if wait is None:
            claim = claim_of(nomination)
            raise ClaimLapsed(
                f"claim {claim.claim_id} of {claim.call.trajectory_id} is no longer pending: "
                "withdrawn, or reaped and its quota released; debit again before sending"
            )
        return wait

    def confirm_many(self, nominations: Sequence[Nomination]) -> list[float | None]:
        """Commit several claims in one round trip; per claim its wait, or None if it lapsed."""
        claims = [claim_of(n) for n in nominations]
        state = self._state
        reply = self._confirm(state.keys, (state.now(), *(c.claim_id for c in claims)), retry=False)
        return self._confirmed(claims, reply)

    def confirm_on(self, pipeline: Batch, claim: Claim) -> Callable[[Any], float | None]:
        """Queue the confirmation of ``claim`` on a pipeline; the function returned turns its reply
        into :meth:`confirm_many`'s answer (a server that lost the script: confirmed again)."""
        state = self._state
        pipeline.execute_command(
            "EVALSHA", self._confirm.sha, 1, *state.keys, state.now(), claim.claim_id
        )

        def finish(reply: Any) -> float | None:
            def again() -> Any:
                return self._confirm(state.keys, (state.now(), claim.claim_id), retry=False)

            try:
                return self._confirmed([claim], script_reply(reply, again))[0]
            except RedisError as exc:
                raise StoreError(f"confirm.lua: {exc}") from exc

        return finish

    def confirm_committed(
        self, claim: Claim, mark: CommitMark, figures: AdmissionRecord
    ) -> tuple[tuple[Any, ...], Callable[[Any], tuple[bool, float | None]]]:
        """The command that confirms ``claim`` only if its admission committed (``mark``: the
        snapshot key, commit field and commit id that say so) and then records ``figures``
        (the admissions list, the entry, the list's cap), for a round trip on one node behind
        that compare-and-set (``lua/committed.lua``); and the function that reads its reply:
        (True, :meth:`confirm_many`'s answer) once it ran, (False, None) when it did not (the
        admission had not committed, or the reply is an error): the claim is then as it was."""
        state = self._state
        keys = (*state.keys, mark.key, figures.list_key)
        args = (state.now(), mark.field, mark.commit_id, figures.entry, figures.cap, claim.claim_id)

        def finish(reply: Any) -> tuple[bool, float | None]:
            if isinstance(reply, NoScriptError):  # a restarted server: load it, run it again
                try:
                    reply = self._committed(keys, args, retry=False)
                except ReinsError as exc:  # its outcome unknown: the caller confirms on its own
                    reply = exc
            if isinstance(reply, Exception) or int(reply[1]) < 0:
                return False, None
            return True, self._confirmed([claim], reply)[0]

        return ("EVALSHA", self._committed.sha, len(keys), *keys, *args), finish

    def decline(self, nomination: Nomination) -> None:
        """End a claim as refused: the call is READY at its queue head again, its debit released."""
        claim = claim_of(nomination)
        state = self._state
        reply = self._resolve(state.keys, ("decline", claim.claim_id, state.now()), retry=False)
        if int(reply[0]) != 1:
            raise StaleNomination(
                f"claim {claim.claim_id} of {claim.call.trajectory_id} is no longer pending; "
                "nothing to decline"
            )

    def _confirmed(self, claims: Sequence[Claim], reply: Sequence[Any]) -> list[float | None]:
        now = float(text(reply[0]))
        waits: list[float | None] = []
        for claim, done in zip(claims, reply[1:], strict=True):
            if int(done) != 1:
                waits.append(None)
                continue
            call = claim.call
            waits.append(now - call.ready_at)
            self._record(call.tenant, call.charge, now - call.ready_at, now)
        return waits


def claim_of(nomination: Nomination) -> Claim:
    """The nomination as a claim of a Redis admitter, or :class:`StaleNomination`."""
    if not isinstance(nomination, Claim):
        raise StaleNomination("not a claim of a Redis admitter; nominate from this admitter")
    return nomination
