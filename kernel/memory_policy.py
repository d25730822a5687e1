"""Who may write memory: an agent's memory policy, a fact's provenance, and whom an item concerns.

Seed 000's write policy and seed 001 section 4, as pure functions of the trajectory's record:

* :func:`provenance_of` says where a proposed fact comes from and whether it is trusted. Trust
  is never taken from the model: a write is untrusted once any tool result its run had read
  came from a tool that does not declare ``trusted_output`` (a ticket's body, a page, an
  e-mail), or recalled an untrusted fact, whatever the model cites. The model may cite the
  goal or one tool result; that names the source, it never raises the trust. A reviewer who
  approved exactly this write vouches for it.
* :class:`MemoryPolicy` says which sources may write which scope, and which scopes take
  untrusted content (by default only the user's own: the model may not write tenant- or
  agent-wide facts from untrusted tool content). A refused write is answered to the model and
  not stored.
* :func:`concerns_of` names the users an item concerns: the trajectory's user and every user
  the run's tool results name in the fields their tools declare (``names_users``). Both are
  conservative: they count every result the run had read, seen by the model or not.

Design: ``docs/adr/0142-memory-governance.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import ConfigError, InvalidInput
from kernel.memory import Provenance, Scope, Source, Trust, normal_names
from kernel.record import Operation, OpKind, TrajectoryRecord
from kernel.tools import Catalog

#: The memory tools, by name (``kernel.memory_tools`` declares them under these names).
REMEMBER_TOOL, RECALL_TOOL = "remember_fact", "recall_facts"
#: What ``remember_fact``'s ``source`` names when the fact comes from the goal.
GOAL = "goal"


def _scopes(names: Iterable[Any], where: str) -> frozenset[Scope]:
    out = set()
    for name in names:
        try:
            out.add(Scope(name))
        except ValueError:
            known = ", ".join(s.value for s in Scope)
            raise ConfigError(
                f"{where}: unknown scope {name!r}; known: {known}", field=where
            ) from None
    return frozenset(out)


def _sources(names: Iterable[Any], where: str) -> frozenset[Source]:
    if isinstance(names, str):
        names = [names]
    out = set()
    for name in names:
        try:
            out.add(Source(name))
        except ValueError:
            known = ", ".join(s.value for s in Source)
            raise ConfigError(
                f"{where}: unknown source {name!r}; known: {known}", field=where
            ) from None
    return frozenset(out)


@dataclass(frozen=True)
class MemoryPolicy:
    """What an agent keeps across runs and who may write it.

    ``episodes``: every ended run leaves an episode, filed under its user unless
    ``episodes_per_user`` is False (then under the agent, for every user of the tenant);
    ``recall_episodes``: how many the first view shows. ``writes``: for each scope, the
    sources that may write its facts (a scope left out: every source); ``untrusted_writes``:
    the scopes untrusted content may write. Unknown scopes or sources are refused when the
    policy is built, that is when the agent is loaded, naming them.
    """

    episodes: bool = True
    episodes_per_user: bool = True
    recall_episodes: int = 0
    writes: Mapping[str, Iterable[str]] | None = field(default=None, hash=False, compare=False)
    untrusted_writes: Iterable[str] = field(default=(Scope.USER,), hash=False, compare=False)
    _writers: Mapping[Scope, frozenset[Source]] = field(
        init=False, repr=False, hash=False, compare=False
    )
    _untrusted: frozenset[Scope] = field(init=False, repr=False, hash=False, compare=False)

    def __post_init__(self) -> None:
        every = frozenset(Source)
        writers = dict.fromkeys(Scope, every)
        if self.writes is not None:
            if not isinstance(self.writes, Mapping):
                raise ConfigError("memory.writes: must map scopes to sources", field="writes")
            for scope in _scopes(self.writes, "memory.writes"):
                writers[scope] = _sources(self.writes[scope.value], f"memory.writes.{scope}")
        untrusted = self.untrusted_writes
        if isinstance(untrusted, str):
            untrusted = [untrusted]
        object.__setattr__(self, "_writers", writers)
        object.__setattr__(self, "_untrusted", _scopes(untrusted, "memory.untrusted_writes"))

    def refusal(self, scope: Scope, provenance: Provenance) -> str | None:
        """Why a fact of ``provenance`` may not be written at ``scope``; None when it may."""
        if provenance.source not in self._writers[scope]:
            return f"the memory policy lets no {provenance.source.value} write {scope.value} facts"
        if provenance.trust is Trust.UNTRUSTED and scope not in self._untrusted:
            calls = ", ".join(provenance.call_ids) or "unknown"
            return (
                f"untrusted content (tool results {calls}) may not write {scope.value} facts "
                "under the memory policy"
            )
        return None


#: The policy of an agent that declares the memory tools but no ``MemoryPolicy``.
DEFAULT_POLICY = MemoryPolicy(episodes=False)


def read_results(rec: TrajectoryRecord) -> list[Operation]:
    """The tool results the run has read, in call order (the memory writes' own answers
    excepted: they carry no content)."""
    return [
        op
        for op in rec.operations.values()
        if op.kind is OpKind.TOOL and op.evidence is not None and op.tool != REMEMBER_TOOL
    ]


def output_trust(op: Operation, catalog: Catalog) -> Trust:
    """The trust of one result: a recall's is its facts' (one untrusted fact makes it
    untrusted); any other tool's is what its declaration says (untrusted unless it declares
    ``trusted_output``, as does an unknown tool)."""
    evidence = op.evidence or {}
    if op.tool == RECALL_TOOL:
        facts = evidence.get("facts")
        if not isinstance(facts, list):
            return Trust.TRUSTED
        clean = all(isinstance(f, dict) and f.get("trust") == Trust.TRUSTED for f in facts)
        return Trust.TRUSTED if clean else Trust.UNTRUSTED
    spec = catalog.get(op.tool or "")
    return Trust.TRUSTED if spec is not None and spec.trusted_output else Trust.UNTRUSTED


def provenance_of(
    rec: TrajectoryRecord, catalog: Catalog, *, cited: str | None, approved: bool
) -> Provenance:
    """The provenance of a fact the model proposes now in ``rec``'s run.

    ``cited``: what the model names as its source, ``"goal"`` or a call id of this run's tool
    results (anything else is refused with :class:`InvalidInput` naming ``source``);
    ``approved``: a reviewer approved exactly this write.
    """
    read = read_results(rec)
    cited_call: str | None = None
    if cited is not None and cited != GOAL:
        if cited not in {op.call_id for op in read}:
            raise InvalidInput(
                f"source: {cited!r} is neither {GOAL!r} nor a tool result this run has read",
                field="source",
            )
        cited_call = cited
    tainted = {op.call_id for op in read if output_trust(op, catalog) is Trust.UNTRUSTED}
    calls = tuple(sorted(tainted | ({cited_call} if cited_call else set())))
    if approved:
        return Provenance(source=Source.REVIEWER, trust=Trust.TRUSTED, call_ids=calls)
    if tainted:
        return Provenance(source=Source.TOOL_RESULT, trust=Trust.UNTRUSTED, call_ids=calls)
    if cited_call is not None:
        return Provenance(source=Source.TOOL_RESULT, trust=Trust.TRUSTED, call_ids=calls)
    source = Source.GOAL if cited == GOAL else Source.MODEL
    return Provenance(source=source, trust=Trust.TRUSTED)


def _named(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str) and v]
    return []


def concerns_of(rec: TrajectoryRecord, catalog: Catalog) -> tuple[str, ...]:
    """The users an item written now in ``rec``'s run concerns: its user, and every user a
    result it has read names in a field its tool declares in ``names_users``. More than
    :data:`kernel.memory.MAX_CONCERNS` is refused (:class:`InvalidInput`), never cut short."""
    users = {rec.user}
    for op in read_results(rec):
        spec = catalog.get(op.tool or "")
        if spec is None or not spec.names_users:
            continue
        evidence = op.evidence or {}
        for name in spec.names_users:
            users.update(_named(evidence.get(name)))
    return normal_names(users, "concerns")
