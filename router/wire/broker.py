"""The broker side of the wire: the fleet's Celery configuration, its queues, and the Redis
broker's publisher.

Nothing here connects at import. :func:`make_app` builds the app for one deployment (broker
``REINS_BROKER_URL``, late acknowledgement, prefetch 1, an explicit visibility timeout, every
key under ``<REINS_KEY_PREFIX>:celery:``, a thread pool); a router sends with it and a worker
(:mod:`worker.celery_app`) registers its turn task on it. Each worker consumes one queue, named
after its ring member (:func:`queue_for`). The broker is Redis or RabbitMQ, chosen by the URL's
scheme (:func:`broker_kind`); RabbitMQ's half of the wire is :mod:`router.wire.amqp`, and
:mod:`router.wire.publishers` picks the one of a deployment. Design:
``docs/adr/0006-fleet-wire.md``,
``docs/adr/0180-amqp-broker.md``.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import uuid
from enum import StrEnum
from typing import Any

import redis
from celery import Celery
from celery.utils.nodenames import anon_nodename

from kernel.errors import InvalidInput, ReinsError
from kernel.settings import Settings
from router.placement.ring import check_name
from router.wire import redis_transport
from store.redis_client import retry_transient
from store.redis_direct import direct_batch

TURN_TASK = "reins.turn"
NOOP_TASK = "reins.noop"
QUEUE_PREFIX = "reins.turns."


class BrokerKind(StrEnum):
    """The brokers the wire speaks, by the scheme of ``REINS_BROKER_URL``."""

    REDIS = "redis"  # redis://, rediss://: messages pushed straight onto kombu's lists
    AMQP = "amqp"  # amqp://, amqps://: RabbitMQ, through kombu's producer with confirms


_SCHEMES = {
    "redis": BrokerKind.REDIS,
    "rediss": BrokerKind.REDIS,
    "amqp": BrokerKind.AMQP,
    "amqps": BrokerKind.AMQP,
    "pyamqp": BrokerKind.AMQP,
}


def broker_kind(url: str) -> BrokerKind:
    """The kind of broker ``url`` names; raises :class:`InvalidInput` naming REINS_BROKER_URL
    for any other scheme."""
    kind = _SCHEMES.get(url.split("://", 1)[0]) if "://" in url else None
    if kind is None:
        raise InvalidInput(
            "REINS_BROKER_URL: the broker must be Redis (redis://, rediss://) or RabbitMQ "
            f"(amqp://, amqps://), got {url.split('://', 1)[0]!r}"
        )
    return kind


def noops_key(prefix: str) -> str:
    """The hash where each worker tells ``<count>:<time of the last>`` of the no-op tasks it
    ran (at its heartbeat, when the count changed): the end of ``reins bench fleet``'s
    baseline on a broker that cannot say when its last message was acknowledged."""
    return f"{prefix}:fleet:noops"


def queue_for(member: str) -> str:
    """The Celery queue of ring member ``member``, without the deployment's prefix."""
    return QUEUE_PREFIX + check_name(member)


def broker_keyprefix(settings: Settings) -> str:
    """The prefix of every broker key of this deployment."""
    return f"{settings.key_prefix}:celery:"


def celery_queue(settings: Settings, member: str) -> str:
    """The queue name Celery is given for ``member``: on Redis kombu adds the deployment's
    prefix to every key itself; RabbitMQ has no such option, so the name carries it."""
    if broker_kind(settings.broker_url) is BrokerKind.AMQP:
        return broker_keyprefix(settings) + queue_for(member)
    return queue_for(member)


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration of the fleet (see the module docstring for each choice)."""
    common = _common_config(settings)
    if broker_kind(settings.broker_url) is BrokerKind.AMQP:
        return {
            **common,
            "broker_transport_options": {
                # send_task waits for the broker's confirm (reins's own publisher confirms
                # a batch at a time: router.wire.amqp).
                "confirm_publish": True,
                "read_timeout": settings.redis_timeout_s,
                "write_timeout": settings.redis_timeout_s,
            },
            # Quorum queues take per-consumer prefetch only (Celery sees them in the queues
            # it consumes: worker.celery_app registers the member queue).
            "worker_detect_quorum_queues": True,
        }
    return {
        **common,
        # kombu's Redis transport, less its leak of a prefetch slot per failed ack.
        "broker_transport": redis_transport.TRANSPORT,
        **_redis_tls(settings.broker_url),
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "global_keyprefix": broker_keyprefix(settings),
            # Sweep for unacked messages past the timeout every few seconds (kombu's default
            # scans one call in ten, every ten seconds): a turn whose worker died comes back to
            # its queue, marked redelivered, within about the timeout plus one sweep.
            "unacked_restore_interval": max(1, min(10, int(settings.visibility_timeout_s // 4))),
            "unacked_restore_throttle": 1,
            # No call on the broker waits for ever on a peer that stopped answering.
            "socket_connect_timeout": settings.redis_connect_timeout_s,
            "socket_timeout": settings.redis_timeout_s,
            "socket_keepalive": True,
            # The consumer's BRPOP connection escapes socket_timeout (it runs on the event
            # loop): kombu drops it once a reply is this overdue (its default is 25 s).
            "health_check_interval": max(1, math.ceil(settings.redis_timeout_s)),
        },
    }


def _redis_tls(url: str) -> dict[str, Any]:
    """TLS for a ``rediss://`` broker. kombu turns TLS on from the URL's scheme only when it
    picks the transport itself; with the transport named, it is asked for here, with the
    server's certificate verified (as the store's redis-py client does)."""
    if url.split("://", 1)[0] != "rediss":
        return {}
    return {"broker_use_ssl": {"ssl_cert_reqs": ssl.CERT_REQUIRED}}


def _common_config(settings: Settings) -> dict[str, Any]:
    """What the fleet's Celery configuration is on every broker."""
    return {
        "broker_url": settings.broker_url,
        "broker_connection_timeout": settings.redis_connect_timeout_s,
        "broker_connection_retry_on_startup": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_pool": "threads",
        "worker_concurrency": settings.worker_concurrency,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_create_missing_queues": True,
        "worker_enable_remote_control": False,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
    }


def make_app(settings: Settings) -> Celery:
    """The app for ``settings``, with no task registered: a sender sends by task name."""
    app = Celery("reins", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


def turn_repr(payload: dict[str, Any]) -> str:
    """How a turn message shows in Celery's logs: which trajectory, at which version. Given
    to Celery so it does not build a ``saferepr`` of the whole payload for every message."""
    return (
        f"[turn {payload.get('tenant')}/{payload.get('trajectory_id')} v{payload.get('version')}]"
    )


def send_turn(app: Celery, member: str, payload: dict[str, Any]) -> None:
    """Send one turn message to ``member``'s queue (fire and forget)."""
    app.send_task(
        TURN_TASK,
        args=[payload],
        queue=queue_for(member),
        argsrepr=turn_repr(payload),
        kwargsrepr="{}",
    )


def queue_figures(client: Any, settings: Settings, member: str, now: float) -> tuple[int, float]:
    """How many messages wait in ``member``'s queue, and how long ago the oldest turn among
    them was admitted (0 when none waits, or the oldest is not a turn): one round trip."""
    key = broker_keyprefix(settings) + queue_for(member)
    pipe = direct_batch(client)
    pipe.execute_command("LLEN", key)
    pipe.execute_command("LINDEX", key, -1)  # the consuming end: the oldest
    depth, raw = pipe.execute()
    if not raw:
        return int(depth), 0.0
    try:
        args = json.loads(base64.b64decode(json.loads(raw)["body"]))[0]
        admitted_at = float(args[0].get("admitted_at", 0.0))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return int(depth), 0.0
    return int(depth), max(now - admitted_at, 0.0) if admitted_at > 0 else 0.0


def take_queued_turns(client: Any, settings: Settings, member: str, limit: int) -> list[Any]:
    """Take up to ``limit`` turn payloads still waiting in ``member``'s queue, oldest first,
    out of the broker (a drain whose grace ran out hands them back instead of running them).

    Reads kombu's Redis layout: a list per queue, pushed on the left and consumed from the
    right, each entry a JSON envelope whose body is the base64 JSON of ``[args, kwargs, _]``.
    An entry that is not a turn message is put back where it was, and taking stops there, so
    the consumer gets it as it would have.
    """
    key = broker_keyprefix(settings) + queue_for(member)
    out: list[Any] = []
    while len(out) < limit:
        raw = client.rpop(key)
        if raw is None:
            break
        try:
            envelope = json.loads(raw)
            if envelope.get("headers", {}).get("task") != TURN_TASK:
                raise ValueError("not a turn message")
            args = json.loads(base64.b64decode(envelope["body"]))[0]
            out.append(args[0])
        except (ValueError, KeyError, IndexError, TypeError):
            client.rpush(key, raw)  # back at the consuming end, untouched
            break
    return out


class TaskPublisher:
    """Publishes task messages straight into the broker's queue lists, one pipeline per flush.

    The message is Celery's own (``app.amqp.as_task_v2``, as ``send_task`` builds it) in
    kombu's Redis envelope, as :func:`take_queued_turns` reads it; why not ``send_task``:
    ``docs/adr/0006-fleet-wire.md``. ``add`` and :meth:`turn` only buffer; :meth:`flush`
    pushes everything buffered, in order. A caller flushes at least once per loop iteration,
    so a message waits in the buffer no longer than the iteration that admitted it.
    """

    def __init__(self, app: Celery, client: redis.Redis, settings: Settings) -> None:
        self.app, self.client = app, client
        self.keyprefix = broker_keyprefix(settings)
        self.origin = anon_nodename()
        self.reply_to = app.thread_oid
        self.pending: list[tuple[str, bytes]] = []

    def envelope(self, task: str, member: str, args: list[Any], argsrepr: str) -> dict[str, Any]:
        """The message kombu's Redis transport would write for ``task(*args)`` to ``member``."""
        task_id = str(uuid.uuid4())
        message = self.app.amqp.as_task_v2(
            task_id,
            task,
            args=args,
            reply_to=self.reply_to,
            origin=self.origin,
            ignore_result=None,
            argsrepr=argsrepr,
            kwargsrepr="{}",
        )
        body = json.dumps(message.body).encode()
        return {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": message.headers,
            "properties": {
                **message.properties,
                "argsrepr": argsrepr,
                "kwargsrepr": "{}",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue_for(member)},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }

    def add(
        self, task: str, member: str, args: list[Any] | None = None, argsrepr: str = "[]"
    ) -> None:
        """Buffer one message for ``member``'s queue (``argsrepr``: how logs show its args)."""
        raw = json.dumps(self.envelope(task, member, args or [], argsrepr)).encode()
        self.pending.append((self.keyprefix + queue_for(member), raw))

    def turn(self, member: str, payload: dict[str, Any]) -> None:
        """Buffer one turn message (the dispatcher's sender)."""
        self.add(TURN_TASK, member, [payload], turn_repr(payload))

    def flush(self) -> int:
        """Push what is buffered, in order, in one round trip; returns how many went.

        A broker that cannot be reached is retried (bounded, with backoff); then the messages
        stay buffered, in order, for the next flush, and :class:`StoreUnavailable` is raised.
        A retried batch that had partly landed sends some messages twice: the second of a pair
        finds its version stale and is ignored, as a redelivery would be.
        """
        pending, self.pending = self.pending, []
        if not pending:
            return 0

        def push() -> None:
            pipe = direct_batch(self.client)
            for key, raw in pending:
                pipe.lpush(key, raw)
            pipe.execute()

        try:
            retry_transient(
                push, what=f"sending {len(pending)} task messages", attempts=4, counted=4
            )
        except ReinsError:
            self.pending = pending + self.pending
            raise
        return len(pending)

    def send(self, member: str, payload: dict[str, Any]) -> None:
        """Send one turn message now (with anything still buffered before it)."""
        self.turn(member, payload)
        self.flush()
