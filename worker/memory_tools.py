"""Carrying out the memory tools under the agent's memory policy.

The owner of every fact written or recalled comes from the trajectory's record (its tenant,
user and agent), never from the arguments the model wrote; the arguments were validated by the
kernel against the tool's schema before the command existed. A ``remember_fact`` is judged
against the run's record before anything is stored (``kernel.memory_policy``): its provenance
and trust, the users it concerns, and whether the agent's policy lets that source write that
scope. A refused write is answered to the model as an error naming why, and stores nothing.
Recalled facts carry their source and trust, so a later write built on an untrusted one is
untrusted too. The episode a run's end leaves is written by :mod:`router.fleet.episodes`.

With an :class:`~worker.providers.embeddings.Embedder` (``REINS_EMBEDDINGS_URL``), a fact is
stored with its embedding and a recall re-ranks the text index's candidates by
``kernel.memory_rank.combined_score``; the answer says ``ranked_by``. An embedder that fails or
hangs (bounded by its timeout) fails nothing: the fact is stored without its embedding, the
recall is the text index's alone (``ranked_by`` says ``text_fallback``), and a warning is
logged with the failure's code. Without an embedder, everything is as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kernel.agent import AgentProfile
from kernel.errors import InvalidInput
from kernel.memory import (
    MemoryItem,
    MemoryKind,
    Provenance,
    Scope,
    Source,
    Trust,
    Visibility,
    ms,
    normal_tags,
)
from kernel.memory_policy import DEFAULT_POLICY, REMEMBER_TOOL, concerns_of, provenance_of
from kernel.memory_rank import fact_text, pack, pool_size, query_text, rerank
from kernel.memory_tools import DAY_MS, MEMORY_TOOL_NAMES, RecallArgs, RememberArgs
from kernel.record import TrajectoryRecord
from kernel.tools import ToolBackend
from store.memory_base import MemoryBank

#: The code of a ``remember_fact`` the memory policy refused (nothing was stored).
REFUSED = "memory_write_refused"
#: ``ranked_by`` of a recall whose embedder failed: the text index's answer alone.
FALLBACK = "text_fallback"

log = logging.getLogger(__name__)


class Embeds(Protocol):
    """What recall needs of an embedder (``worker.providers.embeddings.Embedder``)."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text; raises for any failure."""
        ...


def _embedded(
    embedder: Embeds, text: str, what: str, then: Callable[[list[float]], Any] = list
) -> Any:
    """``then`` of the embedding of ``text``, or None (logged) when the embedder or ``then``
    fails in any way."""
    try:
        return then(embedder.embed([text])[0])
    except Exception as exc:  # faults are normal: the caller falls back to the text index
        code = getattr(exc, "code", type(exc).__name__)
        log.warning("embeddings failed for %s (%s): %s; text index alone", what, code, exc)
        return None


def uses_memory(profile: AgentProfile) -> bool:
    """True when the agent declares a memory tool or keeps episodes."""
    return profile.memory is not None or any(n in profile.catalog for n in MEMORY_TOOL_NAMES)


@dataclass(frozen=True)
class Writing:
    """What one ``remember_fact`` is judged by: the record of the run proposing it (None: not
    known here, so the write is untrusted and concerns the calling user alone), the agent's
    profile, and whether a reviewer approved exactly this call."""

    record: TrajectoryRecord | None
    profile: AgentProfile | None
    approved: bool = False

    def provenance(self, cited: str | None) -> Provenance:
        """The fact's provenance (:class:`InvalidInput` naming ``source`` for a bad citation)."""
        if self.record is None or self.profile is None:
            return Provenance(source=Source.MODEL, trust=Trust.UNTRUSTED)
        return provenance_of(self.record, self.profile.catalog, cited=cited, approved=self.approved)

    def concerns(self, user: str) -> tuple[str, ...]:
        """The users the fact concerns (``user`` at least)."""
        if self.record is None or self.profile is None:
            return (user,)
        return concerns_of(self.record, self.profile.catalog)

    def refusal(self, scope: Scope, provenance: Provenance) -> str | None:
        """Why the agent's policy refuses the write; None when it may be stored."""
        policy = (self.profile.memory if self.profile else None) or DEFAULT_POLICY
        return policy.refusal(scope, provenance)


class MemoryBackend:
    """An agent's tool backend with the memory tools of one trajectory's owners in front:
    ``remember_fact`` and ``recall_facts`` go to ``bank`` under ``tenant``, the calling user and
    ``agent``; every other call and lookup goes to ``inner`` as it was. ``record`` is the run
    whose calls it carries out (:meth:`bound` gives one for another), ``profile`` its agent's."""

    def __init__(
        self,
        inner: ToolBackend,
        bank: MemoryBank,
        tenant: str,
        agent: str,
        clock: Callable[[], float],
        on_recall: Callable[[str, bool], None] | None = None,
        *,
        record: TrajectoryRecord | None = None,
        profile: AgentProfile | None = None,
        embedder: Embeds | None = None,
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        self.inner, self.bank, self.clock = inner, bank, clock
        self.tenant, self.agent = tenant, agent
        self.on_recall = on_recall  # told (tenant, hit) after each recall
        self.record, self.profile = record, profile
        self.embedder = embedder  # None: the text index alone
        self.on_fallback = on_fallback  # told (tenant) when a recall fell back to the text index

    def bound(self, rec: TrajectoryRecord) -> MemoryBackend:
        """The same backend, carrying out the calls of the run ``rec``."""
        return MemoryBackend(
            self.inner,
            self.bank,
            self.tenant,
            self.agent,
            self.clock,
            self.on_recall,
            record=rec,
            profile=self.profile,
            embedder=self.embedder,
            on_fallback=self.on_fallback,
        )

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        """A memory tool against the bank; any other tool through the inner backend."""
        if tool not in MEMORY_TOOL_NAMES:
            return self.inner.call(user, tool, args, key, timeout_s, approval, fence=fence)
        owners = Visibility(self.tenant, user, self.agent)
        writing = Writing(self.record, self.profile, approved=approval is not None)
        result, secs = call(self.bank, owners, tool, args, self.clock(), writing, self.embedder)
        if self.on_recall is not None and result.get("code") == "recalled":
            self.on_recall(self.tenant, bool(result["facts"]))
        if self.on_fallback is not None and result.get("ranked_by") == FALLBACK:
            self.on_fallback(self.tenant)
        return result, secs

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        """The inner backend's lookup (memory tools are re-sent, never looked up)."""
        return self.inner.lookup(tool, key, fence=fence)


def call(
    bank: MemoryBank,
    owners: Visibility,
    tool: str,
    raw: dict[str, Any],
    now_s: float,
    writing: Writing | None = None,
    embedder: Embeds | None = None,
) -> tuple[dict[str, Any], float]:
    """Carry out ``remember_fact`` (judged by ``writing``) or ``recall_facts`` for the caller
    ``owners`` (ranked with ``embedder``'s help when there is one)."""
    now = ms(now_s)
    if tool == REMEMBER_TOOL:
        return remember(bank, owners, RememberArgs.model_validate(raw), now, writing, embedder)
    wanted = RecallArgs.model_validate(raw)
    if embedder is None:
        found = bank.recall(owners, MemoryKind.FACT, wanted.tags, now, wanted.limit)
        return {"status": "ok", "code": "recalled", "facts": _facts(found)}, 0.0
    found, ranked_by = _recall_embedded(bank, owners, wanted, now, embedder)
    answer = {"status": "ok", "code": "recalled", "facts": _facts(found)}
    return {**answer, "ranked_by": ranked_by}, 0.0


def _recall_embedded(
    bank: MemoryBank, owners: Visibility, wanted: RecallArgs, now: int, embedder: Embeds
) -> tuple[list[MemoryItem], str]:
    """The text index's best candidates re-ranked with the query's embedding; the text
    index's own answer when the embedder fails (``text_fallback``)."""
    tags = normal_tags(wanted.tags)
    candidates = bank.recall(owners, MemoryKind.FACT, tags, now, pool_size(wanted.limit))
    if not candidates:
        return [], "embeddings"  # nothing to rank: the embedder is not asked
    vector = _embedded(embedder, query_text(tags, wanted.query), f"a recall of {owners.tenant}")
    if vector is None:
        return candidates[: wanted.limit], FALLBACK
    return rerank(candidates, tags, vector, wanted.limit), "embeddings"


def _facts(found: list[MemoryItem]) -> list[dict[str, Any]]:
    """Recalled facts as the model sees them."""
    return [
        {
            "key": i.key,
            "value": i.value.get("text"),
            "scope": i.scope.value,
            # Remembered context, labelled: a fact that says "approve refunds" is a string from
            # this source, never a rule (seed 000); a write built on it inherits its trust.
            "source": (i.provenance.source if i.provenance else Source.MODEL).value,
            "trust": (i.provenance.trust if i.provenance else Trust.UNTRUSTED).value,
        }
        for i in found
    ]


def remember(
    bank: MemoryBank,
    owners: Visibility,
    args: RememberArgs,
    now: int,
    writing: Writing | None,
    embedder: Embeds | None = None,
) -> tuple[dict[str, Any], float]:
    """Store one fact if the policy lets its source write its scope; else answer why not.
    With ``embedder``, the fact is stored with its embedding (without, if the embedder fails)."""
    writing = writing or Writing(None, None)
    owner = owners.owner(Scope(args.scope))
    try:
        provenance = writing.provenance(args.source)
        concerns = writing.concerns(owners.user)
    except InvalidInput as exc:
        return {"status": "error", "code": REFUSED, "key": args.key, "reason": str(exc)}, 0.0
    why = writing.refusal(owner.scope, provenance)
    if why is not None:
        return {"status": "error", "code": REFUSED, "key": args.key, "reason": why}, 0.0
    packed = None
    if embedder is not None:
        text = fact_text(args.key, args.value, normal_tags(args.tags))
        packed = _embedded(embedder, text, f"a fact of {owner.tenant}", pack)
    bank.put(
        MemoryItem(
            kind=MemoryKind.FACT,
            tenant=owner.tenant,
            scope=owner.scope,
            subject=owner.subject,
            key=args.key,
            value={"text": args.value},
            tags=args.tags,
            written_ms=now,
            expires_ms=now + args.ttl_days * DAY_MS,
            concerns=concerns,
            trajectory_id=writing.record.trajectory_id if writing.record else None,
            provenance=provenance,
            embedding=packed,
        )
    )
    answer = {"status": "ok", "code": "remembered", "key": args.key}
    return {**answer, "source": provenance.source.value, "trust": provenance.trust.value}, 0.0
