"""The wire of one deployment, chosen by the scheme of ``REINS_BROKER_URL``.

A Redis broker keeps the fast path of :mod:`router.wire.broker` (messages pushed straight onto
kombu's lists, the queue read with ``LLEN``/``LINDEX``); RabbitMQ goes through kombu's producer
with publisher confirms and durable (quorum) member queues (:mod:`router.wire.amqp`). Callers
see two small seams: a :class:`Publisher` (routers, the API, the benchmark) and a
:class:`MemberQueue` (a worker reading its own queue). Design: ``docs/adr/0180-amqp-broker.md``.
"""

from __future__ import annotations

from typing import Any, Protocol

import redis
from celery import Celery
from kombu.entity import Queue

from kernel.settings import Settings
from router.wire.amqp import AmqpPublisher, probe_queue
from router.wire.amqp_queue import AmqpQueue
from router.wire.broker import (
    TURN_TASK,
    BrokerKind,
    TaskPublisher,
    broker_keyprefix,
    broker_kind,
    celery_queue,
    queue_figures,
    queue_for,
    take_queued_turns,
)
from store.redis_client import client_for


class Publisher(Protocol):
    """Sends task messages to member queues: ``add``/``turn`` buffer, ``flush`` sends what is
    buffered, in order; what it could not send stays buffered and it raises
    :class:`~kernel.errors.StoreUnavailable` (a message may so go twice, never none)."""

    pending: list[Any]

    def add(
        self, task: str, member: str, args: list[Any] | None = None, argsrepr: str = "[]"
    ) -> None: ...

    def turn(self, member: str, payload: dict[str, Any]) -> None: ...

    def send(self, member: str, payload: dict[str, Any]) -> None: ...

    def flush(self) -> int: ...


def publisher_for(settings: Settings, app: Celery, client: redis.Redis | None = None) -> Publisher:
    """The publisher of ``settings``'s broker (``client``: the Redis broker's, if one is at
    hand; otherwise one is made from REINS_BROKER_URL)."""
    if broker_kind(settings.broker_url) is BrokerKind.AMQP:
        return AmqpPublisher(app, settings)
    broker = client if client is not None else client_for(settings, broker=True)
    return TaskPublisher(app, broker, settings)


class MemberQueue(Protocol):
    """One member's queue as its worker reads it. Calls may raise the broker's errors."""

    name: str

    def consumed(self) -> str | Queue:
        """What the worker's Celery consumer is told to consume."""
        ...

    def depth(self) -> int:
        """Messages waiting (not those a consumer holds)."""
        ...

    def figures(self, now: float) -> tuple[int, float]:
        """The depth, and how long ago the oldest waiting turn was admitted (0: unknown)."""
        ...

    def take_turns(self, limit: int) -> list[Any]:
        """Take up to ``limit`` waiting turn payloads out, oldest first."""
        ...

    def close(self) -> None:
        """Let go of what this reader holds (its own connection, if any)."""
        ...


class RedisMemberQueue:
    """A member's queue on a Redis broker: kombu's list under the deployment's prefix."""

    def __init__(self, settings: Settings, member: str, client: redis.Redis) -> None:
        self.settings, self.member, self.client = settings, member, client
        self.name = queue_for(member)
        self.key = broker_keyprefix(settings) + self.name

    def consumed(self) -> str | Queue:
        return self.name

    def depth(self) -> int:
        waiting: Any = self.client.llen(self.key)
        return int(waiting)

    def figures(self, now: float) -> tuple[int, float]:
        return queue_figures(self.client, self.settings, self.member, now)

    def take_turns(self, limit: int) -> list[Any]:
        return take_queued_turns(self.client, self.settings, self.member, limit)

    def close(self) -> None:
        """Nothing: the client is the caller's."""


class AmqpMemberQueue:
    """A member's queue on RabbitMQ. The age of its oldest message is not read: only taking a
    message shows it, and a peek would count as a delivery."""

    def __init__(self, settings: Settings, member: str) -> None:
        self.settings = settings
        self.name = celery_queue(settings, member)
        self.reader = AmqpQueue(settings, self.name)

    def consumed(self) -> str | Queue:
        queue: Queue = probe_queue(self.settings, self.name)  # declared as the server takes it
        return queue

    def depth(self) -> int:
        return self.reader.depth()

    def figures(self, now: float) -> tuple[int, float]:
        return self.reader.depth(), 0.0

    def take_turns(self, limit: int) -> list[Any]:
        return self.reader.take(limit, TURN_TASK)

    def close(self) -> None:
        self.reader.close()


def member_queue(settings: Settings, member: str, client: redis.Redis | None) -> MemberQueue:
    """Member ``member``'s queue on ``settings``'s broker (``client``: the Redis broker's)."""
    if broker_kind(settings.broker_url) is BrokerKind.AMQP:
        return AmqpMemberQueue(settings, member)
    return RedisMemberQueue(
        settings, member, client if client is not None else client_for(settings, broker=True)
    )
