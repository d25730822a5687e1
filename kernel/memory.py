"""Semantic and episodic memory: items, their owners, who may see them, and how recall ranks.

Every item belongs to exactly one owner: a scope (user, tenant or agent) and the subject
within the tenant that the scope names. The owner is derived from the trajectory (its tenant,
user and agent), never from anything the model wrote. A caller's :class:`Visibility` names the
three owners it may read; recall keeps only their items *before* it ranks anything (seed 001
section 4.3), so a query cannot even see another owner's rows. Ranking is tag overlap, then
recency, then the item id; items that share no tag with the query are dropped (section 4.4).

An item also records whom it is about (``concerns``, which an erasure finds it by, whatever its
owner) and, for a fact, its :class:`Provenance` (``kernel.memory_policy`` decides it).

:func:`recall` is the reference: the plain scan every backend in ``store/`` must agree with
(the contract suite checks each against it). Design: ``docs/adr/0140-memory-tiers.md``,
``docs/adr/0142-memory-governance.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kernel.errors import InvalidInput
from kernel.progress import digest

MAX_TAGS = 32  # per item and per query: keeps a ranking score an exact integer in Redis
MAX_TAG_CHARS = 64
MAX_KEY_CHARS = 200
MAX_NAME_CHARS = 200  # a user's or a call's name, as items record them
MAX_CONCERNS = 256  # users one item may concern; a write naming more is refused, never cut
MAX_EMBEDDING_CHARS = 65_536  # a packed vector: 12,288 float32 dimensions at most


class Scope(StrEnum):
    """Whose an item is: the trajectory's user, its whole tenant, or its agent (the app)."""

    USER = "user"
    TENANT = "tenant"
    AGENT = "agent"


class MemoryKind(StrEnum):
    """A durable fact (semantic memory) or a record of an attempt (episodic memory)."""

    FACT = "fact"
    EPISODE = "episode"


class Source(StrEnum):
    """Where a fact came from: a tool's result, the user's goal, a reviewer who approved
    the write, or the model's own text."""

    TOOL_RESULT = "tool_result"
    GOAL = "goal"
    REVIEWER = "reviewer"
    MODEL = "model"


class Trust(StrEnum):
    """Whether a fact may carry someone else's words: untrusted once anything that shaped it
    came from content neither the user nor the system wrote (seed 000, the write policy)."""

    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"


class Provenance(BaseModel):
    """A fact's source and trust, and the tool calls whose results it may derive from (the
    cited one, and every untrusted one its writer had read), so that what one source wrote
    can be found and removed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Source
    trust: Trust
    call_ids: tuple[str, ...] = ()

    @field_validator("call_ids", mode="before")
    @classmethod
    def _calls(cls, calls: Any) -> tuple[str, ...]:
        return normal_names(calls, "call_ids")


@dataclass(frozen=True)
class Owner:
    """One partition of memory: a tenant, a scope, and the subject the scope names."""

    tenant: str
    scope: Scope
    subject: str  # the user for USER, the agent for AGENT, "" for TENANT

    @property
    def token(self) -> str:
        """A stable opaque name of this owner (keys and index terms; never ``hash()``)."""
        return "o" + digest([self.tenant, self.scope.value, self.subject], size=20)


@dataclass(frozen=True)
class Visibility:
    """What one caller may read: its user's, its tenant's and its agent's items, nothing else."""

    tenant: str
    user: str
    agent: str

    def owner(self, scope: Scope) -> Owner:
        """The one owner of ``scope`` this caller sees."""
        subject = {Scope.USER: self.user, Scope.TENANT: "", Scope.AGENT: self.agent}[scope]
        return Owner(self.tenant, scope, subject)

    def owners(self) -> tuple[Owner, ...]:
        """Every owner this caller sees, one per scope."""
        return tuple(self.owner(s) for s in Scope)

    def sees(self, item: MemoryItem) -> bool:
        """True when ``item`` belongs to an owner this caller sees: the retrieval predicate."""
        return item.owner == self.owner(item.scope)


def normal_tags(tags: Iterable[Any], what: str = "tags") -> tuple[str, ...]:
    """Tags as recall compares them: stripped, lower case, distinct, sorted; refuses a list
    that is too long or holds a tag that is empty, too long or not text."""
    out: set[str] = set()
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip() or len(tag) > MAX_TAG_CHARS:
            raise InvalidInput(f"{what}: {tag!r} is not a tag (1..{MAX_TAG_CHARS} characters)")
        out.add(tag.strip().lower())
    if len(out) > MAX_TAGS:
        raise InvalidInput(f"{what}: {len(out)} tags, at most {MAX_TAGS}")
    return tuple(sorted(out))


def normal_names(names: Any, what: str, most: int = MAX_CONCERNS) -> tuple[str, ...]:
    """Users' or calls' names as items record them: distinct and sorted; refuses a name that
    is empty, too long or not text, and more than ``most`` of them."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise InvalidInput(f"{what}: {names!r} is not a list of names", field=what)
    out = set()
    for name in names:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise InvalidInput(f"{what}: {name!r} is not a name (1..{MAX_NAME_CHARS})", field=what)
        out.add(name)
    if len(out) > most:
        raise InvalidInput(f"{what}: {len(out)} names, at most {most}", field=what)
    return tuple(sorted(out))


def name_token(name: str) -> str:
    """The opaque key part of one user's or call's name (bounded, and no character of a name
    can reach a key's hash tag)."""
    return "n" + digest(name, size=20)


def tag_token(tag: str) -> str:
    """The opaque index term of one normalised tag (no tokenizer rule can split it)."""
    return "t" + digest(tag, size=20)


class MemoryItem(BaseModel):
    """A fact or an episode, as stored: its owner, key, value, tags, write time and expiry;
    the users it concerns, the run that wrote it and, for a fact, its provenance.

    Times are integer milliseconds (the clock is the caller's), so every backend ranks by the
    same exact recency. ``concerns`` is what an erasure finds an item by, whatever its owner:
    the trajectory's user and every user the tool results it was built from name. An item
    written before items recorded it has none, and is found by its owner alone.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: MemoryKind
    tenant: str = Field(min_length=1)
    scope: Scope
    subject: str
    key: str = Field(min_length=1, max_length=MAX_KEY_CHARS)
    value: dict[str, Any]
    tags: tuple[str, ...] = ()
    written_ms: int = Field(ge=0)
    expires_ms: int | None = None
    concerns: tuple[str, ...] = ()
    trajectory_id: str | None = None
    provenance: Provenance | None = None  # None: written by reins itself (an episode)
    # The fact's embedding (``kernel.memory_rank.pack``), when an embedder was configured at
    # write time; it lives and dies with the item, so an erasure erases it too.
    embedding: str | None = Field(
        None, max_length=MAX_EMBEDDING_CHARS, exclude_if=lambda v: v is None
    )

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, tags: Any) -> tuple[str, ...]:
        return normal_tags(tags if isinstance(tags, list | tuple) else [tags])

    @field_validator("concerns", mode="before")
    @classmethod
    def _concerns(cls, users: Any) -> tuple[str, ...]:
        return normal_names(users, "concerns")

    def concerns_user(self, user: str) -> bool:
        """True when an erasure of ``user`` must take this item: it concerns them, or it is
        theirs (an item that predates ``concerns``)."""
        return user in self.concerns or (self.scope is Scope.USER and self.subject == user)

    @property
    def call_ids(self) -> tuple[str, ...]:
        """The tool calls this item may derive from (none for an episode)."""
        return () if self.provenance is None else self.provenance.call_ids

    @property
    def owner(self) -> Owner:
        """The partition this item belongs to."""
        return Owner(self.tenant, self.scope, self.subject)

    @property
    def item_id(self) -> str:
        """A stable id of (kind, owner, key): writing the same key again replaces the item."""
        return digest([self.kind.value, self.tenant, self.scope.value, self.subject, self.key])

    def live(self, now_ms: int) -> bool:
        """False once the item's expiry has passed."""
        return self.expires_ms is None or self.expires_ms > now_ms


def ms(seconds: float) -> int:
    """A clock reading in seconds as the integer milliseconds memory stores."""
    return math.floor(seconds * 1000)


def rank_key(item: MemoryItem, overlap: int) -> tuple[int, int, str]:
    """The order of recall, highest first: tag overlap, then recency, then the id."""
    return (overlap, item.written_ms, item.item_id)


def recall(
    items: Iterable[MemoryItem],
    visibility: Visibility,
    kind: MemoryKind,
    tags: Iterable[str],
    now_ms: int,
    limit: int,
) -> list[MemoryItem]:
    """The reference recall: visible, live items of ``kind`` sharing a tag with the query,
    best first (a plain scan; backends must return exactly this)."""
    wanted = set(normal_tags(tags))
    visible = [i for i in items if i.kind is kind and visibility.sees(i) and i.live(now_ms)]
    scored = [(len(wanted.intersection(i.tags)), i) for i in visible]
    ranked = sorted(
        ((n, i) for n, i in scored if n > 0), key=lambda s: rank_key(s[1], s[0]), reverse=True
    )
    return [i for _, i in ranked[:limit]]
