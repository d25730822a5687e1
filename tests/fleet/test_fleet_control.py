"""Control reaches a turn wherever it runs; stale messages do nothing, with a logged reason.

Two real Celery workers speak to a local OpenAI-compatible server on loopback, which streams the
first reply slowly. While the stream is in flight on the worker the ring chose, an operator
pauses the trajectory through the router's function in this process: the pause is committed to
the store, its ``CancelCall`` is published, and the worker holding the stream cancels it at
once. The trajectory ends PAUSED with the canceled reply settled and quarantined. Then turn
messages with a stale version and a stale epoch go to the real workers: each is ignored with
its reason in the worker's log, and the record does not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kernel.events import CallModel
from kernel.settings import Settings
from kernel.states import LifecycleState
from ops.local.fleet import LocalFleet
from router.placement.membership import Membership
from router.process.dispatch import placement_key
from router.wire.broker import make_app, send_turn
from router.wire.turns import TurnMessage
from store.redis_store import RedisStore
from tests.fleet.harness import refund_job, seed_orders
from tests.fleet.processes import caller_api, start, stop_all
from tests.providers.fake_provider import FakeOpenAI
from tests.providers.fake_replies import Reply
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
S = LifecycleState
SLOW = Reply(content="thinking " * 110, delay_s=0.05)  # ~250 tokens, about 12 s to stream


@pytest.fixture
def slow_server() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(lambda request, n: SLOW).start()
    yield server
    server.stop()
    assert not server.errors, server.errors


def test_a_pause_stops_a_stream_on_the_worker_that_holds_it_and_stale_messages_do_nothing(
    local_fleet: LocalFleet,
    fleet_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    slow_server: FakeOpenAI,
    tmp_path: Path,
) -> None:
    provider = ["--provider", "openai-compatible", "--base-url", slow_server.base_url]
    # The stream outlasts the tests' short visibility timeout: give this fleet a longer one,
    # as a deployment sets it above its longest turn.
    longer = {"REINS_VISIBILITY_TIMEOUT_S": "60"}
    start(local_fleet, worker_args=[*provider, "--model", "refund-policy"], env=longer)
    api = caller_api(fleet_env, redis_client, "redis", None)
    store = RedisStore(redis_client, prefix=key_prefix)
    oid = seed_orders(redis_client, key_prefix, 100, 1)[0]
    tid = api.submit("acme", refund_job(oid, "examples.support_store:agent")).trajectory_id
    holder = Membership(redis_client, key_prefix).build_ring().lookup(placement_key("acme", tid))
    other = "w1" if holder == "w2" else "w2"
    wait_for(
        lambda: len(slow_server.seen) == 1 and slow_server.seen[0].sent_tokens > 3, 30, "stream"
    )
    streaming = store.load("acme", tid)
    assert streaming.state is S.CALLING_MODEL
    call_id = f"{tid}/m1"

    ack = api.control("acme", tid, "pause", "operator")
    assert ack["admission_stopped"] and ack["outstanding"] == [call_id]

    seen = slow_server.seen[0]
    wait_for(seen.closed.is_set, 10, "the stream to end")
    assert seen.disconnected and not seen.finished, "the worker hung up mid-stream"
    assert seen.sent_tokens < 200
    wait_for(lambda: store.load("acme", tid).operations[call_id].evidence is not None, 10, "fold")
    rec = store.load("acme", tid)
    assert rec.state is S.PAUSED
    op = rec.operations[call_id]
    assert (
        op.evidence is not None
        and op.evidence["quarantined"]
        and op.evidence["status"] == "CANCELED"
    )
    assert f"canceled model call {call_id} on {holder}" in local_fleet.log(holder)
    assert "canceled model call" not in local_fleet.log(other)

    # Stale turn messages, straight to the workers' queues: ignored, with their reasons.
    app = make_app(Settings.from_env(fleet_env))
    before = rec.to_json()
    cmd = CallModel(
        call_id=call_id, attempt_id=f"{call_id}/a1", view="{}", max_output_tokens=1, timeout_s=1
    )
    stale = TurnMessage("acme", tid, streaming.record_version, 0, (cmd,), admitted_at=0.0)
    send_turn(app, other, stale.to_payload())
    epoch = dataclasses.replace(stale, version=rec.record_version, epoch=rec.control_epoch + 7)
    send_turn(app, holder, epoch.to_payload())
    wait_for(lambda: "stale version" in local_fleet.log(other), 15, "the stale version")
    wait_for(lambda: "stale epoch" in local_fleet.log(holder), 15, "the stale epoch")
    assert store.load("acme", tid).to_json() == before, "no record changed"
    assert len(slow_server.seen) == 1, "nothing was sent to the model"

    assert stop_all(local_fleet) == {"r1": 0, "r2": 0, "w1": 0, "w2": 0}
