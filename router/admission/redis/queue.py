"""The queue side of the Redis admitter: calls in (submit, requeue) and out (withdraw).

Validation happens here, at the edge, with the same refusals as the in-memory
:class:`~router.admission.local.Admitter`; a refused call changes nothing. What passes is queued by
one run of ``lua/enqueue.lua`` for any number of calls. Design:
``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kernel.budget import Budget
from kernel.errors import SubmissionRefused
from kernel.states import StopReason
from router.admission.claims import ReturningCall
from router.admission.drr import ReadyCall
from router.admission.local import check_budget, check_route, scheduling_charge
from router.admission.queue import FinalizeNow
from router.admission.redis.claims import enqueued_from
from router.admission.redis.gates import RedisGates
from router.admission.redis.state import AdmitterState

#: A call to queue: (tenant, trajectory id, input tokens, output allowance, class, route).


class RedisQueue:
    """Validates calls and queues them, or takes a trajectory out, in the shared state."""

    def __init__(self, state: AdmitterState, gates: RedisGates | None) -> None:
        self._state = state
        self._gates = gates
        self._enqueue = state.script("queue.lua", "enqueue.lua")
        self._resolve = state.script("queue.lua", "gates.lua", "resolve.lua")

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
        lane, klass, cfg = self._state.lanes.resolve(tenant, service_class)
        charge = scheduling_charge(trajectory_id, input_tokens, output_allowance)
        route = self._route(trajectory_id, route, charge)
        if charge > cfg.largest_call_tokens:
            raise SubmissionRefused(
                f"trajectory {trajectory_id}: its call of {charge:,} tokens "
                f"({input_tokens:,} input + {output_allowance:,} output allowance) exceeds "
                f"tenant {tenant!r}'s largest call of {cfg.largest_call_tokens:,}",
                code="call_too_large",
            )
        if budget is not None:
            check_budget(cfg, trajectory_id, budget)
        entry = (trajectory_id, lane, klass, input_tokens, output_allowance, charge, route)
        answer = self._put([(*entry, cfg.max_ready)])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def requeue(self, call: ReturningCall) -> ReadyCall | FinalizeNow:
        """Queue one trajectory back at READY (:meth:`requeue_many`), raising its refusal."""
        answer = self.requeue_many([call])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def requeue_many(
        self, calls: Iterable[ReturningCall]
    ) -> list[ReadyCall | FinalizeNow | SubmissionRefused]:
        """Queue trajectories back at READY in one round trip; per call, its answer.

        Never refused for a full queue. Unknown tenants and classes and malformed calls raise
        before anything is queued; a trajectory already queued is answered with its
        :class:`SubmissionRefused`; a call too large for its tenant with :class:`FinalizeNow`.
        """
        answers: list[ReadyCall | FinalizeNow | SubmissionRefused] = []
        entries: list[tuple[Any, ...]] = []
        slots: list[int] = []
        for tenant, tid, input_tokens, output_allowance, service_class, route in calls:
            lane, klass, cfg = self._state.lanes.resolve(tenant, service_class, returning=True)
            charge = scheduling_charge(tid, input_tokens, output_allowance)
            route = self._route(tid, route, charge)
            if charge > cfg.largest_call_tokens:
                if self.is_queued(tid):
                    raise SubmissionRefused(
                        f"trajectory {tid} is already queued", code="already_queued"
                    )
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

    def withdraw(self, trajectory_id: str) -> bool:
        """Take a trajectory out, queued or claimed (its claim dropped); False if absent."""
        args = ("withdraw", trajectory_id, self._state.now())
        reply = self._resolve(self._state.keys, args, retry=False)
        return int(reply[0]) == 1

    def is_queued(self, trajectory_id: str) -> bool:
        """True while the trajectory waits in a queue or is claimed and not yet committed."""
        return bool(self._state.client.hexists(f"{self._state.tag}:calls", trajectory_id))

    def _route(self, trajectory_id: str, route: str | None, charge: int) -> str:
        route = check_route(trajectory_id, route)
        if not route:
            return route
        if self._gates is None or not self._gates.knows(route):
            raise SubmissionRefused(
                f"trajectory {trajectory_id}: no gate for route {route!r}", code="no_gate"
            )
        tpm = self._gates.config.routes[route].effective()[1]
        if 0 <= tpm < charge:
            raise SubmissionRefused(
                f"trajectory {trajectory_id}: its call of {charge:,} tokens can never fit "
                f"route {route!r}'s {tpm:,} tokens per window",
                code="never_fits",
            )
        return route

    def _put(self, entries: list[tuple[Any, ...]]) -> list[ReadyCall | SubmissionRefused]:
        """Queue validated entries in one script run; per entry the call or its refusal."""
        if not entries:
            return []
        args = [self._state.now()]
        for entry in entries:
            args.extend(entry)
        reply = self._enqueue(self._state.keys, args, retry=False)
        return enqueued_from(self._state.lanes, entries, reply)
