"""The admitter in Redis: every router replica admits from the same queues, none twice.

Same contract as the in-memory :class:`~router.admitter.Admitter` (:mod:`router.admission`;
the contract suite holds the two to the same admissions, credits and depths). A nomination
here is a :class:`~router.claims.Claim`: the call is out of its queue and its gate debited
until the claim ends exactly once, by :meth:`~RedisAdmitter.commit`,
:meth:`~RedisAdmitter.decline`, a :meth:`~RedisAdmitter.withdraw` of its trajectory, or
:meth:`~RedisAdmitter.reconcile` after its deadline (``claim_ttl_s``). A commit that finds
its claim reaped raises :class:`~kernel.errors.ClaimLapsed`: debit the gate again before
sending. State lives under one hash tag and changes only inside the Lua scripts of
``router/lua``.
Design: ``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis
from redis.exceptions import RedisError

from kernel.budget import Budget
from kernel.errors import (
    ClaimLapsed,
    ConfigError,
    StaleNomination,
    StoreError,
    SubmissionRefused,
)
from kernel.states import StopReason
from router.admitter import Clock, FinalizeNow, check_budget, check_route, scheduling_charge
from router.claims import (
    Claim,
    ClaimAttempt,
    ClaimBatch,
    Readiness,
    Reconciled,
    call_from,
    claims_from,
    enqueued_from,
    store_readiness,
)
from router.drr import Nomination, ReadyCall
from router.fairness import FairnessBook, FairnessFigures
from router.redis_gates import LuaScript, RedisGates, admitter_tag
from router.tenants import AdmissionConfig, LaneIndex, TenantConfig
from store.redis_client import Batch, script_reply, text

__all__ = ["Claim", "ClaimAttempt", "ClaimBatch", "Reconciled", "RedisAdmitter", "store_readiness"]

#: A call to queue: (tenant, trajectory id, input tokens, output allowance, class, route).
Returning = tuple[str, str, int, int, str | None, str | None]


class RedisAdmitter:
    """The admitter over Redis; one instance per owner (not thread-safe), any number per fleet.

    Construction writes the configuration into an empty admitter state, or checks that the
    state holds the same one (:class:`ConfigError` otherwise: reconfiguring a live admitter is
    not supported yet). ``gates`` must be configured (:meth:`RedisGates.configure`) under the
    same prefix; a call with a route is refused at submission unless ``gates`` knows it.
    """

    def __init__(
        self,
        client: redis.Redis,
        config: AdmissionConfig,
        *,
        prefix: str = "reins",
        clock: Clock | None = None,
        gates: RedisGates | None = None,
        claim_ttl_s: float = 30.0,
    ) -> None:
        if gates is not None and gates.prefix != prefix:
            raise ConfigError(f"gates use prefix {gates.prefix!r}, the admitter {prefix!r}")
        if claim_ttl_s <= 0:
            raise ConfigError("claim_ttl_s must be positive")
        self.config = config
        self.tag = admitter_tag(prefix)
        self.gates = gates
        self._client = client
        self._clock = clock
        self._claim_ttl = repr(float(claim_ttl_s))
        self._keys = (f"{self.tag}:st",)
        self._lanes = LaneIndex(config)
        self._lane_of, self._class_of = self._lanes.lane_of, self._lanes.class_of
        self._claim = LuaScript(client, "state.lua", "pick.lua", "gates.lua", "claim.lua")
        self._commit = LuaScript(client, "state.lua", "commit.lua")
        self._chain = LuaScript(
            client, "state.lua", "queue.lua", "pick.lua", "gates.lua", "chain.lua", "claim.lua"
        )
        self._enqueue = LuaScript(client, "state.lua", "queue.lua", "enqueue.lua")
        self._resolve = LuaScript(client, "state.lua", "queue.lua", "gates.lua", "resolve.lua")
        self._book = FairnessBook(
            names=[t.name for t in config.tenants],
            weights=[t.weight for t in config.tenants],
            wait_buckets_s=config.wait_buckets_s,
            window_s=config.fairness_window_s,
        )
        args: list[object] = [_fingerprint(config), config.credit_cap_tokens, len(config.tenants)]
        for t in config.tenants:
            args += [round(config.quantum_tokens * t.weight), len(t.class_names)]
            args += [round(config.quantum_tokens * w) for w in t.class_weights]
        reply = LuaScript(client, "state.lua", "init.lua")(self._keys, args, retry=True)
        if isinstance(reply, list):
            raise ConfigError(
                f"admitter state {self.tag} holds another configuration ({text(reply[1])}); "
                "drain it or use another REINS_KEY_PREFIX"
            )

    def _now(self) -> str:
        return "" if self._clock is None else repr(self._clock())

    # --- edge: validated entry ----------------------------------------------------------------

    def submit(
        self,
        tenant: str,
        trajectory_id: str,
        *,
        input_tokens: int,
        output_allowance: int,
        service_class: str | None = None,
        budget: Budget | None = None,
        route: str | None = None,
    ) -> ReadyCall:
        """Queue a new trajectory's first call, or refuse it changing nothing (as Admitter)."""
        lane, klass, cfg = self._resolve_names(tenant, service_class)
        charge = scheduling_charge(trajectory_id, input_tokens, output_allowance)
        route = self._route(trajectory_id, route, charge)
        if charge > cfg.largest_call_tokens:
            raise SubmissionRefused(
                f"trajectory {trajectory_id}: its call of {charge:,} tokens "
                f"({input_tokens:,} input + {output_allowance:,} output allowance) exceeds "
                f"tenant {tenant!r}'s largest call of {cfg.largest_call_tokens:,}"
            )
        if budget is not None:
            check_budget(cfg, trajectory_id, budget)
        entry = (trajectory_id, lane, klass, input_tokens, output_allowance, charge, route)
        answer = self._put([(*entry, cfg.max_ready)])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def requeue(
        self,
        tenant: str,
        trajectory_id: str,
        *,
        input_tokens: int,
        output_allowance: int,
        service_class: str | None = None,
        route: str | None = None,
    ) -> ReadyCall | FinalizeNow:
        """Queue a trajectory back at READY, never refused for a full queue (as Admitter)."""
        entry = (tenant, trajectory_id, input_tokens, output_allowance, service_class, route)
        answer = self.requeue_many([entry])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def requeue_many(
        self, calls: Iterable[Returning]
    ) -> list[ReadyCall | FinalizeNow | SubmissionRefused]:
        """:meth:`requeue` for several trajectories in one round trip; per call, its answer.

        Unknown tenants and classes and malformed calls raise before anything is queued; a
        trajectory already queued is answered with its :class:`SubmissionRefused`.
        """
        answers: list[ReadyCall | FinalizeNow | SubmissionRefused] = []
        entries: list[tuple[Any, ...]] = []
        slots: list[int] = []
        for tenant, tid, input_tokens, output_allowance, service_class, route in calls:
            lane, klass, cfg = self._resolve_names(tenant, service_class)
            charge = scheduling_charge(tid, input_tokens, output_allowance)
            route = self._route(tid, route, charge)
            if charge > cfg.largest_call_tokens:
                if self.is_queued(tid):
                    raise SubmissionRefused(f"trajectory {tid} is already queued")
                answers.append(
                    FinalizeNow(
                        tid,
                        StopReason.MAX_TOKENS,
                        f"next call of {charge:,} tokens exceeds tenant {tenant!r}'s largest "
                        f"call of {cfg.largest_call_tokens:,}",
                    )
                )
                continue
            slots.append(len(answers))
            answers.append(FinalizeNow(tid, StopReason.MAX_TOKENS, ""))  # replaced below
            entries.append((tid, lane, klass, input_tokens, output_allowance, charge, route, -1))
        for slot, answer in zip(slots, self._put(entries), strict=True):
            answers[slot] = answer
        return answers

    def claim_returning(
        self, call: Returning, *, settle: tuple[str, str, int] = ("", "", -1)
    ) -> tuple[bool, Claim | None]:
        """Queue a trajectory back at READY, then claim it at once if that overtakes nobody.

        For the worker that just ended the trajectory's turn (:mod:`worker.chain`); one script
        run (chain.lua, then claim.lua), so no router claims the call in between. A call whose
        route has a gate is claimed only if weighted deficit round-robin picks it next (the
        claim a router would make next). A call with no gate competes for nothing, so it is
        claimed at once ("direct"). Either way the claim debits, deducts and counts as a
        router's claim does.

        Returns whether the call is queued and the claim, if one was made. ``(True, None)``:
        queued, another call comes first or its gate refused; a router admits it.
        ``(False, None)``: not queued (already queued, or its charge is over the tenant's
        largest call); the router's requeue decides. The route is the one the turn's
        admission checked. ``settle``: the ended turn's (route, lease id, tokens used or -1),
        settled first in the same run (as :meth:`RedisGates.settle`), whatever the answer.
        """
        tenant, tid, input_tokens, output_allowance, service_class, route = call
        lane, klass, cfg = self._resolve_names(tenant, service_class)
        charge = scheduling_charge(tid, input_tokens, output_allowance)
        if charge > cfg.largest_call_tokens:
            if settle[1] and self.gates is not None:
                self.gates.settle(settle[0], settle[1], settle[2] if settle[2] >= 0 else None)
            return False, None
        call_args = (tid, lane, klass, input_tokens, output_allowance, charge, route or "")
        args = (self._now(), 0, self._claim_ttl, "1", "direct", tid, 1, 0, *settle, *call_args)
        reply = self._chain(self._keys, args, retry=False)
        if int(reply[0]) == -1:
            return False, None
        if int(reply[0]) == -3:
            return True, None
        batch = claims_from(self.config, reply, True)
        return True, batch.claims[0] if batch.claims else None

    def withdraw(self, trajectory_id: str) -> bool:
        """Take a trajectory out, queued or claimed (its claim dropped); False if absent."""
        reply = self._resolve(self._keys, ("withdraw", trajectory_id, self._now()), retry=False)
        return int(reply[0]) == 1

    def is_queued(self, trajectory_id: str) -> bool:
        """True while the trajectory waits in a queue or is claimed and not yet committed."""
        return bool(self._client.hexists(f"{self.tag}:calls", trajectory_id))

    # --- hot path -----------------------------------------------------------------------------

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
        """One claim: ``tries`` gate refusals at most (0: one per lane in rotation); ``expect``:
        claim only that trajectory (reason "moved" if another comes first); ``skip`` and
        ``closed``: lanes and routes passed over (:func:`router.drr.nominate`)."""
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
        """Up to ``count`` claims in one script run, as many :meth:`claim` calls in a row."""
        return self._claims(count, tries, depths=depths, expect=expect, skip=skip, closed=closed)

    def _claims(
        self,
        count: int,
        tries: int,
        *,
        depths: bool,
        expect: str,
        mode: str = "claim",
        skip: Sequence[int] = (),
        closed: Sequence[str] = (),
    ) -> ClaimBatch:
        args = (self._now(), tries, self._claim_ttl, "1" if depths else "0", mode, expect)
        reply = self._claim(self._keys, (*args, count, len(skip), *skip, *closed), retry=False)
        if int(reply[0]) == -3:
            return ClaimBatch((), 0, "moved")
        return claims_from(self.config, reply, depths)

    def commit(self, nomination: Nomination) -> float:
        """End a claim as admitted; returns the call's admission wait (s).

        Raises :class:`ClaimLapsed` (a :class:`StaleNomination`) if the claim is no longer
        pending: withdrawn, or reaped after its deadline (then debit again before sending).
        """
        wait = self.commit_many([nomination])[0]
        if wait is None:
            claim = _claim_of(nomination)
            raise ClaimLapsed(
                f"claim {claim.claim_id} of {claim.call.trajectory_id} is no longer pending: "
                "withdrawn, or reaped and its quota released; debit again before sending"
            )
        return wait

    def commit_many(self, nominations: Sequence[Nomination]) -> list[float | None]:
        """Commit several claims in one round trip; per claim its wait, or None if it lapsed."""
        claims = [_claim_of(n) for n in nominations]
        reply = self._commit(self._keys, (self._now(), *(c.claim_id for c in claims)), retry=False)
        return self._committed(claims, reply)

    def commit_on(self, pipeline: Batch, claim: Claim) -> Callable[[Any], float | None]:
        """Queue the commit of ``claim`` on a pipeline (a bare ``EVALSHA``, executed with
        ``raise_on_error=False``) beside other writes; pass its reply to the function returned
        for :meth:`commit_many`'s answer (a server that lost the script: committed again)."""
        pipeline.execute_command(
            "EVALSHA", self._commit.sha, 1, *self._keys, self._now(), claim.claim_id
        )

        def finish(reply: Any) -> float | None:
            def again() -> Any:
                return self._commit(self._keys, (self._now(), claim.claim_id), retry=False)

            try:
                return self._committed([claim], script_reply(reply, again))[0]
            except RedisError as exc:
                raise StoreError(f"commit.lua: {exc}") from exc

        return finish

    def _committed(self, claims: Sequence[Claim], reply: Sequence[Any]) -> list[float | None]:
        now = float(text(reply[0]))
        waits: list[float | None] = []
        for claim, done in zip(claims, reply[1:], strict=True):
            if int(done) != 1:
                waits.append(None)
                continue
            call = claim.call
            waits.append(now - call.ready_at)
            self._book.record(claim.lane, call.charge, now - call.ready_at, now)
        return waits

    def decline(self, nomination: Nomination) -> None:
        """End a claim as refused: the call is READY at its queue head again, its debit released."""
        claim = _claim_of(nomination)
        reply = self._resolve(self._keys, ("decline", claim.claim_id, self._now()), retry=False)
        if int(reply[0]) != 1:
            raise StaleNomination(
                f"claim {claim.claim_id} of {claim.call.trajectory_id} is no longer pending; "
                "nothing to decline"
            )

    def admit_next(self, check: Callable[[ReadyCall], bool]) -> ReadyCall | None:
        """As :meth:`Admitter.admit_next`: the next call ``check`` and its gate accept, committed.

        Each step peeks at the nomination (nothing claimed), runs ``check``, and claims that very
        call; a refused tenant is skipped where it stands and its route closed for this call.
        """
        skip: list[int] = []
        closed: list[str] = []
        for _ in range(max(self._rotation_length(), 1)):
            args = (self._now(), 1, self._claim_ttl, "0", "peek", "", 1, len(skip))
            reply = self._claim(self._keys, (*args, *skip, *closed), retry=False)
            if int(reply[0]) != -2:
                return None
            call = call_from(self.config, text(reply[2]), text(reply[3]))
            if check(call):
                attempt = self.claim(1, expect=call.trajectory_id, skip=skip, closed=closed)
                if attempt.claim is not None:
                    self.commit(attempt.claim)
                    return call
                if attempt.reason == "moved":  # another replica changed the state: look again
                    continue
            skip.append(int(text(reply[1])))
            if call.route:
                closed.append(call.route)
        return None

    # --- reconciler ---------------------------------------------------------------------------

    def reconcile(self, ready: Readiness, limit: int = 100) -> Reconciled:
        """Resolve claims past their deadline: READY ones back to their queue head, others
        dropped; every one's gate debit released. Safe to run on several replicas at once."""
        now = self._clock() if self._clock is not None else _redis_time(self._client)
        lapsed = self._client.zrangebyscore(f"{self.tag}:pend", "-inf", now, start=0, num=limit)
        requeued: list[str] = []
        dropped: list[str] = []
        for raw in lapsed:
            cid = text(raw)
            packed = self._client.hget(f"{self.tag}:claims", cid)
            if packed is None:
                continue  # committed or declined since the range was read
            fields = text(packed).split("|", 11)  # lost|lostc|emptied|cemptied|<7 of data>|tid
            tid, tenant = fields[-1], self.config.tenants[int(fields[4])].name
            op = "requeue" if ready(tenant, tid) else "reap"
            reply = self._resolve(self._keys, (op, cid, repr(now)), retry=False)
            if int(reply[0]) == 1:
                (requeued if op == "requeue" else dropped).append(tid)
        return Reconciled(tuple(requeued), tuple(dropped))

    # --- figures ------------------------------------------------------------------------------

    def figures(self) -> FairnessFigures:
        """Per tenant: depth and credit (global); admitted calls, waits, window (this replica)."""
        n = len(self.config.tenants)
        values = self._fields([f"q:{i}" for i in range(n)] + [f"c:{i}" for i in range(n)])
        now = self._clock() if self._clock is not None else _redis_time(self._client)
        return self._book.snapshot(now, values[:n], values[n:])

    def admitted(self) -> list[tuple[int, int]]:
        """Per tenant, in configuration order: (calls, charge) committed by every replica."""
        n = len(self.config.tenants)
        values = self._fields([f"N:{i}" for i in range(n)] + [f"C:{i}" for i in range(n)])
        return list(zip(values[:n], values[n:], strict=True))

    # --- internals ----------------------------------------------------------------------------

    def _fields(self, names: list[str]) -> list[int]:
        return [int(text(v or b"0")) for v in self._client.hmget(f"{self.tag}:st", names)]

    def _resolve_names(
        self, tenant: str, service_class: str | None
    ) -> tuple[int, int, TenantConfig]:
        return self._lanes.resolve(tenant, service_class)

    def _route(self, trajectory_id: str, route: str | None, charge: int) -> str:
        route = check_route(trajectory_id, route)
        if not route:
            return route
        if self.gates is None or not self.gates.knows(route):
            raise SubmissionRefused(f"trajectory {trajectory_id}: no gate for route {route!r}")
        tpm = self.gates.config.routes[route].effective()[1]
        if 0 <= tpm < charge:
            raise SubmissionRefused(
                f"trajectory {trajectory_id}: its call of {charge:,} tokens can never fit "
                f"route {route!r}'s {tpm:,} tokens per window"
            )
        return route

    def _put(self, entries: list[tuple[Any, ...]]) -> list[ReadyCall | SubmissionRefused]:
        """Queue validated entries in one script run; per entry the call or its refusal."""
        if not entries:
            return []
        args = [self._now()]
        for entry in entries:
            args.extend(entry)
        return enqueued_from(self.config, entries, self._enqueue(self._keys, args, retry=False))

    def _rotation_length(self) -> int:
        pipe = self._client.pipeline(transaction=False)
        pipe.llen(f"{self.tag}:new")
        pipe.llen(f"{self.tag}:old")
        return int(sum(pipe.execute()))


def _claim_of(nomination: Nomination) -> Claim:
    if not isinstance(nomination, Claim):
        raise StaleNomination("not a claim of a Redis admitter; nominate from this admitter")
    return nomination


def _fingerprint(config: AdmissionConfig) -> str:
    shape = config.model_dump_json(include={"quantum_tokens", "credit_cap_tokens", "tenants"})
    return hashlib.sha1(shape.encode()).hexdigest()[:16]


def _redis_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1_000_000
