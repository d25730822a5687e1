"""The direct Redis paths: commands and batches sent on a connection each thread keeps,
without redis-py's layers around every call (its retry wrapper, argument checks, event
dispatch, telemetry and the pool's checkout). The store, the admitter's scripts, the feed and
the custody writes take them on the hot path of a turn; retries stay the callers' own
(:data:`store.redis_client.TRANSIENT`). A client of another kind (pinned to one connection, a
cluster's for batches) keeps its own paths.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.connection import Connection, HiredisRespSerializer
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.sentinel import SentinelConnectionPool

from store.redis_client import Batch


class _Forks:
    """How many times this process was forked into the one running: a child's pinned
    connections are its parent's sockets, so it takes its own. Counted by a fork hook, not
    by ``os.getpid()`` on every call (a system call per Redis call)."""

    def __init__(self) -> None:
        self.count = 0
        self._hooked = False
        self._lock = threading.Lock()

    def watch(self) -> None:
        """Count forks from now on (the hook is installed once per process)."""
        with self._lock:
            if not self._hooked:
                os.register_at_fork(after_in_child=self._forked)
                self._hooked = True

    def _forked(self) -> None:
        self.count += 1


_FORKS = _Forks()
log = logging.getLogger("reins.store")


#: How often a process asks its Sentinels where the master is, for its pinned connections.
FOLLOW_S = 0.25


class _Master:
    """Where a Sentinel pool's master is: asked of the Sentinels at most every
    :data:`FOLLOW_S`, by one thread at a time (the others go on with the last answer).

    A connection pinned to a master the Sentinels replaced is never given back to the pool,
    which would see it then; and after ``SENTINEL FAILOVER`` the old master takes writes
    until the Sentinels turn it into a replica, seconds later, which drops them. Asking is
    what moves the pinned connections within a fraction of a second of the Sentinels'
    switch. No Sentinel answering keeps the last address."""

    def __init__(self, pool: SentinelConnectionPool) -> None:
        self._pool = pool
        self._asked = time.monotonic()
        self._asking = threading.Lock()
        self._named: Any = None  # the master the last answer named

    def replaced(self, conn: Any) -> bool:
        """Whether ``conn`` talks to a master the Sentinels no longer name."""
        now = time.monotonic()
        if now - self._asked >= FOLLOW_S and self._asking.acquire(blocking=False):
            try:
                self._asked = now
                named = self._pool.get_master_address()  # type: ignore[no-untyped-call]
                if named != self._named:  # also dropped the pool's idle connections
                    if self._named is not None:
                        log.warning("the Sentinels name a new master %s: connections move", named)
                    self._named = named
            except RedisError:
                pass  # no Sentinel answered, or none names a master: keep the last one
            finally:
                self._asking.release()
        address = self._pool.master_address
        return address is not None and (conn.host, conn.port) != address


class _Pinned:
    """One connection per thread, taken from a client's pool once and kept for the thread's
    later direct calls; given back only when it is spent (an error that may leave a reply
    unread). The pool's own checkout, around every call, costs about as much client CPU as
    the call itself (a lock, two telemetry records, a readiness poll): measured 50-64 us
    a call against 28 us pinned (docs/adr/0014-redis-store.md, "Connections").

    A connection that the server closed while idle fails its next call with a connection
    error, which the caller's retries treat as any transient error: the retry takes a fresh
    connection. On a Sentinel's pool, a connection to a master the Sentinels replaced is
    spent at its next call (:class:`_Master`), and the call takes one to the new master."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._local = threading.local()
        follow = isinstance(pool, SentinelConnectionPool) and pool.is_master
        self._master = _Master(pool) if follow else None
        _FORKS.watch()

    def get(self) -> Any:
        local = self._local
        conn = getattr(local, "conn", None)
        master = self._master
        if conn is not None and local.forks == _FORKS.count and master and master.replaced(conn):
            self.spend(conn)
            conn = None
        if conn is None or local.forks != _FORKS.count:  # a forked child never reuses a socket
            conn = local.conn = self._pool.get_connection()
            local.pack = _packer(conn)
            local.forks = _FORKS.count
        return conn

    def send(self, conn: Any, commands: Sequence[tuple[Any, ...]]) -> None:
        """Write ``commands`` on ``conn`` (this thread's, from :meth:`get`) in one write."""
        pack = self._local.pack
        if pack is None:  # a connection of its own kind: its own packing and sending
            if len(commands) == 1:
                conn.send_command(*commands[0])
            else:
                conn.send_packed_command(conn.pack_commands(commands))
        elif len(commands) == 1:
            conn.send_packed_command([pack(commands[0])])
        else:
            conn.send_packed_command([b"".join([pack(c) for c in commands])])

    def spend(self, conn: Any) -> None:
        """Disconnect ``conn`` (replies may still be on their way) and give it back."""
        self._local.conn = None
        try:
            conn.disconnect()
        finally:
            self._pool.release(conn)


def _packer(conn: Any) -> Callable[[tuple[Any, ...]], bytes] | None:
    """hiredis's own packer for a plain connection that would call it (redis-py's wrapper
    copies and re-checks every argument in Python first, for argument types the direct paths
    never send), or None: a connection of another kind packs and sends its own way."""
    plain = type(conn).send_command is Connection.send_command
    if plain and isinstance(getattr(conn, "_command_packer", None), HiredisRespSerializer):
        return cast(Callable[[tuple[Any, ...]], bytes], hiredis.pack_command)
    return None


_PINNED_LOCK = threading.Lock()


def _pinned(pool: Any) -> _Pinned:
    """The pool's :class:`_Pinned`, made on first use (one per pool, kept on the pool)."""
    pinned: _Pinned | None = getattr(pool, "_reins_pinned", None)
    if pinned is None:
        with _PINNED_LOCK:
            pinned = getattr(pool, "_reins_pinned", None)
            if pinned is None:
                pinned = _Pinned(pool)
                pool._reins_pinned = pinned
    return pinned


def direct_command(client: redis.Redis) -> Callable[..., Any]:
    """``client.execute_command`` for commands whose reply needs no conversion (``EVALSHA``,
    ``HMGET``), without redis-py's layers around each call: the thread's own connection
    (:class:`_Pinned`), the command, its reply. What those layers add per call (its retry
    wrapper, argument checks, event dispatch, telemetry hooks, the pool's checkout) showed as
    about a third of a fleet turn's time in Redis calls; retries are the store's own
    (:data:`TRANSIENT`). A client pinned to one connection, or of another kind, keeps its own
    ``execute_command``; a cluster client gets :func:`_cluster_direct`.
    """
    if isinstance(client, RedisCluster):
        return _cluster_direct(client)
    pool = getattr(client, "connection_pool", None)
    if type(client) is not redis.Redis or pool is None or client.connection is not None:
        return client.execute_command
    pinned = _pinned(pool)

    def execute(*args: Any) -> Any:
        conn = pinned.get()
        try:
            pinned.send(conn, (args,))
            return conn.read_response()
        except ResponseError:
            raise  # an error reply: read in full, the connection stays good
        except BaseException:
            pinned.spend(conn)
            raise

    return execute


#: Replies that say the slot map is stale or the cluster is in flux: the cluster client's own
#: path follows them (and refreshes its map).
_REROUTE = (MovedError, AskError, TryAgainError, ClusterDownError, SlotNotCoveredError)


def _cluster_direct(client: RedisCluster) -> Callable[..., Any]:
    """:func:`direct_command` for a cluster: the command goes straight to the pooled connection
    of the master that serves its key's slot (the first key: ``args[1]``, or ``args[3]`` of an
    ``EVALSHA`` with keys), as on one node. A redirection, or a command with no key, goes
    through the cluster client, which follows it and refreshes its slot map; so does the next
    command after a connection error (the map may name a master that is gone)."""
    cluster: Any = client  # redis-py leaves the cluster's routing methods untyped
    slow: Callable[..., Any] = cluster.execute_command
    stale = [False]

    def execute(*args: Any) -> Any:
        name = str(args[0]).upper()
        if name in ("EVALSHA", "EVAL"):
            key = args[3] if len(args) > 3 and int(args[2]) > 0 else None
        else:
            key = args[1] if len(args) > 1 else None
        if key is None or stale[0]:
            reply = slow(*args)
            stale[0] = False
            return reply
        try:
            node = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key))
        except SlotNotCoveredError:
            return slow(*args)
        pool = cluster.get_redis_connection(node).connection_pool
        conn: Any = pool.get_connection()
        try:
            conn.send_command(*args)
            return conn.read_response()
        except _REROUTE:
            pass
        except BaseException as exc:
            if not isinstance(exc, ResponseError):  # a reply may still be on its way: drop it
                conn.disconnect()
                stale[0] = True
            raise
        finally:
            pool.release(conn)
        return slow(*args)

    return execute


class DirectBatch:
    """Commands sent together on one pooled connection and their replies read in order, as
    ``client.pipeline(transaction=False)`` does, without its machinery; for commands whose
    reply needs no conversion (``RPUSH``, ``LPUSH``, ``HSET``, ``SADD``, ``EVALSHA``). The
    worker's notice and the router's custody and turn messages go this way, once per turn.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pinned = _pinned(client.connection_pool)
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> DirectBatch:
        """Queue one command."""
        self.commands.append(args)
        return self

    def rpush(self, key: str, *values: Any) -> DirectBatch:
        return self.execute_command("RPUSH", key, *values)

    def lpush(self, key: str, *values: Any) -> DirectBatch:
        return self.execute_command("LPUSH", key, *values)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send what is queued, in one write; the replies in order. An error reply is raised
        (the first), or with ``raise_on_error=False`` returned in its place."""
        commands, self.commands = self.commands, []
        if not commands:
            return []
        conn = self._pinned.get()
        replies: list[Any] = []
        try:
            self._pinned.send(conn, commands)
            for _ in commands:
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            self._pinned.spend(conn)  # replies may still be on their way: this one is spent
            raise
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies


def direct_batch(client: redis.Redis) -> Batch:
    """A :class:`DirectBatch` on ``client``, or its own pipeline (no transaction) for a client
    pinned to one connection or of another kind."""
    if type(client) is not redis.Redis or client.connection is not None:
        return client.pipeline(transaction=False)
    return DirectBatch(client)
