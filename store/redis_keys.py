"""The Redis store's key layout: every key a commit writes in one hash slot.

``P`` is the key prefix; ``T``, ``I`` and ``K`` are the tenant, the trajectory id and an
idempotency key, each percent-encoded (all but ``A-Z a-z 0-9 _ . - ~``), so no part holds
``:``, ``#``, ``{`` or ``}`` and the layout is injective. ``b`` is the trajectory's bucket,
:func:`bucket_of` its id (0 to :data:`INDEX_BUCKETS` - 1):

==========================  =====  ============================================================
``{P:T:#b}:snap:I``         hash   ``v`` (version), ``s`` (state code), ``data`` (the record's
                                   JSON), ``c<version>`` -> commit id for the last
                                   :data:`COMMITS_KEPT` versions
``{P:T:#b}:chain:I``        list   execution chain rows (JSON); element n is chain index n
``{P:T:#b}:index``          zset   the bucket's trajectory ids, scored by state code
``{P:T:#b}:owing``          zset   the bucket's ended runs that still owe (score 0: id order)
``{P:T:K}:idem``            string the idempotency ledger's stored result (JSON)
``{P}:layout``              string :data:`LAYOUT`, the layout these keys follow
==========================  =====  ============================================================

A trajectory's keys and its bucket's index and owing set share the tag ``{P:T:#b}``, so one
script commits all four on one node of a cluster. Why buckets, and how many:
``docs/adr/0170-store-on-redis-cluster.md``.
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import quote, unquote

#: How many buckets a tenant's index (and owing set) is split into. Fixed: a trajectory's
#: bucket must follow from its id alone for as long as the trajectory is stored, so changing
#: it is a migration. 16 spreads one tenant's index over 16 slots (so over every node of a
#: cluster of up to 16 masters), and a listing that merges them is 16 reads in one round trip.
INDEX_BUCKETS = 16

#: How many of the latest versions keep their commit id in the snapshot hash: enough to
#: recognise the repeat of a commit whose reply was lost, which is always the latest version
#: or one just behind it (a writer resends before it commits anything newer); 8 leaves room
#: for a few commits by other writers in between, and keeps the hash from growing with the
#: versions.
COMMITS_KEPT = 8

#: The key layout this build writes (1 was ``{P:T:I}:snap`` with one ``{P:T}:index``).
LAYOUT = "2"

SNAP = ":snap:"
CHAIN = ":chain:"


@lru_cache(maxsize=65536)
def enc(part: str) -> str:
    """A key part percent-encoded: no ``:``, ``#``, ``{``, ``}`` or glob character in it."""
    return quote(part, safe="")


def bucket_of(trajectory_id: str) -> int:
    """The trajectory's index bucket: CRC-32 of its id, stable across processes and builds."""
    return zlib.crc32(trajectory_id.encode()) % INDEX_BUCKETS


def bucket_tag(prefix: str, tenant: str, bucket: int) -> str:
    """The hash tag of one bucket of ``tenant``, shared by its trajectories' keys."""
    return f"{{{prefix}:{enc(tenant)}:#{bucket}}}"


class CommitKeys(NamedTuple):
    """The keys a commit of one trajectory writes, all in one slot."""

    snapshot: str
    chain: str
    index_bucket: str
    owing_bucket: str


@lru_cache(maxsize=65536)
def commit_keys(prefix: str, tenant: str, trajectory_id: str) -> CommitKeys:
    """Snapshot, chain, index-bucket and owing-bucket keys of one trajectory (one slot)."""
    tag = bucket_tag(prefix, tenant, bucket_of(trajectory_id))
    tid = enc(trajectory_id)
    return CommitKeys(f"{tag}{SNAP}{tid}", f"{tag}{CHAIN}{tid}", f"{tag}:index", f"{tag}:owing")


@lru_cache(maxsize=4096)
def index_keys(prefix: str, tenant: str) -> tuple[str, ...]:
    """Every index bucket of ``tenant``, in bucket order."""
    return tuple(f"{bucket_tag(prefix, tenant, b)}:index" for b in range(INDEX_BUCKETS))


@lru_cache(maxsize=4096)
def owing_keys(prefix: str, tenant: str) -> tuple[str, ...]:
    """Every owing bucket of ``tenant``, in bucket order."""
    return tuple(f"{bucket_tag(prefix, tenant, b)}:owing" for b in range(INDEX_BUCKETS))


def snapshot_pattern(prefix: str, tenant: str) -> str:
    """A ``SCAN MATCH`` pattern for every snapshot key of ``tenant``."""
    return f"{{{prefix}:{enc(tenant)}:#*}}{SNAP}*"


def trajectory_of_snapshot(key: str) -> str:
    """The trajectory id a snapshot key names."""
    return unquote(key.rpartition(SNAP)[2])


def layout_key(prefix: str) -> str:
    """Where the layout marker lives."""
    return f"{{{prefix}}}:layout"
