"""Crash safety: a process killed between registering a write and recording its result.

The backend is a service outside the killed process (Redis); the resume completes the
trajectory from the store alone, and the backend shows exactly one effect.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import redis

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from examples.support_store.state import RedisState
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.record import OpKind
from kernel.states import LifecycleState, StopReason
from kernel.tools import OnUnknown
from store.redis_store import RedisStore
from worker.models import ScriptedModel
from worker.resume import resume

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("rule", [OnUnknown.RESEND, OnUnknown.LOOKUP, OnUnknown.STOP])
def test_killed_between_register_and_result_resumes_with_one_effect(
    rule: OnUnknown, redis_client: redis.Redis, key_prefix: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.crash_runner", key_prefix, "t-crash", rule.value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    store = RedisStore(redis_client, prefix=key_prefix)
    stranded = store.load("acme", "t-crash")
    assert stranded.state is LifecycleState.WAITING_TOOL
    refund = next(op for op in stranded.operations.values() if op.tool == "issue_refund")
    assert refund.kind is OpKind.TOOL and refund.open, "checkpointed as in flight before dispatch"
    assert refund.attempts[0] in stranded.ledger.reservations
    backend = SupportStoreBackend(RedisState(redis_client, key_prefix, seed=False))
    assert backend.effects() == [["refund", "ord_1001", 3000]], "the write happened once"

    agent = make_agent(on_unknown=rule, budget=Budget(deadline_s=120))
    out = resume(
        store,
        "acme",
        "t-crash",
        KernelContext(agent.profile),
        ScriptedModel(RefundPolicy()),
        backend,
        worker="dead-worker",
    )
    final = store.load("acme", "t-crash")
    assert final == out.record
    if rule is OnUnknown.STOP:
        assert final.stop_reason is StopReason.UNKNOWN_OUTCOME
        assert backend.effects() == [["refund", "ord_1001", 3000]]
    else:
        assert final.stop_reason is StopReason.DONE
        assert backend.effects() == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
        assert final.ledger.reservations == {}, "the resend or lookup settled the write"
