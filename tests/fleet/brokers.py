"""The brokers the fleet tests run on: the store's Redis, or the machine's RabbitMQ.

A fleet on RabbitMQ names its member queues under the test's key prefix
(``<prefix>:celery:reins.turns.<member>``); :func:`delete_member_queues` deletes exactly those
of the members the test started, so a test never touches a queue it did not create.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import pytest

from kernel.settings import Settings
from router.wire.amqp import connect, delete_queues
from router.wire.broker import BrokerKind, broker_kind, celery_queue

AMQP_URL = os.environ.get("REINS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def require_rabbitmq() -> None:
    """Fail the test, saying how to start it, unless RabbitMQ answers at ``AMQP_URL``."""
    settings = Settings.from_env({"REINS_BROKER_URL": AMQP_URL})
    try:
        with connect(settings) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        pytest.fail(f"RabbitMQ is not answering at {AMQP_URL}: run 'make rabbitmq' ({exc})")


def delete_member_queues(env: Mapping[str, str], members: Iterable[str]) -> None:
    """On a RabbitMQ fleet of ``env``, delete the queues of ``members`` (under its prefix)."""
    url = env.get("REINS_BROKER_URL", "")
    if not url or broker_kind(url) is not BrokerKind.AMQP:
        return
    settings = Settings.from_env(
        {"REINS_BROKER_URL": url, "REINS_KEY_PREFIX": env["REINS_KEY_PREFIX"]}
    )
    delete_queues(settings, [celery_queue(settings, m) for m in members])
