"""The worker's Celery app: the fleet's app (:mod:`router.wire.broker`) with the turn task on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer
from kombu.entity import Queue

from kernel.settings import Settings
from router.wire.broker import NOOP_TASK, TURN_TASK, make_app


class TurnConsumer(Consumer):  # type: ignore[misc]  # Celery is untyped
    """Celery's consumer without native delayed delivery. reins sends no countdown or ETA
    task, and once that step sees a quorum queue it declares exchanges and 28 queues shared by
    the whole vhost (``celery_delayed_*``), which a deployment that did not ask for them must
    not find there."""

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc]
        """The consumer's boot steps, less ``DelayedDelivery``."""

        default_steps = frozenset(
            step
            for step in Consumer.Blueprint.default_steps
            if not step.endswith(":DelayedDelivery")
        )


#: A worker's turn handler: (task payload, whether the broker redelivered it) -> None.
TurnHandler = Callable[[dict[str, Any], bool], None]


def worker_app(
    settings: Settings,
    on_turn: TurnHandler,
    queue: str | Queue = "",
    on_noop: Callable[[], None] | None = None,
) -> Celery:
    """The app for ``settings`` with the turn and no-op tasks registered. A ``queue`` given as
    a kombu queue (RabbitMQ: durable, quorum where the server has them) is the one Celery
    declares and consumes under its name, so its arguments are the ones every sender uses.
    ``on_noop`` is called after each no-op task (the benchmark's count)."""
    app = make_app(settings)
    app.conf.worker_consumer = f"{__name__}:TurnConsumer"
    if isinstance(queue, Queue):
        # Set, not ``add``ed: ``add`` would bind it to Celery's default exchange ("celery",
        # shared by the vhost) in place of the default exchange every sender publishes to.
        app.amqp.queues[queue.name] = queue

    def turn(self: Any, payload: dict[str, Any]) -> None:
        """Advance one trajectory by one turn (worker.turn.TurnRunner)."""
        info = self.request.delivery_info or {}
        on_turn(payload, bool(info.get("redelivered")))

    def noop() -> None:
        """Nothing: the baseline of ``reins bench fleet``."""
        if on_noop is not None:
            on_noop()

    register: Any = app.task  # Celery's decorator is untyped
    register(name=TURN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)(turn)
    register(name=NOOP_TASK)(noop)
    return app
