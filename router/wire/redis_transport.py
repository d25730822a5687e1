"""kombu's Redis transport, with an acknowledgement that gives its prefetch slot back when
Redis does not answer.

kombu emulates acknowledgement on Redis: a delivered message is kept in an ``unacked`` hash
and holds one of the consumer's prefetch slots until it is acked. Its ack removes the message
from the hash *and then* frees the slot, so an ack that meets a dead connection (Redis
restarting under load) raises before the slot is freed. Celery logs the failure and goes on,
and the slot stays taken for the life of the process: once every slot of a worker has been
lost this way, it consumes nothing more, and every trajectory it would have advanced waits for
ever. That is what a Redis restart under load did to the fleet.

Here the slot is freed whatever Redis answered. A message whose removal failed stays in the
``unacked`` hash, so kombu's own sweep gives it back to its queue after the visibility timeout,
marked redelivered; a turn delivered twice is fenced by the record's version, as any
redelivery is. Nothing is dropped and the worker keeps its capacity.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

#: What ``broker_transport`` names for a Redis broker (Celery resolves ``module:Class``).
TRANSPORT = f"{__name__}:Transport"

#: kombu's in-memory half of an ack: marks the delivery done, which frees its slot.
_free_slot: Any = virtual.QoS.ack
#: kombu's channel building a new client over its pool.
_kombu_client: Any = kombu_redis.Channel._create_client


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS whose ack and reject free the prefetch slot even if Redis fails."""

    def ack(self, delivery_tag: Any) -> None:
        """Remove the message from the unacked index, then free its slot, even on failure."""
        this: Any = self  # kombu's QoS is untyped
        try:
            this._remove_from_indices(delivery_tag).execute()
        finally:
            _free_slot(this, delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        """As kombu's reject, with the slot freed even if Redis fails."""
        this: Any = self
        try:
            if requeue:
                this.restore_by_tag(delivery_tag, leftmost=True)
            else:
                this._remove_from_indices(delivery_tag).execute()
        finally:
            _free_slot(this, delivery_tag)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with :class:`QoS`, and one client for its synchronous calls.

    kombu builds a new redis-py client over the channel's pool for every synchronous call (the
    unacked bookkeeping of each delivery and each ack): some ten microseconds each, twice a
    turn. A client is safe to share between threads (each command takes its own connection
    from the pool), so the channel keeps one per pool and builds it again only when kombu
    replaced the pool (after a connection error, or on close)."""

    QoS = QoS
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        """The channel's client over its pool; kombu's own for the asynchronous calls."""
        if asynchronous:
            return _kombu_client(self, asynchronous=True)
        pool, client = self.pool, self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = _kombu_client(self)
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel
