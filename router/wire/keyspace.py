"""Where the fleet's shared state lives in Redis, and which keys share a slot of a cluster.

Redis Cluster runs a script, a ``MULTI`` or a multi-key command only over keys of one hash
slot, and a batch of commands (a pipeline without a transaction) keeps its order only among the
keys of one node. So keys that a script, a transaction or an ordered batch uses together carry
one hash tag (the part in braces) under the key prefix ``P``:

==================  ===============================================================================
``{P:adm}``         the admitter and the provider gates (``lua/state.lua``, ``lua/gates.lua``):
                    every pick, claim and debit is one script over this slot
``{P:fleet}``       the feed (notices, hand-backs, dead letters; :mod:`router.wire.feed`),
                    custody (:mod:`router.wire.custody`), the admission and start figures, the
                    recoveries and the admitter's leadership: a worker pushes a turn's notice and
                    then releases its custody in one ordered batch, and a poison entry's dead
                    letter goes before its acknowledgement
``P:ring:*``        membership (one hash each; every script and transaction touches one key)
``P:fleet:config``  the fleet's document (one hash, written in one ``MULTI``)
==================  ===============================================================================

The store's keys (one tag per trajectory, the tenants' index buckets) are the store's own
(:mod:`store.redis_store`). Each tag is one slot, so one node carries it: the admitter's and
the feed's throughput do not grow with the cluster (``docs/adr/0175-cluster-slots.md``).
"""

from __future__ import annotations

from kernel.errors import ConfigError


def checked_prefix(prefix: str) -> str:
    """``prefix`` if it can name keys under a hash tag: non-empty, no braces, no spaces."""
    if not prefix or any(c in prefix for c in "{} "):
        raise ConfigError(f"REINS_KEY_PREFIX: {prefix!r} must be non-empty, without braces")
    return prefix


def fleet_tag(prefix: str) -> str:
    """``{P:fleet}``: the hash tag of the feed, custody and the fleet's figures."""
    return f"{{{checked_prefix(prefix)}:fleet}}"


def pre_cluster_streams(prefix: str) -> tuple[str, str]:
    """The notice and hand-back streams of the builds before the tag (``P:fleet:notices``,
    ``P:fleet:handbacks``): routers move what older workers still append there."""
    return f"{prefix}:fleet:notices", f"{prefix}:fleet:handbacks"
