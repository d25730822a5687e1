"""Traces of a real fleet, as a collector receives them over OTLP/HTTP.

One router and two worker processes export to a receiver this test runs on loopback
(:mod:`tests.support.otlp`, which decodes the protobuf payload). Every turn goes through the
router (no follow-on turns), so each turn's span must be the child of the router's admission
span named by its turn message. Each trajectory must come out as exactly one trace: one root
(the trajectory's own span, at its stop), spans from at least two processes, one model-call
span per model row of its execution chain with the GenAI attributes and the chain's token
counts, one tool span per tool row, and no content (arguments) by default.
"""

from __future__ import annotations

import socket
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel.chain import RowKind
from ops.local.fleet import LocalFleet
from ops.observability.metrics import Metrics
from ops.observability.tracing import otel_tracer
from router.fleet.tracing import root_span_id_of, trace_id_of
from store.redis_store import RedisStore
from tests.fleet.conftest import WEIGHTS
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders, submit_refunds
from tests.fleet.processes import caller_api, start, stop_all, wait_all_ended
from tests.support import wait_for
from tests.support.otlp import OtlpReceiver, ReceivedSpan, receiver

pytestmark = pytest.mark.redis
TRAJECTORIES = 6


@pytest.fixture
def collector() -> Iterator[OtlpReceiver]:
    yield from receiver()


def by_trace(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    out: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for s in spans:
        out[s.trace_id].append(s)
    return out


def test_each_trajectory_is_one_trace_across_router_and_worker_processes(
    local_fleet: LocalFleet,
    fleet_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    collector: OtlpReceiver,
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: spans leave soon after they end
        "REINS_FOLLOW_ON_TURNS": "0",  # every turn through the router: a message per turn
    }
    start(local_fleet, routers=["r1"], env=env)
    api = caller_api(fleet_env, redis_client, "redis", None)
    ids = submit_refunds(api, seed_orders(redis_client, key_prefix, 900, TRAJECTORIES), [*WEIGHTS])
    store = RedisStore(redis_client, prefix=key_prefix)
    wait_all_ended(store, ids, 120, local_fleet)
    chains = {tid: store.read(tenant, tid) for tenant, tid in ids}
    wanted = {
        format(trace_id_of(tenant, tid), "032x"): (tenant, tid, chains[tid]) for tenant, tid in ids
    }

    def all_received() -> bool:
        traces = by_trace(collector.taken())
        for trace_id, (_, _, chain) in wanted.items():
            spans = traces.get(trace_id, [])
            calls = sum(1 for s in spans if s.name.startswith(("chat", "execute_tool")))
            rows = sum(1 for r in chain if r.kind in (RowKind.MODEL, RowKind.TOOL))
            if calls < rows or not any(not s.parent_span_id for s in spans):
                return False
        return True

    wait_for(all_received, 30, "every trajectory's spans at the receiver")
    assert all(code == 0 for code in stop_all(local_fleet).values())
    traces = by_trace(collector.taken())

    for trace_id, (tenant, tid, chain) in wanted.items():
        spans = traces[trace_id]
        where = f"trace of {tenant}/{tid}"
        # one trace: every span naming this trajectory is in it, and it holds no other's
        assert {s.attributes.get("reins.trajectory_id") for s in spans} == {tid}, where
        assert {s.attributes.get("reins.tenant") for s in spans} == {tenant}, where
        roots = [s for s in spans if not s.parent_span_id]
        assert len(roots) == 1, where
        root = roots[0]
        assert root.span_id == format(root_span_id_of(tenant, tid), "016x")
        assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
        stop = next(r for r in chain if r.kind is RowKind.STOP)
        assert root.attributes["reins.stop_reason"] == stop.outcome
        known = {s.span_id for s in spans}
        assert all(s.parent_span_id in known for s in spans if s.parent_span_id), where
        # spans from more than one process: the router admits, a worker runs the turn
        assert len({s.process for s in spans}) >= 2, where
        admits = {s.span_id: s for s in spans if s.name == "reins.admit"}
        turns = [s for s in spans if s.name == "reins.turn"]
        assert admits and turns, where
        for turn in turns:  # the context came with the turn message, from another process
            parent = admits.get(turn.parent_span_id)
            assert parent is not None, f"{where}: a turn span not under an admission span"
            assert parent.process != turn.process
            assert parent.resource["service.name"] == "reins-router"
            assert turn.resource["service.name"] == "reins-worker"
        by_id = {s.span_id: s for s in spans}
        # a span per model call and per tool call, under the turn that made it
        chats = sorted(
            (s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"),
            key=lambda s: s.attributes["reins.call_id"],
        )
        model_rows = sorted(
            (r for r in chain if r.kind is RowKind.MODEL), key=lambda r: r.call_id or ""
        )
        assert [s.attributes["reins.call_id"] for s in chats] == [r.call_id for r in model_rows]
        for span, row in zip(chats, model_rows, strict=True):
            assert by_id[span.parent_span_id].name == "reins.turn"
            assert span.attributes["gen_ai.request.model"] == "refund-policy"
            assert span.attributes["gen_ai.provider.name"] == "scripted"
            assert span.attributes["gen_ai.usage.input_tokens"] == row.tokens_in > 0
            assert span.attributes["gen_ai.usage.output_tokens"] == row.tokens_out
        tools = Counter(
            s.attributes["gen_ai.tool.name"]
            for s in spans
            if s.attributes.get("gen_ai.operation.name") == "execute_tool"
        )
        assert tools == Counter(r.tool for r in chain if r.kind is RowKind.TOOL), where
        # content is off by default: no arguments in any span
        assert not any(
            k in s.attributes
            for s in spans
            for k in ("gen_ai.tool.call.arguments", "reins.arguments")
        )


def test_a_collector_that_never_answers_fails_no_turn_and_no_exit(
    local_fleet: LocalFleet,
    fleet_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    """A collector that accepts connections and never replies: every export hangs until its
    timeout, on the exporter's thread; every trajectory still ends and every process exits 0."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)  # connections queue in the kernel; nothing reads them
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_BSP_MAX_QUEUE_SIZE": "64",  # full soon: spans are dropped, not waited for
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "16",
        }
        start(local_fleet, routers=["r1"], env=env)
        api = caller_api(fleet_env, redis_client, "redis", None)
        orders = seed_orders(redis_client, key_prefix, 950, TRAJECTORIES)
        ids = submit_refunds(api, orders, [*WEIGHTS])
        store = RedisStore(redis_client, prefix=key_prefix)
        wait_all_ended(store, ids, 120, local_fleet)
        assert all(store.load(t, i).stop_reason is not None for t, i in ids)
        assert all(code == 0 for code in stop_all(local_fleet).values())


def test_a_run_the_router_ends_gets_its_root_span_from_the_router(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    """The trajectory's own span comes from whichever process commits the stop: here the
    router's admission, which ends a run whose step budget is 0 before any turn."""
    exporter = InMemorySpanExporter()
    observer = Metrics(process_metrics=False)
    observer.tracer = otel_tracer(SimpleSpanProcessor(exporter))
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, observer=observer)
    (order,) = seed_orders(redis_client, key_prefix, 990, 1)
    job = {**refund_job(order), "budget": {"max_steps": 0}}
    tid = fleet.api.submit("acme", job).trajectory_id
    fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert rec.stop_reason is not None
    (root,) = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert root.context.trace_id == trace_id_of("acme", tid)
    assert root.context.span_id == root_span_id_of("acme", tid)
    assert root.attributes is not None
    assert root.attributes["reins.stop_reason"] == rec.stop_reason.value
