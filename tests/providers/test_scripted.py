"""Scripted providers behind the same protocol, the provider factory, and bounded retries."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tenacity import wait_none

from examples.support_store import LOCAL_SERVER, make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from kernel.agent import ModelRef
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.events import ReplyStatus
from tests.kernel.harness import GOAL, new_record
from tests.providers.conftest import Serve
from tests.providers.fake_replies import Reply
from tests.providers.scripts import policy_script
from worker.embedded import EmbeddedRunner, RunResult
from worker.models import ModelReply, ScriptedModel
from worker.providers import (
    CancelToken,
    OpenAICompatible,
    ProviderConfigError,
    ReplayProvider,
    make_model,
    with_model,
)
from worker.providers.retry import call_with_retries
from worker.recording import Recording, RecordingRunner

FINAL = json.dumps({"type": "final", "outcome": "completed", "text": "Done."})


def run(model: Any) -> RunResult:
    agent = make_agent()
    runner = EmbeddedRunner(KernelContext(agent.profile), model, SupportStoreBackend())
    return runner.run(new_record(Budget()))


def comparable(out: RunResult) -> tuple[bytes, list[dict[str, Any]]]:
    return out.record.to_json(), [r.model_dump() for r in out.rows]


def test_scripted_served_and_replayed_runs_write_the_same_record_and_chain(serve: Serve) -> None:
    server = serve(policy_script(RefundPolicy.from_goal(GOAL)))
    scripted = run(ScriptedModel(RefundPolicy.from_goal(GOAL)))
    tools = list(make_agent().profile.catalog.tools.values())
    served_model = OpenAICompatible(
        base_url=server.base_url,
        model="refund-policy",
        tools=tools,
        latency_header="openai-processing-ms",
    )
    recorder = RecordingRunner(
        KernelContext(make_agent().profile), served_model, SupportStoreBackend()
    )
    served = recorder.start(new_record(Budget()))
    assert recorder.recording is not None
    recording = Recording.model_validate_json(recorder.recording.model_dump_json())
    replayed = run(ReplayProvider(recording))
    assert comparable(served) == comparable(scripted) == comparable(replayed)
    assert len(server.seen) == 5  # the replay called no model


def test_replay_past_the_recording_is_faulted_not_raised() -> None:
    provider = ReplayProvider(Recording(initial="{}"))
    reply = provider.call("{}", 10, 1.0)
    assert reply.status is ReplyStatus.FAULTED and "diverged" in (reply.detail or "")


def test_scripted_model_takes_tools_and_a_cancel_signal() -> None:
    model = ScriptedModel(RefundPolicy())
    tools = list(make_agent().profile.catalog.tools.values())
    view = json.dumps({"plan": [], "facts": {}})
    assert model.call(view, 300, 10.0, tools=tools).status is ReplyStatus.COMPLETED
    token = CancelToken()
    token.set()
    assert model.call(view, 300, 10.0, cancel=token).status is ReplyStatus.CANCELED


# --- the factory -----------------------------------------------------------------------------


def test_the_profile_names_the_provider() -> None:
    scripted = make_agent().profile
    assert isinstance(make_model(scripted, RefundPolicy(), {}), ScriptedModel)
    local = make_model(make_agent(model=LOCAL_SERVER).profile, RefundPolicy(), {})
    assert isinstance(local, OpenAICompatible) and local.base_url == LOCAL_SERVER.base_url
    assert {t.name for t in local.tools} == set(scripted.catalog.tools)


def test_the_key_comes_from_the_variable_the_profile_names(serve: Serve) -> None:
    server = serve([Reply(content=FINAL)])
    ref = ModelRef("openai-compatible", "m", LOCAL_SERVER.price, server.base_url, "TEST_KEY")
    profile = make_agent(model=ref).profile
    with pytest.raises(ProviderConfigError, match="TEST_KEY"):
        make_model(profile, RefundPolicy(), {})
    model = make_model(profile, RefundPolicy(), {"TEST_KEY": "sk-from-env"})
    assert model.call("{}", 300, 5.0).status is ReplyStatus.COMPLETED
    assert server.seen[0].headers["authorization"] == "Bearer sk-from-env"


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"provider": "carrier-pigeon"}, "carrier-pigeon"),
        ({"provider": "openai-compatible"}, "base URL"),
        ({"provider": "openai-compatible", "base_url": "ftp://x"}, "http"),
        ({"provider": "replay"}, "recording"),
    ],
)
def test_unusable_provider_settings_fail_loudly(changes: dict[str, str], match: str) -> None:
    profile = with_model(make_agent().profile, **changes)
    with pytest.raises(ProviderConfigError, match=match):
        make_model(profile, RefundPolicy(), {})


# --- retries: a new attempt, registered before it is sent -------------------------------------


def test_a_transport_failure_is_retried_only_after_the_attempt_is_registered(
    serve: Serve,
) -> None:
    server = serve([Reply(content=FINAL, cut_after=2), Reply(content=FINAL)])
    model = OpenAICompatible(base_url=server.base_url, model="m")
    registered: list[tuple[int, int]] = []

    def register(n: int) -> bool:
        registered.append((n, len(server.seen)))  # what the server had seen at registration
        return True

    replies = call_with_retries(lambda n: model.call("{}", 300, 5.0), register, wait=wait_none())
    assert [r.status for r in replies] == [ReplyStatus.TRANSPORT_FAILURE, ReplyStatus.COMPLETED]
    assert registered == [(2, 1)]  # attempt 2 was registered before its request was sent
    assert len(server.seen) == 2


def test_no_retry_without_registration_nor_for_a_rejection(serve: Serve) -> None:
    server = serve([Reply(content=FINAL, cut_after=2), Reply(status=429)])
    model = OpenAICompatible(base_url=server.base_url, model="m")
    refused = call_with_retries(lambda n: model.call("{}", 300, 5.0), lambda n: False)
    assert [r.status for r in refused] == [ReplyStatus.TRANSPORT_FAILURE]
    rejected = call_with_retries(lambda n: model.call("{}", 300, 5.0), lambda n: True)
    assert [r.status for r in rejected] == [ReplyStatus.REJECTED]
    assert len(server.seen) == 2


def test_retries_are_bounded() -> None:
    failures = iter(ModelReply(status=ReplyStatus.TRANSPORT_FAILURE) for _ in range(10))
    replies = call_with_retries(
        lambda n: next(failures), lambda n: True, max_attempts=3, wait=wait_none()
    )
    assert len(replies) == 3
