"""The router's task publisher writes the message Celery would write, and workers read it.

One contract for both senders: the same task sent through Celery's ``send_task`` (kombu's
producer) and through :class:`worker.celery_app.TaskPublisher` lands in the queue's list as
envelopes that differ only in their fresh ids; the drain's hand-back reads both alike. Every
process test of the fleet (routers publish this way) shows a real worker carrying them out.
"""

from __future__ import annotations

import base64
import json
import socket
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kernel.errors import StoreUnavailable
from kernel.settings import Settings
from router.wire.broker import (
    NOOP_TASK,
    TURN_TASK,
    TaskPublisher,
    broker_keyprefix,
    make_app,
    queue_for,
    send_turn,
    take_queued_turns,
)
from tests.conftest import REDIS_URL

PAYLOAD = {"tenant": "acme", "trajectory_id": "t9", "version": 4, "commands": [{"a": [1, "é"]}]}
FRESH = {"id", "root_id", "correlation_id", "delivery_tag"}  # new for every message


def _settings(prefix: str) -> Settings:
    return Settings.from_env({"REINS_KEY_PREFIX": prefix, "REINS_BROKER_URL": REDIS_URL})


def _without_fresh(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_fresh(v) for k, v in node.items() if k not in FRESH}
    return node


def _fresh(envelope: dict[str, Any]) -> list[Any]:
    h, p = envelope["headers"], envelope["properties"]
    return [h["id"], h["root_id"], p["correlation_id"], p["delivery_tag"]]


@pytest.mark.parametrize("task", [TURN_TASK, NOOP_TASK])
def test_the_envelope_is_the_one_celery_writes(
    redis_client: redis.Redis, key_prefix: str, task: str
) -> None:
    settings = _settings(key_prefix)
    app = make_app(settings)
    ours = TaskPublisher(app, redis_client, settings)
    if task == TURN_TASK:
        send_turn(app, "w1", PAYLOAD)  # Celery's send_task, through kombu's producer
        ours.turn("w1", PAYLOAD)
    else:
        app.send_task(NOOP_TASK, args=[], queue=queue_for("w1"), argsrepr="[]", kwargsrepr="{}")
        ours.add(NOOP_TASK, "w1")
    assert ours.flush() == 1
    key = broker_keyprefix(settings) + queue_for("w1")
    raw_ours, raw_celery = redis_client.lrange(key, 0, -1)  # pushed on the left: newest first
    ours_env, celery_env = json.loads(raw_ours), json.loads(raw_celery)

    assert _without_fresh(ours_env) == _without_fresh(celery_env)
    assert list(ours_env["headers"]) == list(celery_env["headers"])  # same fields, same order
    assert list(ours_env["properties"]) == list(celery_env["properties"])
    ids = _fresh(ours_env)
    assert ids[0] == ids[1] == ids[2] and ids[3] != ids[0]  # as Celery sets them
    assert ids[0] not in _fresh(celery_env)
    body = json.loads(base64.b64decode(ours_env["body"]))
    assert body == json.loads(base64.b64decode(celery_env["body"]))
    assert body[0] == ([PAYLOAD] if task == TURN_TASK else [])
    assert ours_env["headers"]["task"] == task


def test_a_drain_takes_published_turns_back_oldest_first(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    settings = _settings(key_prefix)
    publisher = TaskPublisher(make_app(settings), redis_client, settings)
    for version in (1, 2, 3):
        publisher.turn("w2", {**PAYLOAD, "version": version})
    publisher.turn("w1", PAYLOAD)
    assert publisher.flush() == 4
    taken = take_queued_turns(redis_client, settings, "w2", 10)
    assert [p["version"] for p in taken] == [1, 2, 3]
    assert take_queued_turns(redis_client, settings, "w1", 10) == [PAYLOAD]
    assert publisher.flush() == 0  # nothing buffered: no round trip, nothing pushed


def test_a_broker_out_of_reach_keeps_the_messages_for_the_next_flush(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    settings = _settings(key_prefix)
    app = make_app(settings)
    gone = redis.Redis(
        host="127.0.0.1", port=_closed_port(), retry=Retry(NoBackoff(), 0)
    )  # as the router builds it: the publisher does the retrying
    publisher = TaskPublisher(app, gone, settings)
    publisher.turn("w1", {**PAYLOAD, "version": 1})
    publisher.turn("w1", {**PAYLOAD, "version": 2})
    with pytest.raises(StoreUnavailable, match="sending 2 task messages"):
        publisher.flush()
    assert len(publisher.pending) == 2, "kept, in order, for the next flush"
    publisher.client = redis_client  # the broker is back
    publisher.turn("w1", {**PAYLOAD, "version": 3})
    assert publisher.flush() == 3
    taken = take_queued_turns(redis_client, settings, "w1", 10)
    assert [p["version"] for p in taken] == [1, 2, 3]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
