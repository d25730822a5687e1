"""Submission and control through the router's functions: the tenant comes from the caller,
and bad input is refused with its reason and changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from kernel.errors import (
    IllegalTransition,
    InvalidInput,
    SnapshotNotFound,
    SubmissionRefused,
    UnknownAgent,
)
from kernel.states import LifecycleState
from router.fleet import config as fleet_config
from tests.fleet.conftest import FLEET_AGENTS, WEIGHTS, tenants_toml
from tests.fleet.harness import InProcessFleet, refund_job

pytestmark = pytest.mark.redis
S = LifecycleState


def snapshot(inproc: InProcessFleet) -> dict[str, Any]:
    """Everything a submission could change: records per tenant, queues, the feed."""
    admitter: Any = inproc.service.dispatcher.admitter
    return {
        "records": {t: inproc.store.list(t) for t in WEIGHTS},
        "admitted": admitter.admitted(),
        "depths": [t.queue_depth for t in admitter.figures().tenants],
        "feed": inproc.feed.depth(),
    }


def test_a_job_becomes_one_ready_record_of_the_callers_tenant(inproc: InProcessFleet) -> None:
    done = inproc.api.submit("globex", {**refund_job("ord_1"), "trajectory_id": "job-1"})
    rec = inproc.load("globex", "job-1")
    assert (rec.tenant, rec.record_version, rec.state) == ("globex", 1, S.READY)
    assert done.trajectory_id == "job-1" and inproc.service.dispatcher.admitter.is_queued("job-1")
    with pytest.raises(SnapshotNotFound):
        inproc.load("acme", "job-1")


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    """The fleet's tenants, allowed two agents that cannot run as well: the fleet lists them,
    so a submission naming one is refused for what it is."""
    path = tmp_path / "tenants.toml"
    unrunnable = ("examples.nowhere:agent", "examples.support_store:nothing")
    path.write_text(tenants_toml(agents=(*FLEET_AGENTS, *unrunnable)))
    return path


@pytest.mark.parametrize(
    ("tenant", "job", "error", "reason"),
    [
        ("acme", {"agent": "examples.nowhere:agent"}, UnknownAgent, "cannot be imported"),
        ("acme", {"agent": "examples.support_store:nothing"}, UnknownAgent, "no agent named"),
        ("acme", {"budget": {"max_steps": 41}}, SubmissionRefused, "maximum of 40"),
        ("acme", {"budget": {"max_stepz": 3}}, InvalidInput, "unknown budget key"),
        ("acme", {"tenant": "initech"}, SubmissionRefused, "tenant comes from the caller"),
        ("acme", {"goal": ""}, SubmissionRefused, "goal"),
        ("acme", {"colour": "red"}, SubmissionRefused, "colour"),
        ("umbrella", {}, InvalidInput, "not configured"),
    ],
)
def test_bad_jobs_are_refused_with_a_reason_and_change_nothing(
    inproc: InProcessFleet,
    redis_client: redis.Redis,
    key_prefix: str,
    tenant: str,
    job: dict[str, Any],
    error: type[Exception],
    reason: str,
) -> None:
    before = snapshot(inproc)
    keys = set(redis_client.scan_iter(match=f"*{key_prefix}*"))  # SCAN may repeat a key
    with pytest.raises(error, match=reason):
        inproc.api.submit(tenant, {**refund_job("ord_1"), **job})
    assert snapshot(inproc) == before
    assert set(redis_client.scan_iter(match=f"*{key_prefix}*")) == keys, "no key written"


def test_a_duplicate_trajectory_id_is_refused_and_the_first_is_untouched(
    inproc: InProcessFleet,
) -> None:
    inproc.api.submit("acme", {**refund_job("ord_1"), "trajectory_id": "dup"})
    first = inproc.load("acme", "dup").to_json()
    with pytest.raises(SubmissionRefused, match="already exists"):
        inproc.api.submit("acme", {**refund_job("ord_2"), "trajectory_id": "dup"})
    assert inproc.load("acme", "dup").to_json() == first


def test_control_requests_the_kernel_refuses_change_nothing(inproc: InProcessFleet) -> None:
    tid = inproc.api.submit("acme", refund_job("ord_1")).trajectory_id
    before = inproc.load("acme", tid).to_json()
    with pytest.raises(InvalidInput, match="unknown control"):
        inproc.api.control("acme", tid, "explode", "ops")
    with pytest.raises(SnapshotNotFound):
        inproc.api.control("globex", tid, "pause", "ops")  # another tenant's trajectory
    with pytest.raises(IllegalTransition, match="not paused"):
        inproc.api.control("acme", tid, "resume", "ops")
    assert inproc.load("acme", tid).to_json() == before


def test_a_tenants_file_is_applied_as_the_document_and_config_apply_still_reaches_the_router(
    inproc: InProcessFleet, redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    """``--tenants FILE`` is ``reins config apply FILE`` at boot: the router then runs by the
    document and follows its later versions, as every deployed router does."""
    booted = fleet_config.stored_version(redis_client, key_prefix)
    assert booted >= 1, "the router applied its file as the fleet's document"
    assert fleet_config.apply_file(redis_client, key_prefix, tenants_file) == booted, (
        "a second process booting with the same file applies nothing new"
    )
    assert inproc.service.config.tenant("umbrella") is None
    document = fleet_config.read_file(tenants_file)
    document["tenants"].append({**document["tenants"][0], "name": "umbrella"})
    version = fleet_config.apply(redis_client, key_prefix, document)
    assert inproc.service.live.tick(), "the router took the operator's new version"
    assert inproc.service.live.applied.version == version
    assert inproc.service.config.tenant("umbrella") is not None
