"""A turn's notice that cannot be pushed is kept and pushed again: nothing is left in custody.

On the real Redis: the push fails while the feed cannot be written, the custody entry stays,
and the next heartbeat's ``push_kept`` delivers the notice and releases the entry, oldest first.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from router.wire.custody import Custody
from router.wire.feed import Feed
from router.wire.notices import Notice, NoticeKind
from router.wire.turns import TurnMessage
from worker.turn_ending import TurnEnding

pytestmark = pytest.mark.redis


class Flaky(Feed):
    """A feed whose pushes fail while ``down`` is set, as Redis out of reach does."""

    down = True

    def push(self, *notices: Notice, pipeline: Any = None) -> None:
        if self.down:
            raise redis.ConnectionError("Redis is restarting")
        super().push(*notices, pipeline=pipeline)


def message(tid: str, version: int) -> TurnMessage:
    return TurnMessage("acme", tid, version, 0, (), admitted_at=1.0)


def test_a_failed_push_is_kept_and_its_custody_released_once_redis_answers(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    feed, custody = Flaky(redis_client, key_prefix), Custody(redis_client, key_prefix)
    ending = TurnEnding(feed, "w1", custody, None)
    msgs = [message(f"t{i}", 3) for i in range(3)]
    for msg in msgs:
        custody.note("w1", msg.to_payload())
    custody.flush()
    for msg in msgs:
        ending.notify(msg, Notice(NoticeKind.READY, "acme", msg.trajectory_id, 5))
    assert len(custody.entrusted_to("w1")) == 3, "nothing released while nothing was pushed"
    assert ending.push_kept() == 0, "still down: kept, in order"
    feed.down = False
    assert ending.push_kept() == 3 and ending.push_kept() == 0
    assert custody.entrusted_to("w1") == []
    router = Feed(redis_client, key_prefix, router="r1")
    router.create_groups()
    assert [n.trajectory_id for n in router.take(10)] == ["t0", "t1", "t2"]
