"""Talking to Redis: clients, the batch protocol, script replies, transient retries, text
(the hot path's direct commands and batches are :mod:`store.redis_direct`).

Shared by the store and every Redis user above it (the admitter, the gates, the feed, the
membership, the broker's publisher). Retries are reins's own: clients are built with
redis-py's retries off, and :func:`retry_transient` repeats only what is safe to repeat.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import SplitResult, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    NoScriptError,
    RedisClusterException,
    RedisError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from kernel.errors import ConfigError, StoreError, StoreUnavailable
from kernel.settings import Settings

try:
    from redis.driver_info import DriverInfo
except ImportError:  # an older redis-py, which looks nothing up per connection
    DriverInfo = None  # type: ignore[assignment,misc]

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


#: redis-py's driver metadata, resolved once per process: left to itself, a redis-py that has it
#: looks its own version up in the installed packages' metadata for every connection it opens
#: (about 0.4 ms, paid by each of a worker's threads, and again after a reconnect).
_DRIVER: dict[str, Any] = {"driver_info": DriverInfo()} if DriverInfo is not None else {}


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
    (no transaction) or a :class:`~store.redis_direct.DirectBatch`. Writers that take
    ``pipeline=`` queue their commands on it; the caller executes it."""

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
#: 100 by default; the direct path keeps one connection per thread (``store.redis_direct``), so a
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
        **_DRIVER,
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
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        _hosts(parts.netloc, setting),
        socket_connect_timeout=options["socket_connect_timeout"],
        socket_timeout=options["socket_timeout"],
        sentinel_kwargs={
            "socket_connect_timeout": options["socket_connect_timeout"],
            "socket_timeout": options["socket_timeout"],
        },
    )
    connection: dict[str, Any] = {**options, **credentials}  # redis-py 8 types each keyword
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        path[0], db=db, **connection
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
