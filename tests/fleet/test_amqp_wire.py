"""The wire on the machine's RabbitMQ: the publisher, the member queues, and broker faults.

One contract with the Redis path (``test_publisher.py``): a message from
:class:`router.wire.amqp.AmqpPublisher` is the one Celery's ``send_task`` writes, and a drain
takes turns back out oldest first. Member queues are durable quorum queues named under the
test's key prefix (deleted after each test). A flush returns only once the broker confirmed
everything; when it cannot (the broker out of reach, a confirm lost on the way back, a closed
channel or connection), nothing is lost: what was not confirmed stays buffered, in order, and
the next flush sends it, at least once.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import amqp.exceptions
import pytest

from kernel.errors import StoreUnavailable
from kernel.settings import Settings
from router.wire.amqp import (
    QUEUE_EXPIRES_MS,
    AmqpPublisher,
    _Confirms,
    connect,
    delete_queues,
    member_queue,
    probe_queue,
    server_version,
)
from router.wire.amqp_queue import AmqpQueue
from router.wire.broker import NOOP_TASK, TURN_TASK, celery_queue, make_app, turn_repr
from router.wire.publishers import AmqpMemberQueue
from router.wire.publishers import member_queue as queue_of_member
from tests.fleet.brokers import AMQP_URL, require_rabbitmq
from tests.support.proxy import BlackHoleProxy

pytestmark = pytest.mark.amqp
MEMBERS = ("w1", "w2")
FRESH = {"id", "root_id", "correlation_id", "delivery_tag", "origin"}


def payload(n: int) -> dict[str, Any]:
    return {"tenant": "acme", "trajectory_id": f"t{n}", "version": n, "commands": [{"a": "é"}]}


@pytest.fixture
def settings(key_prefix: str) -> Iterator[Settings]:
    """This test's settings on the machine's RabbitMQ; its member queues deleted after it."""
    require_rabbitmq()
    s = Settings.from_env(
        {"REINS_KEY_PREFIX": key_prefix, "REINS_BROKER_URL": AMQP_URL, "REINS_REDIS_TIMEOUT_S": "1"}
    )
    yield s
    delete_queues(s, [celery_queue(s, m) for m in MEMBERS])


@pytest.fixture
def publishers() -> Iterator[list[AmqpPublisher]]:
    """Publishers a test makes (appended to this list), each closed after it."""
    made: list[AmqpPublisher] = []
    yield made
    for publisher in made:
        publisher.close()


def publisher_of(made: list[AmqpPublisher], s: Settings) -> AmqpPublisher:
    made.append(AmqpPublisher(make_app(s), s))
    return made[-1]


def through(proxy: BlackHoleProxy, s: Settings) -> Settings:
    """``s`` with its broker reached through ``proxy``."""
    rest = AMQP_URL.split("@", 1)[1].split("/", 1)[1]
    url = AMQP_URL.split("@", 1)[0] + f"@127.0.0.1:{proxy.port}/" + rest
    return s.model_copy(update={"broker_url": url})


def amqp_port() -> int:
    return int(AMQP_URL.split("@", 1)[1].split("/", 1)[0].split(":")[1])


def queued(s: Settings, member: str) -> list[Any]:
    """Every message waiting in ``member``'s queue, taken out (its task, its first argument)."""
    out = []
    with connect(s) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(celery_queue(s, member), no_ack=True)) is not None:
            out.append((message.headers["task"], _first_arg(message)))
    return out


def _first_arg(message: Any) -> Any:
    args = json.loads(message.body)[0]
    return args[0] if args else None


def test_the_message_is_the_one_celery_writes(
    settings: Settings, publishers: list[AmqpPublisher]
) -> None:
    app = make_app(settings)
    name = celery_queue(settings, "w1")
    with connect(settings) as conn:
        conn.ensure_connection(max_retries=1)
        app.amqp.queues[name] = member_queue(name, server_version(conn))
    ours = AmqpPublisher(app, settings)
    publishers.append(ours)
    ours.turn("w1", payload(4))
    assert ours.flush() == 1
    app.send_task(  # Celery's own: kombu's producer, a confirm per message
        TURN_TASK, args=[payload(4)], queue=name, argsrepr=turn_repr(payload(4)), kwargsrepr="{}"
    )
    with connect(settings) as conn:
        channel = conn.default_channel
        mine, celerys = (channel.basic_get(name, no_ack=True) for _ in range(2))
    assert mine is not None and celerys is not None
    for key in ("content_type", "content_encoding", "delivery_mode"):
        assert mine.properties[key] == celerys.properties[key], key
    strip = lambda h: {k: v for k, v in h.items() if k not in FRESH}  # noqa: E731
    assert strip(mine.headers) == strip(celerys.headers)
    assert mine.body == celerys.body
    assert mine.headers["id"] != celerys.headers["id"]


def test_member_queues_are_durable_quorum_queues_under_the_prefix(
    settings: Settings, publishers: list[AmqpPublisher]
) -> None:
    publisher = publisher_of(publishers, settings)
    publisher.turn("w1", payload(1))
    publisher.flush()
    name = celery_queue(settings, "w1")
    assert name.startswith(settings.key_prefix + ":")
    with connect(settings) as conn:
        conn.ensure_connection(max_retries=1)
        assert server_version(conn) >= (3, 8), "this machine's RabbitMQ has quorum queues"
        channel = conn.channel()
        with pytest.raises(amqp.exceptions.PreconditionFailed, match="x-queue-type"):
            args = {"x-expires": QUEUE_EXPIRES_MS}  # the same, but a classic queue
            channel.queue_declare(name, durable=True, auto_delete=False, arguments=args)


def test_a_drain_takes_turns_oldest_first_and_leaves_what_is_not_a_turn(
    settings: Settings,
    publishers: list[AmqpPublisher],
) -> None:
    publisher = publisher_of(publishers, settings)
    for n in range(3):
        publisher.turn("w1", payload(n))
    publisher.add(NOOP_TASK, "w1")
    publisher.turn("w1", payload(9))
    publisher.turn("w2", payload(7))
    assert publisher.flush() == 6
    queue = queue_of_member(settings, "w1", None)
    assert isinstance(queue, AmqpMemberQueue)
    try:
        assert queue.depth() == 5
        assert queue.take_turns(10) == [payload(0), payload(1), payload(2)]
    finally:
        queue.close()
    # The no-op went back (a quorum queue puts it at the end); the turn after it is still there.
    assert sorted(task for task, _ in queued(settings, "w1")) == [NOOP_TASK, TURN_TASK]
    assert queued(settings, "w2") == [(TURN_TASK, payload(7))]
    gone = AmqpQueue(settings, celery_queue(settings, "w1") + "-never-declared")
    try:
        assert gone.depth() == 0 and gone.take(5, TURN_TASK) == []
    finally:
        gone.close()


def test_a_broker_out_of_reach_keeps_the_messages_in_order_for_the_next_flush(
    settings: Settings,
    publishers: list[AmqpPublisher],
) -> None:
    proxy = BlackHoleProxy("127.0.0.1", amqp_port())
    try:
        publisher = publisher_of(publishers, through(proxy, settings))
        publisher.turn("w1", payload(0))
        assert publisher.flush() == 1
        proxy.swallow()  # the connection is open; nothing comes back, nothing goes on
        for n in (1, 2, 3):
            publisher.turn("w1", payload(n))
        with pytest.raises(StoreUnavailable, match="did not confirm"):
            publisher.flush()
        assert [p.body[0][0] for p in publisher.pending] == [payload(1), payload(2), payload(3)]
        proxy.restore()
        assert publisher.flush() == 3
        assert publisher.pending == []
        assert queued(settings, "w1") == [(TURN_TASK, payload(n)) for n in range(4)]
    finally:
        proxy.close()


class DeafProxy(BlackHoleProxy):
    """Passes the client's bytes to the broker but, while deaf, drops the broker's answers:
    a publish that lands and whose confirm never comes back."""

    deaf = False

    def _relay(self, sock: socket.socket) -> None:
        if self.deaf:
            with contextlib.suppress(OSError):
                if sock.getpeername()[:2] == self.upstream:
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        if sock.recv(65536):
                            return  # the broker's answer, into the hole
        super()._relay(sock)


def test_a_lost_confirm_sends_the_message_again_and_loses_none(
    settings: Settings, publishers: list[AmqpPublisher]
) -> None:
    proxy = DeafProxy("127.0.0.1", amqp_port())
    try:
        publisher = publisher_of(publishers, through(proxy, settings))
        publisher.turn("w1", payload(0))
        assert publisher.flush() == 1  # connected, the queue declared
        proxy.deaf = True
        publisher.turn("w1", payload(1))
        with pytest.raises(StoreUnavailable):
            publisher.flush()
        assert [p.body[0][0] for p in publisher.pending] == [payload(1)]
        proxy.deaf = False
        assert publisher.flush() == 1
        got = [arg for _, arg in queued(settings, "w1")]
        # At least once: the first copy landed before its confirm was lost, so it may be
        # there twice (its second copy finds its version stale at the worker), never not at all.
        assert got[0] == payload(0) and set(map(str, got[1:])) == {str(payload(1))}
        assert 1 <= len(got) - 1 <= 2
    finally:
        proxy.close()


def test_a_closed_channel_or_connection_is_opened_again_within_the_flush(
    settings: Settings,
    publishers: list[AmqpPublisher],
) -> None:
    publisher = publisher_of(publishers, settings)
    publisher.turn("w1", payload(0))
    assert publisher.flush() == 1
    publisher._channel.close()  # the broker closed the channel (as after a channel error)
    publisher.turn("w1", payload(1))
    assert publisher.flush() == 1
    assert publisher._conn is not None
    publisher._conn.connection.sock.shutdown(socket.SHUT_RDWR)  # the server restarted
    publisher.turn("w1", payload(2))
    assert publisher.flush() == 1
    assert queued(settings, "w1") == [(TURN_TASK, payload(n)) for n in range(3)]


def test_confirms_count_single_and_multiple_acks_and_nacks() -> None:
    c = _Confirms(5, 9)
    c.answer(6, multiple=True, ok=True)  # 5 and 6
    c.answer(8, multiple=False, ok=False)
    assert not c.settled()
    c.answer(9, multiple=True, ok=True)  # 7 and 9 (8 was answered already)
    assert c.settled()
    assert c.acked >= {5, 6, 7, 9} and c.nacked == {8}


def test_a_broker_that_is_not_there_fails_the_flush_quickly_and_keeps_everything(
    settings: Settings,
    publishers: list[AmqpPublisher],
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once it is closed
    url = AMQP_URL.split("@", 1)[0] + f"@127.0.0.1:{port}//"
    publisher = publisher_of(publishers, settings.model_copy(update={"broker_url": url}))
    publisher.turn("w1", payload(0))
    began = time.monotonic()
    with pytest.raises(StoreUnavailable):
        publisher.flush()
    assert time.monotonic() - began < 10
    assert len(publisher.pending) == 1


def test_a_worker_boot_waits_for_the_broker_a_bounded_while_then_says_why(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = AMQP_URL.split("@", 1)[0] + f"@127.0.0.1:{port}//"
    absent = settings.model_copy(update={"broker_url": url})
    with pytest.raises(OSError):
        probe_queue(absent, celery_queue(absent, "w1"), attempts=2)
    assert "broker not ready for queue" in caplog.text
    queue = probe_queue(settings, celery_queue(settings, "w1"), attempts=2)
    assert queue.queue_arguments["x-queue-type"] == "quorum"


def test_a_queue_deleted_under_the_publisher_is_declared_again_and_loses_nothing(
    settings: Settings, publishers: list[AmqpPublisher]
) -> None:
    publisher = publisher_of(publishers, settings)
    publisher.turn("w1", payload(0))
    assert publisher.flush() == 1
    delete_queues(settings, [celery_queue(settings, "w1")])  # an operator, or x-expires
    publisher.turn("w1", payload(1))
    # Returned unrouted, so not counted as sent; the flush declares the queue again and
    # sends it again.
    assert publisher.flush() == 1 and publisher.pending == []
    assert queued(settings, "w1") == [(TURN_TASK, payload(1))]
