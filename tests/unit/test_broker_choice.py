"""The broker is chosen by the URL's scheme, and each kind gets its own Celery configuration,
queue names and (on RabbitMQ) queue arguments; nothing here connects."""

from __future__ import annotations

import ssl

import pytest

from kernel.errors import InvalidInput
from kernel.settings import Settings
from router.wire import redis_transport
from router.wire.amqp import QUEUE_EXPIRES_MS, member_queue, queue_arguments
from router.wire.broker import BrokerKind, broker_kind, celery_config, celery_queue
from worker.celery_app import TurnConsumer, worker_app

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://h:6379/1", BrokerKind.REDIS),
        ("rediss://h:6380/0", BrokerKind.REDIS),
        ("amqp://u:p@h:5672/v", BrokerKind.AMQP),
        ("amqps://u:p@h:5671/v", BrokerKind.AMQP),
    ],
)
def test_the_scheme_chooses_the_broker(url: str, kind: BrokerKind) -> None:
    assert broker_kind(url) is kind


@pytest.mark.parametrize("url", ["sqs://", "kafka://h", "127.0.0.1:5672", ""])
def test_any_other_broker_is_refused_naming_the_variable(url: str) -> None:
    with pytest.raises(InvalidInput, match="REINS_BROKER_URL"):
        broker_kind(url)
    with pytest.raises(InvalidInput, match="REINS_BROKER_URL"):
        celery_config(Settings.from_env({"REINS_BROKER_URL": url or "x"}))


def test_each_broker_has_its_own_configuration_and_queue_names() -> None:
    redis = Settings.from_env({"REINS_KEY_PREFIX": "acme", "REINS_BROKER_URL": "redis://h/1"})
    amqp = Settings.from_env({"REINS_KEY_PREFIX": "acme", "REINS_BROKER_URL": AMQP})
    on_redis, on_amqp = celery_config(redis), celery_config(amqp)
    assert on_redis["broker_transport_options"]["global_keyprefix"] == "acme:celery:"
    assert "global_keyprefix" not in on_amqp["broker_transport_options"]
    assert on_amqp["broker_transport_options"]["confirm_publish"] is True
    for config in (on_redis, on_amqp):
        assert config["task_acks_late"] and config["worker_prefetch_multiplier"] == 1
    assert celery_queue(redis, "w1") == "reins.turns.w1"  # kombu adds the prefix on Redis
    assert celery_queue(amqp, "w1") == "acme:celery:reins.turns.w1"


def test_quorum_queues_from_rabbitmq_3_8_and_every_declarer_the_same_arguments() -> None:
    assert queue_arguments((3, 7, 28)) == {"x-expires": QUEUE_EXPIRES_MS}
    assert queue_arguments((3, 10, 8)) == {"x-expires": QUEUE_EXPIRES_MS, "x-queue-type": "quorum"}
    queue = member_queue("acme:celery:reins.turns.w1", (4, 0))
    assert queue.durable and not queue.auto_delete
    assert queue.exchange.name == "" and queue.routing_key == queue.name


def test_a_worker_consumes_its_queue_on_the_default_exchange_without_delayed_delivery() -> None:
    settings = Settings.from_env({"REINS_KEY_PREFIX": "acme", "REINS_BROKER_URL": AMQP})
    queue = member_queue(celery_queue(settings, "w1"), (3, 10))
    app = worker_app(settings, lambda payload, redelivered: None, queue)
    assert app.amqp.queues[queue.name].exchange.name == ""  # not bound to "celery"
    assert app.conf.worker_consumer.endswith(":TurnConsumer")
    assert not any("DelayedDelivery" in step for step in TurnConsumer.Blueprint.default_steps)
    assert any("Tasks" in step for step in TurnConsumer.Blueprint.default_steps)


def test_a_redis_broker_takes_reins_transport_and_keeps_tls_on_rediss() -> None:
    plain = celery_config(Settings.from_env({"REINS_BROKER_URL": "redis://h/1"}))
    secure = celery_config(Settings.from_env({"REINS_BROKER_URL": "rediss://h:6380/1"}))
    amqp = celery_config(Settings.from_env({"REINS_BROKER_URL": AMQP}))
    assert plain["broker_transport"] == secure["broker_transport"] == redis_transport.TRANSPORT
    assert "broker_use_ssl" not in plain and "broker_transport" not in amqp
    # Naming the transport turns off kombu's scheme-based TLS: it must be asked for.
    assert secure["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
