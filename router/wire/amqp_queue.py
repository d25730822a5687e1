"""A member's RabbitMQ queue as its worker reads it: its depth, and its turns taken out."""

from __future__ import annotations

import json
import threading
from typing import Any

import amqp

from kernel.settings import Settings
from router.wire.amqp import Connection, close_connection, connect, discard_connection


class AmqpQueue:
    """One member's queue, read by its worker: its depth, and taking its turns out (a drain
    whose grace ran out). Thread-safe (the heartbeat and the drain share it); a call that fails
    drops the connection, and the next one connects again."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings, self.name = settings, name
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def depth(self) -> int:
        """Messages ready in the queue (not those a consumer holds); 0 if it is not there."""
        with self._lock:
            try:
                channel = self._channel()
                ok = channel.queue_declare(self.name, passive=True)
                return int(ok.message_count)
            except amqp.exceptions.NotFound:
                self._reset()
                return 0
            except BaseException:
                self._reset()
                raise

    def take(self, limit: int, wanted: str) -> list[Any]:
        """Take up to ``limit`` messages of task ``wanted`` out of the queue, oldest first: the
        first argument of each. A message of another task goes back (to the end of a quorum
        queue) and taking stops there."""
        out: list[Any] = []
        with self._lock:
            try:
                channel = self._channel()
                while len(out) < limit:
                    message = channel.basic_get(self.name, no_ack=False)
                    if message is None:
                        break
                    args = _turn_args(message, wanted)
                    if args is None:
                        channel.basic_reject(message.delivery_tag, requeue=True)
                        break
                    out.append(args)
                    channel.basic_ack(message.delivery_tag)
            except amqp.exceptions.NotFound:
                self._reset()
            except BaseException:
                self._reset()
                raise
        return out

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            conn, self._conn = self._conn, None
            close_connection(conn)

    def _channel(self) -> Any:
        if self._conn is None:
            conn = connect(self.settings)
            try:
                conn.connect()
            except BaseException:
                discard_connection(conn)
                raise
            self._conn = conn
        return self._conn.default_channel

    def _reset(self) -> None:
        conn, self._conn = self._conn, None
        discard_connection(conn)


def _turn_args(message: Any, wanted: str) -> Any:
    """The first argument of a task message of task ``wanted`` (None for any other message)."""
    headers = getattr(message, "headers", None) or message.properties.get("application_headers")
    if not headers or headers.get("task") != wanted:
        return None
    try:
        body = json.loads(message.body)
        return body[0][0]
    except (ValueError, IndexError, TypeError, KeyError):
        return None
