"""kombu's Redis transport as the fleet runs it: a failed ack frees its slot; one client a channel.

Through the fleet's own Celery configuration (router.wire.broker) on a redis-server of the
test's own, killed between delivery and ack, as a Redis restart under load does. With kombu's
own QoS the slot stays taken: a worker that lost all of its slots this way consumed nothing
more (tests/fleet/test_redis_restart.py saw a fleet stop for good).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from kombu import Queue

from kernel.settings import Settings
from router.wire.broker import make_app
from tests.support.redis_server import OwnRedis

pytestmark = pytest.mark.redis


def test_a_failed_ack_frees_its_slot_and_the_message_stays_for_redelivery(
    tmp_path: Path,
) -> None:
    server = OwnRedis(tmp_path)
    server.start()
    settings = Settings.from_env(
        {
            "REINS_BROKER_URL": server.url,
            "REINS_KEY_PREFIX": "acktest",
            "REINS_REDIS_TIMEOUT_S": "1",
        }
    )
    app = make_app(settings)
    conn = app.connection_for_read()
    try:
        channel = conn.channel()
        channel.basic_qos(0, 1, False)  # one slot, as a worker thread's prefetch
        queue = Queue("acktest.q", channel=channel)
        queue.declare()
        producer = conn.Producer(channel)
        producer.publish({"turn": 1}, routing_key="acktest.q")
        message = queue.get(no_ack=False)
        assert message is not None
        assert not channel.qos.can_consume()  # the slot is taken until the ack

        server.kill()
        with pytest.raises(redis.ConnectionError):
            message.ack()
        assert channel.qos.can_consume(), "the failed ack kept the consumer's only slot"

        server.start()  # AOF reload: the delivered message is still in the unacked hash
        client = redis.Redis.from_url(server.url)
        try:
            unacked = client.hkeys("acktest:celery:unacked")
            assert unacked == [message.delivery_tag.encode()]
        finally:
            client.close()
    finally:
        conn.release()
        server.stop()


def test_the_channel_keeps_one_client_until_its_pool_is_replaced(tmp_path: Path) -> None:
    server = OwnRedis(tmp_path)
    server.start()
    settings = Settings.from_env({"REINS_BROKER_URL": server.url, "REINS_KEY_PREFIX": "acktest"})
    conn = make_app(settings).connection_for_read()
    try:
        channel = conn.channel()
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second and first.connection_pool is channel.pool
        channel._pool = None  # as kombu drops it after a connection error
        with channel.conn_or_acquire() as third:
            assert third is not first and third.connection_pool is channel.pool
            assert third.ping()
    finally:
        conn.release()
        server.stop()
