"""Late evidence of a recovered call does not strand the turn that followed it.

A worker paused mid-call (a zombie) wakes after its turn was recovered and the next turn sent
elsewhere; its late reply is settled and quarantined, which commits a new version. The next
turn's message, sent at the version before, must still run: the record is still in the turn it
sent. A message whose own call was carried out stays stale.
"""

from __future__ import annotations

import pytest

from kernel.events import CallModel, ModelReplied, ReplyStatus
from kernel.states import LifecycleState, StopReason
from router.fleet.commits import advance
from router.fleet.observe import RouterObserver
from router.wire.notices import NoticeKind
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders

pytestmark = pytest.mark.redis
S = LifecycleState


def test_a_late_reply_of_a_recovered_call_leaves_the_next_turns_message_current(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 700, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    (first,) = inproc.take()
    (stranded,) = first.commands
    assert isinstance(stranded, CallModel)
    assert inproc.api.recover(inproc.load("acme", tid), by="test"), "its worker is gone"
    inproc.cycle()
    (nxt,) = inproc.take()
    assert nxt.call_id != first.call_id and nxt.version > first.version

    rec = inproc.load("acme", tid)
    late = ModelReplied(
        now=inproc.api.clock(),
        call_id=stranded.call_id,
        status=ReplyStatus.COMPLETED,
        content={"type": "final", "outcome": "completed", "text": "late"},
        latency_s=1.0,
    )
    ctx = inproc.api.agents.context(rec.agent)
    done = advance(inproc.store, rec, late, ctx, RouterObserver())
    assert done.committed and done.result is not None and done.result.quarantined is not None
    assert inproc.load("acme", tid).record_version > nxt.version

    report = inproc.runner.run(nxt)
    assert report.outcome is not NoticeKind.IDLE, report.reason
    assert inproc.runner.run(nxt).outcome is NoticeKind.IDLE, "carried out: now it is stale"
    inproc.run_until_quiet()
    assert inproc.load("acme", tid).stop_reason is StopReason.DONE
