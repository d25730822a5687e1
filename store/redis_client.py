"""Talking to Redis: clients, batches of commands, script replies, transient retries, text.

Shared by the store and every Redis user above it (the admitter, the gates, the feed, the
membership, the broker's publisher). Retries are reins's own: clients are built with
redis-py's retries off, and :func:`retry_transient` repeats only what is safe to repeat.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import SplitResult, unquote, urlsplit

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection, HiredisRespSerializer
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from kernel.errors import ConfigError, StoreError, StoreUnavailable
from kernel.settings import Settings

TRANSIENT = (RedisConnectionError, RedisTimeoutError)
_T = TypeVar("_T")


class ErrorCount:
    """A count that threads add to; read whenever (metrics read it at each scrape)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self) -> None:
        with self._lock:
            self.value += 1


#: Transient Redis errors (a connection or reply timeout, a refused connection) this process
#: met in :func:`retry_transient`, each failed attempt once.
REDIS_ERRORS = ErrorCount()


def retry_transient(fn: Callable[[], _T], *, what: str, attempts: int, counted: int) -> _T:
    """Run ``fn``, retrying transient Redis errors up to ``attempts`` times with jittered
    backoff; then raise :class:`StoreUnavailable` (saying ``counted`` attempts were made), and
    turn any other Redis error into :class:`StoreError`. Callers retry only what is safe to
    repeat (reads, and scripts that recognise their own repeat).

    The first attempt runs bare: building the retry machinery costs more than a round trip,
    and only a failure needs it."""
    try:
        try:
            return fn()
        except TRANSIENT:
            REDIS_ERRORS.add()
            if attempts <= 1:
                raise

        def counted_fn() -> _T:
            try:
                return fn()
            except TRANSIENT:
                REDIS_ERRORS.add()
                raise

        retrying = Retrying(
            stop=stop_after_attempt(attempts - 1),
            wait=wait_exponential_jitter(multiplier=0.005, max=0.5, jitter=0.005),
            retry=retry_if_exception_type(TRANSIENT),
            reraise=True,
        )
        return retrying(counted_fn)
    except TRANSIENT as exc:
        raise StoreUnavailable(
            f"{what}: Redis unreachable after {counted} attempts ({exc})"
        ) from exc
    except RedisError as exc:
        raise StoreError(f"{what}: {exc}") from exc


def text(value: object) -> str:
    """A reply element as text (a bytes reply decoded, anything else as ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Batch(Protocol):
    """Commands queued and sent together, their replies read in order: redis-py's pipeline
    (no transaction) or a :class:`DirectBatch`. Writers that take ``pipeline=`` queue their
    commands on it; the caller executes it."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Queue one command."""
        ...

    def rpush(self, key: str, /, *values: Any) -> Any:
        """Queue an ``RPUSH``."""
        ...

    def lpush(self, key: str, /, *values: Any) -> Any:
        """Queue an ``LPUSH``."""
        ...

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send what is queued; the replies in order (errors in place when not raised)."""
        ...


#: URL schemes of a Redis Cluster (``redis+cluster://host:port[,host:port...]``, any node
#: of it) and of a Sentinel-managed master
#: (``redis+sentinel://host:port[,host:port...]/service_name[/db]``); ``rediss+`` for TLS.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


def is_cluster(client: object) -> bool:
    """Whether ``client`` is redis-py's :class:`~redis.cluster.RedisCluster`: its keys live in
    slots on several nodes, so a script or a batch must keep to one slot each."""
    return isinstance(client, RedisCluster)


def _hosts(netloc: str, setting: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` (the port defaults to 6379), refused naming ``setting``."""
    found: list[tuple[str, int]] = []
    for part in netloc.rpartition("@")[2].split(","):
        host, _, port = part.strip().partition(":")
        if not host:
            raise ConfigError(f"{setting}: {part!r} is not host:port")
        try:
            found.append((host, int(port) if port else 6379))
        except ValueError:
            raise ConfigError(f"{setting}: port {port!r} of {host} is not a number") from None
    return found


def _credentials(netloc: str) -> dict[str, str]:
    if "@" not in netloc:
        return {}
    user, _, password = netloc.rpartition("@")[0].partition(":")
    out = {"password": unquote(password)} if password else {}
    if user:
        out["username"] = unquote(user)
    return out


#: Connections one client's pool may open (per node of a cluster). redis-py 8 caps a pool at
#: 100 by default; the direct path keeps one connection per thread (:class:`_Pinned`), so a
#: worker of ``REINS_WORKER_CONCURRENCY`` threads needs about that many, plus the few its
#: other calls borrow. As redis-py 5-7 did by default, the bound is far above what is used.
MAX_CONNECTIONS = 10_000


def client_from_url(
    url: str,
    *,
    connect_timeout_s: float | None = None,
    timeout_s: float | None = None,
    setting: str = "REINS_REDIS_URL",
    cluster: bool = False,
) -> redis.Redis:
    """A redis-py client for ``url`` with its own retries off (reins does the retrying) and,
    when given, its connect and reply timeouts; a bad URL is refused naming ``setting``.

    A ``redis+cluster://`` URL, or any ``redis://`` URL with ``cluster``, gives a
    :class:`~redis.cluster.RedisCluster` (it answers the commands a ``Redis`` does, routing
    each by its key's slot; :func:`is_cluster` tells them apart); it learns the slots when
    built, and a cluster out of reach then raises :class:`StoreUnavailable`. A
    ``redis+sentinel://`` URL gives the client of the master its Sentinels name, found
    again after a failover.
    """
    common: dict[str, Any] = {
        "retry": Retry(NoBackoff(), 0),
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": timeout_s,
        "socket_keepalive": True,
        "max_connections": MAX_CONNECTIONS,
    }
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        if scheme in SENTINEL_SCHEMES:
            if cluster:
                raise ConfigError(f"{setting}: a Sentinel URL with REINS_REDIS_CLUSTER set")
            return _sentinel_master(parts, common, setting)
        if scheme in CLUSTER_SCHEMES or cluster:
            if scheme in CLUSTER_SCHEMES:
                nodes = _hosts(parts.netloc, setting)
                extra: dict[str, Any] = {**_credentials(parts.netloc)}
                if scheme.startswith("rediss"):
                    extra["ssl"] = True
            elif scheme in ("redis", "rediss"):
                nodes = [(parts.hostname or "127.0.0.1", parts.port or 6379)]
                extra = {**_credentials(parts.netloc)}
            else:
                raise ConfigError(f"{setting}: a cluster URL is redis+cluster://host:port,...")
            if parts.path.strip("/") not in ("", "0"):
                raise ConfigError(f"{setting}: a Redis Cluster has database 0 only ({url!r})")
            return cast(redis.Redis, _cluster(nodes, common | extra, setting))
        return redis.Redis.from_url(url, **common)
    except ValueError as exc:
        raise ConfigError(f"{setting}: {exc}") from None


def _cluster(nodes: list[tuple[str, int]], options: dict[str, Any], setting: str) -> RedisCluster:
    try:
        return RedisCluster(
            startup_nodes=[
                ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in nodes
            ],
            **options,
        )
    except (RedisClusterException, RedisError) as exc:
        where = ",".join(f"{h}:{p}" for h, p in nodes)
        raise StoreUnavailable(f"{setting}: Redis Cluster at {where} unreachable: {exc}") from exc


def _sentinel_master(parts: SplitResult, options: dict[str, Any], setting: str) -> redis.Redis:
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ConfigError(
            f"{setting}: a Sentinel URL is redis+sentinel://host:port[,host:port]/service[/db]"
        )
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ConfigError(f"{setting}: database {path[1]!r} is not a number") from None
    credentials = _credentials(parts.netloc)
    if parts.scheme.lower().startswith("rediss"):
        options = options | {"ssl": True}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        _hosts(parts.netloc, setting),
        socket_connect_timeout=options["socket_connect_timeout"],
        socket_timeout=options["socket_timeout"],
        sentinel_kwargs={
            "socket_connect_timeout": options["socket_connect_timeout"],
            "socket_timeout": options["socket_timeout"],
        },
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        path[0], db=db, **options, **credentials
    )
    return master


def client_for(settings: Settings, *, broker: bool = False) -> redis.Redis:
    """The client of the store's Redis (or, with ``broker``, of the broker's) with the
    timeouts of ``settings``: no call on it waits for ever on a peer that stopped answering.
    ``REINS_REDIS_CLUSTER`` makes the store's a cluster client whatever its URL's scheme."""
    url, setting = (
        (settings.broker_url, "REINS_BROKER_URL")
        if broker
        else (settings.redis_url, "REINS_REDIS_URL")
    )
    return client_from_url(
        url,
        connect_timeout_s=settings.redis_connect_timeout_s,
        timeout_s=settings.redis_timeout_s,
        setting=setting,
        cluster=settings.redis_cluster and not broker,
    )


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


class _Pinned:
    """One connection per thread, taken from a client's pool once and kept for the thread's
    later direct calls; given back only when it is spent (an error that may leave a reply
    unread). The pool's own checkout, around every call, costs about as much client CPU as
    the call itself (a lock, two telemetry records, a readiness poll): measured 50-64 us
    a call against 28 us pinned (docs/adr/0014-redis-store.md, "Connections").

    A connection that the server closed while idle fails its next call with a connection
    error, which the caller's retries treat as any transient error: the retry takes a fresh
    connection."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._local = threading.local()
        _FORKS.watch()

    def get(self) -> Any:
        local = self._local
        conn = getattr(local, "conn", None)
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


def script_reply(reply: Any, again: Callable[[], Any]) -> Any:
    """The reply of a bare ``EVALSHA`` sent in a batch (executed with ``raise_on_error=False``,
    so no ``SCRIPT EXISTS`` round trip goes before it): a server that lost its scripts
    (restarted, flushed) answers ``NOSCRIPT``, and ``again`` loads the script and runs it once
    more; any other error reply is raised."""
    if isinstance(reply, NoScriptError):
        return again()
    if isinstance(reply, Exception):
        raise reply
    return reply


def direct_batch(client: redis.Redis) -> Batch:
    """A :class:`DirectBatch` on ``client``, or its own pipeline (no transaction) for a client
    pinned to one connection or of another kind."""
    if type(client) is not redis.Redis or client.connection is not None:
        return client.pipeline(transaction=False)
    return DirectBatch(client)
