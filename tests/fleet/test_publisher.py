"""The router's turn publisher writes the message kombu would write, and workers read it.

One contract for both senders: the same payload sent through Celery's ``send_task`` (kombu's
producer) and through :class:`worker.celery_app.TurnPublisher` lands in the queue's list as
envelopes that differ only in their fresh ids; the drain's hand-back reads both alike. Every
process test of the fleet (routers publish this way) shows a real worker carrying them out.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import redis

from kernel.settings import Settings
from tests.conftest import REDIS_URL
from worker.celery_app import (
    TURN_TASK,
    BatchSender,
    TurnPublisher,
    broker_keyprefix,
    make_app,
    queue_for,
    take_queued_turns,
)

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


def test_the_envelope_is_the_one_kombu_writes(redis_client: redis.Redis, key_prefix: str) -> None:
    settings = _settings(key_prefix)
    app = make_app(settings)
    celery_sent = BatchSender(app)
    celery_sent.turn("w1", PAYLOAD)
    celery_sent.flush()
    ours = TurnPublisher(app, redis_client, settings)
    ours.turn("w1", PAYLOAD)
    assert ours.flush() == 1
    key = broker_keyprefix(settings) + queue_for("w1")
    raw_ours, raw_kombu = redis_client.lrange(key, 0, -1)  # pushed on the left: newest first
    ours_env, kombu_env = json.loads(raw_ours), json.loads(raw_kombu)

    assert _without_fresh(ours_env) == _without_fresh(kombu_env)
    assert list(ours_env["headers"]) == list(kombu_env["headers"])  # same fields, same order
    assert list(ours_env["properties"]) == list(kombu_env["properties"])
    ids = _fresh(ours_env)
    assert ids[0] == ids[1] == ids[2] and ids[3] != ids[0]  # as Celery sets them
    assert ids[0] not in _fresh(kombu_env)
    body = json.loads(base64.b64decode(ours_env["body"]))
    assert body == json.loads(base64.b64decode(kombu_env["body"]))
    assert body[0] == [PAYLOAD] and ours_env["headers"]["task"] == TURN_TASK


def test_a_drain_takes_published_turns_back_oldest_first(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    settings = _settings(key_prefix)
    publisher = TurnPublisher(make_app(settings), redis_client, settings)
    for version in (1, 2, 3):
        publisher.turn("w2", {**PAYLOAD, "version": version})
    publisher.turn("w1", PAYLOAD)
    assert publisher.flush() == 4
    taken = take_queued_turns(redis_client, settings, "w2", 10)
    assert [p["version"] for p in taken] == [1, 2, 3]
    assert take_queued_turns(redis_client, settings, "w1", 10) == [PAYLOAD]
    assert publisher.flush() == 0  # nothing buffered: no round trip, nothing pushed
