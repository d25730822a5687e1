"""A process that runs the refund on the shared Redis and SIGKILLs itself mid-write.

Usage: python -m tests.integration.crash_runner PREFIX TRAJECTORY_ID RULE
The refund takes effect in the shared backend; the process dies before the result is recorded.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import redis

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from examples.support_store.state import RedisState
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from kernel.tools import OnUnknown
from store.redis_store import RedisStore
from worker.models import ScriptedModel
from worker.resume import start

URL = os.environ.get("REINS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


class DiesAfterTheRefund(SupportStoreBackend):
    """The refund happens, then the process is killed before it can report."""

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        result = super().call(user, tool, args, key, timeout_s, approval, fence=fence)
        if tool == "issue_refund":
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def main() -> None:
    prefix, tid, rule = sys.argv[1], sys.argv[2], OnUnknown(sys.argv[3])
    client = redis.Redis.from_url(URL)
    budget = Budget(deadline_s=120)
    agent = make_agent(on_unknown=rule, budget=budget)
    rec = TrajectoryRecord.create(
        trajectory_id=tid,
        tenant="acme",
        user="cu_ana",
        goal="refund the damaged item on order ord_1001",
        agent="examples.support_store:agent",
        budget=budget,
        now=0.0,
    )
    store = RedisStore(client, prefix=prefix)
    backend = DiesAfterTheRefund(RedisState(client, prefix))
    start(store, rec, KernelContext(agent.profile), ScriptedModel(RefundPolicy()), backend)


if __name__ == "__main__":
    main()
