"""The worker's Celery app: the fleet's app (:mod:`router.broker`) with the turn task on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

from kernel.settings import Settings
from router.broker import NOOP_TASK, TURN_TASK, make_app

#: A worker's turn handler: (task payload, whether the broker redelivered it) -> None.
TurnHandler = Callable[[dict[str, Any], bool], None]


def worker_app(settings: Settings, on_turn: TurnHandler) -> Celery:
    """The app for ``settings`` with the turn and no-op tasks registered."""
    app = make_app(settings)

    def turn(self: Any, payload: dict[str, Any]) -> None:
        """Advance one trajectory by one turn (worker.turn.TurnRunner)."""
        info = self.request.delivery_info or {}
        on_turn(payload, bool(info.get("redelivered")))

    def noop() -> None:
        """Nothing: the baseline of ``reins bench fleet``."""

    register: Any = app.task  # Celery's decorator is untyped
    register(name=TURN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)(turn)
    register(name=NOOP_TASK)(noop)
    return app
