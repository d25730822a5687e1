"""The wire on a RabbitMQ broker (``REINS_BROKER_URL=amqp://...``): queues, publisher, reads.

Each ring member consumes one durable queue, named ``<prefix>:celery:reins.turns.<member>``
(:func:`router.wire.broker.celery_queue`), bound to the default exchange under its own name. It is a
quorum queue when the server has them (RabbitMQ 3.8 and later), a durable classic one
otherwise; every declarer (routers, workers, the API) declares it with the same arguments, from
:func:`queue_arguments`. A queue unused for :data:`QUEUE_EXPIRES_MS` (no consumer, no
declaration) is deleted by the server: its member is long gone and the reconciler recovered its
turns from custody, never from the broker.

:class:`AmqpPublisher` sends task messages through kombu's producer on a channel in confirm
mode: a flush publishes its batch and then waits for the broker's confirms of all of it. A
message is delivered at least once and never lost: one the broker did not confirm (nacked, or
its confirm did not arrive, or the connection closed under it) stays buffered, in order, and
goes again with the next flush on a new connection. Design: ``docs/adr/0180-amqp-broker.md``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import amqp.exceptions
from celery import Celery
from celery.utils.nodenames import anon_nodename
from kombu import connection as _connection
from kombu import entity as _entity
from kombu import messaging as _messaging
from kombu.exceptions import OperationalError

from kernel.errors import ConfigError, StoreError, StoreUnavailable
from kernel.settings import Settings
from router.wire.broker import TURN_TASK, celery_queue, turn_repr

log = logging.getLogger("reins.router.amqp")
# kombu is untyped: its classes are called through these names.
Connection: Any = _connection.Connection
Exchange: Any = _entity.Exchange
Producer: Any = _messaging.Producer
Queue: Any = _entity.Queue

QUEUE_EXPIRES_MS = 7 * 24 * 3600 * 1000  # an unused member queue is deleted after a week
QUORUM_SINCE = (3, 8)  # the RabbitMQ release that brought quorum queues
PUBLISH_ATTEMPTS = 4
BOOT_ATTEMPTS = 100  # a worker waits for the broker at boot about as long as Celery does
#: What may go wrong on the wire and is worth another connection: the socket, the protocol's
#: recoverable errors, a closed channel, a nack, a confirm that did not come.
TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    socket.timeout,
    OperationalError,
    amqp.exceptions.RecoverableConnectionError,
    amqp.exceptions.RecoverableChannelError,
    amqp.exceptions.ConnectionForced,
    amqp.exceptions.ChannelError,
    amqp.exceptions.ConnectionError,
)


class ConfirmTimeout(OSError):
    """The broker did not confirm a published batch in time (its fate is unknown)."""


def connect(settings: Settings) -> Connection:
    """A kombu connection to the broker of ``settings`` with its timeouts (not yet opened):
    no call on it waits for ever on a server that stopped answering."""
    return Connection(
        settings.broker_url,
        connect_timeout=settings.redis_connect_timeout_s,
        transport_options={
            "read_timeout": settings.redis_timeout_s,
            "write_timeout": settings.redis_timeout_s,
        },
        heartbeat=0,  # short-lived calls and confirm timeouts find a dead peer instead
    )


def server_version(conn: Connection) -> tuple[int, ...]:
    """The RabbitMQ release of an open connection's server ((0,) when it does not say)."""
    props = getattr(conn.connection, "server_properties", None) or {}
    raw = props.get("version", b"0")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) or (0,)


def queue_arguments(version: tuple[int, ...]) -> dict[str, Any]:
    """The arguments every declarer gives a member queue on a server of ``version``."""
    args: dict[str, Any] = {"x-expires": QUEUE_EXPIRES_MS}
    if version >= QUORUM_SINCE:
        args["x-queue-type"] = "quorum"
    return args


def member_queue(name: str, version: tuple[int, ...]) -> Queue:
    """The kombu queue ``name`` on the default exchange, durable, with :func:`queue_arguments`."""
    return Queue(
        name,
        Exchange(""),
        routing_key=name,
        durable=True,
        auto_delete=False,
        queue_arguments=queue_arguments(version),
    )


def probe_queue(settings: Settings, name: str, attempts: int = BOOT_ATTEMPTS) -> Queue:
    """The member queue ``name`` as the broker of ``settings`` takes it, declared (a worker's
    boot: it asks the server's release once, then Celery consumes the queue it returns). A
    broker that is not up yet is waited for, as Celery waits at startup: up to ``attempts``
    tries, a few seconds apart, each failure logged; then the last error is raised."""
    delay = 0.5
    for _ in range(attempts - 1):
        try:
            return _declared(settings, name)
        except amqp.exceptions.PreconditionFailed:
            raise  # declared elsewhere with other arguments: waiting will not help
        except TRANSIENT as exc:
            log.warning("broker not ready for queue %s (%s); again in %.1fs", name, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    return _declared(settings, name)


def _declared(settings: Settings, name: str) -> Queue:
    with connect(settings) as conn:
        conn.connect()
        queue = member_queue(name, server_version(conn))
        queue(conn.default_channel).declare()
        return queue


def delete_queues(settings: Settings, names: Iterable[str]) -> int:
    """Delete the named queues (a test's or a benchmark's own); returns how many were asked.
    A queue that is not there is no error."""
    count = 0
    with connect(settings) as conn:
        conn.ensure_connection(max_retries=3)
        channel = conn.default_channel
        for name in names:
            channel.queue_delete(name)
            count += 1
    return count


@dataclass
class _Outgoing:
    """One task message, built and waiting for a flush."""

    queue: str
    body: Any
    headers: dict[str, Any]
    properties: dict[str, Any]


@dataclass
class _Confirms:
    """The confirms of one batch on one channel: tags are the channel's publish sequence."""

    first: int
    last: int
    acked: set[int] = field(default_factory=set)
    nacked: set[int] = field(default_factory=set)
    returned: set[str] = field(default_factory=set)  # task ids the broker could not route
    upto: int = 0  # every tag up to this one was answered by a ``multiple`` confirm

    def answer(self, tag: int, multiple: bool, ok: bool) -> None:
        into = self.acked if ok else self.nacked
        if multiple:
            into.update(t for t in range(max(self.first, self.upto + 1), tag + 1))
            self.upto = max(self.upto, tag)
        else:
            into.add(tag)

    def settled(self) -> bool:
        return len(self.acked) + len(self.nacked) >= self.last - self.first + 1

    def unsent(self, batch: list[_Outgoing]) -> list[_Outgoing]:
        """The messages of ``batch`` (published from tag ``first`` on) the broker did not
        take: not acknowledged, or returned unrouted (a returned message is acknowledged)."""
        return [
            out
            for tag, out in enumerate(batch, self.first)
            if tag not in self.acked or out.headers.get("id") in self.returned
        ]


class AmqpPublisher:
    """Task messages through kombu's producer, confirmed by the broker one batch per flush.

    The message is Celery's own (``app.amqp.as_task_v2``, published with the arguments
    ``send_task`` gives kombu). ``add`` and :meth:`turn` only buffer; :meth:`flush` publishes
    everything buffered, in order, and returns once the broker confirmed all of it. Whatever it
    did not confirm stays buffered, in order, and :class:`StoreUnavailable` is raised after
    bounded retries; a message whose confirm was lost may so arrive twice, and the second finds
    its version stale (as a redelivery would). Messages are mandatory: one the broker could not
    route (its queue deleted since this connection declared it) comes back, and goes again
    after the queue is declared again. Not thread-safe: one per sending loop.
    """

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.app, self.settings = app, settings
        self.origin = anon_nodename()
        self.reply_to = app.thread_oid
        self.pending: list[_Outgoing] = []
        self.confirm_timeout_s = settings.redis_timeout_s
        self._conn: Connection | None = None
        self._channel: Any = None
        self._producer: Producer | None = None
        self._sequence = 0  # the channel's last publish tag
        self._declared: dict[str, Queue] = {}
        self._version: tuple[int, ...] = (0,)
        self._batch: _Confirms | None = None
        self._lock = threading.Lock()

    # --- building ------------------------------------------------------------------------------

    def add(
        self, task: str, member: str, args: list[Any] | None = None, argsrepr: str = "[]"
    ) -> None:
        """Buffer one message for ``member``'s queue (``argsrepr``: how logs show its args)."""
        message = self.app.amqp.as_task_v2(
            str(uuid.uuid4()),
            task,
            args=args or [],
            reply_to=self.reply_to,
            origin=self.origin,
            ignore_result=None,
            argsrepr=argsrepr,
            kwargsrepr="{}",
        )
        properties = dict(message.properties)
        self.pending.append(
            _Outgoing(
                celery_queue(self.settings, member), message.body, message.headers, properties
            )
        )

    def turn(self, member: str, payload: dict[str, Any]) -> None:
        """Buffer one turn message (the dispatcher's sender)."""
        self.add(TURN_TASK, member, [payload], turn_repr(payload))

    def send(self, member: str, payload: dict[str, Any]) -> None:
        """Send one turn message now (with anything still buffered before it)."""
        self.turn(member, payload)
        self.flush()

    # --- sending -------------------------------------------------------------------------------

    def flush(self) -> int:
        """Publish what is buffered and wait for its confirms; returns how many were confirmed.

        A failure (connection refused or closed, channel closed, nack, no confirm within
        ``REINS_REDIS_TIMEOUT_S``) drops the connection and tries again on a new one, bounded,
        with backoff; what is still unconfirmed then stays buffered, in order, for the next
        flush, and :class:`StoreUnavailable` is raised. A queue declared by someone else with
        other arguments raises :class:`StoreError` naming it (the messages stay buffered too).
        """
        with self._lock:
            pending, self.pending = self.pending, []
            if not pending:
                return 0
            sent, delay = 0, 0.005
            for attempt in range(1, PUBLISH_ATTEMPTS + 1):
                try:
                    pending, confirmed = self._publish(pending)
                    sent += confirmed
                    if not pending:
                        return sent
                    error: BaseException = ConfirmTimeout("the broker nacked or returned some")
                except amqp.exceptions.PreconditionFailed as exc:
                    self._reset()
                    self.pending = pending + self.pending
                    raise StoreError(f"declaring a member queue on the broker: {exc}") from exc
                except amqp.exceptions.AccessRefused as exc:
                    self._reset()
                    self.pending = pending + self.pending
                    raise ConfigError(f"REINS_BROKER_URL: refused by the broker ({exc})") from exc
                except TRANSIENT as exc:
                    error = exc
                    self._reset()
                if attempt < PUBLISH_ATTEMPTS:
                    time.sleep(delay)
                    delay = min(delay * 4, 0.5)
            self.pending = pending + self.pending
            raise StoreUnavailable(
                f"sending {len(pending)} task messages: the broker did not confirm them after "
                f"{PUBLISH_ATTEMPTS} attempts ({error!r}); they stay buffered"
            )

    def close(self) -> None:
        """Close the connection (buffered messages stay buffered)."""
        with self._lock:
            conn, self._conn, self._channel, self._producer = self._conn, None, None, None
            close_connection(conn)

    def _publish(self, batch: list[_Outgoing]) -> tuple[list[_Outgoing], int]:
        """Publish ``batch`` and wait for every confirm: (the messages to send again, the number
        confirmed). Raises a :data:`TRANSIENT` error when the outcome of some is unknown, after
        taking the confirmed ones out of ``batch`` in place."""
        producer = self._ready()
        first = self._sequence + 1
        confirms = self._batch = _Confirms(first, first + len(batch) - 1)
        try:
            for out in batch:
                self._declare(out.queue)
                producer.publish(
                    out.body,
                    exchange="",
                    routing_key=out.queue,
                    mandatory=True,  # a queue gone since it was declared: returned, not lost
                    serializer="json",
                    headers=out.headers,
                    delivery_mode=2,
                    retry=False,
                    **out.properties,
                )
                self._sequence += 1
            self._await(confirms)
        except BaseException:
            batch[:] = confirms.unsent(batch)
            self._batch = None
            raise
        self._batch = None
        again = confirms.unsent(batch)
        return again, len(batch) - len(again)

    def _await(self, confirms: _Confirms) -> None:
        assert self._conn is not None
        deadline = time.monotonic() + self.confirm_timeout_s
        raw = self._conn.connection
        while not confirms.settled():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConfirmTimeout(
                    f"no confirm of {confirms.last - confirms.first + 1} messages within "
                    f"{self.confirm_timeout_s}s"
                )
            raw.drain_events(timeout=remaining)

    def _declare(self, name: str) -> None:
        if name in self._declared:
            return
        queue = member_queue(name, self._version)
        queue(self._channel).declare()
        self._declared[name] = queue

    def _ready(self) -> Producer:
        """The producer on an open channel in confirm mode, connecting first if needed."""
        if self._producer is not None:
            return self._producer
        conn = connect(self.settings)
        try:
            conn.connect()
            channel = conn.channel()
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            channel.events["basic_return"].add(self._on_return)
        except BaseException:
            discard_connection(conn)
            raise
        self._conn, self._channel = conn, channel
        self._version = server_version(conn)
        self._sequence = 0
        self._declared = {}
        self._producer = Producer(channel, exchange=Exchange(""), serializer="json")
        return self._producer

    def _on_ack(self, tag: int, multiple: bool) -> None:
        if self._batch is not None:
            self._batch.answer(tag, multiple, True)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        if self._batch is not None:
            self._batch.answer(tag, multiple, False)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        """The broker could not route a message (its queue was deleted): declare the queue
        again and send the message again with the next attempt."""
        log.warning("the broker returned a message for %s: %s", routing_key, exc)
        self._declared.pop(routing_key, None)
        headers = getattr(message, "headers", None) or {}
        if self._batch is not None and "id" in headers:
            self._batch.returned.add(str(headers["id"]))

    def _reset(self) -> None:
        conn, self._conn, self._channel, self._producer = self._conn, None, None, None
        discard_connection(conn)


def discard_connection(conn: Any) -> None:
    """Drop a connection that failed: its socket closed at once, no goodbye to a server that
    may not answer."""
    if conn is None:
        return
    try:
        conn.collect()
    except Exception as exc:
        log.debug("discarding a broken broker connection: %s", exc)


def close_connection(conn: Any) -> None:
    """Close a connection politely, or drop it if that fails."""
    if conn is None:
        return
    try:
        conn.release()
    except Exception:
        discard_connection(conn)
