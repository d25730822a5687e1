"""The OpenTelemetry tracer alone: what turns it on, what a span holds, what it never holds.

The SDK is the real one; only its exporter is the SDK's in-memory one (the fleet test,
tests/fleet/test_traces.py, exports over OTLP/HTTP to a receiver on loopback).
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel.chain import ChainRow, RowKind
from kernel.context import StepResult
from kernel.errors import ConfigError
from kernel.events import CallModel
from kernel.record import TrajectoryRecord
from ops.observability.tracing import CONTENT_VAR, OtelTracer, TraceSettings, otel_tracer, traced
from router.fleet.tracing import NO_TRACER, root_span_id_of, trace_id_of
from router.wire.turns import TurnMessage

ENDPOINT = "http://127.0.0.1:4318"


def tracer(content: bool = False) -> tuple[OtelTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return otel_tracer(SimpleSpanProcessor(exporter), content), exporter


def message(trace: str = "") -> TurnMessage:
    call = CallModel(call_id="c1", attempt_id="a1", view="", max_output_tokens=5, timeout_s=1)
    return TurnMessage("acme", "t1", 3, 0, (call,), 100.0, trace=trace)


def row(kind: RowKind, index: int, **fields: object) -> ChainRow:
    base = {"trajectory_id": "t1", "tenant": "acme", "user": "u", "index": index, "step": 1}
    return ChainRow.model_validate(
        {**base, "kind": kind, "record_version": 4, "at": 200.0, **fields}
    )


def test_off_unless_an_otlp_endpoint_is_configured() -> None:
    assert TraceSettings.from_env({}).endpoint == ""
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}
    assert TraceSettings.from_env(on).endpoint == ENDPOINT
    assert TraceSettings.from_env({**on, "OTEL_SDK_DISABLED": "true"}).endpoint == ""
    assert TraceSettings.from_env({**on, "OTEL_TRACES_EXPORTER": "none"}).endpoint == ""
    assert not TraceSettings.from_env(on).content
    with traced({}, "reins-worker", "w1") as none:
        assert none is None
    assert not NO_TRACER.enabled and NO_TRACER.admitted(None, 0.0, "r1") == ""  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        (CONTENT_VAR, "yes"),
    ],
)
def test_a_setting_reins_cannot_honour_is_refused_naming_it(var: str, value: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, var: value}
    with pytest.raises(ConfigError, match=var):
        TraceSettings.from_env(env)


def test_the_turn_joins_the_admission_the_message_names_and_never_a_foreign_trace() -> None:
    t, exporter = tracer()
    rec = TrajectoryRecord.model_construct(tenant="acme", trajectory_id="t1", turn=2, agent="a:b")
    carried = t.admitted(rec, 99.0, "r1")
    with t.turn(message(carried), "w1"):
        pass
    foreign = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    with t.turn(message(foreign), "w2"):
        pass
    admit, joined, alone = exporter.get_finished_spans()
    trace_id = trace_id_of("acme", "t1")
    assert {s.context.trace_id for s in (admit, joined, alone)} == {trace_id}
    assert admit.parent.span_id == root_span_id_of("acme", "t1")
    assert joined.parent.span_id == admit.context.span_id
    assert alone.parent.span_id == root_span_id_of("acme", "t1")  # the foreign id ignored


@pytest.mark.parametrize("content", [False, True])
def test_call_spans_carry_genai_attributes_and_content_only_when_asked(content: bool) -> None:
    t, exporter = tracer(content)
    tool = row(RowKind.TOOL, 1, call_id="k1", tool="refund", args={"card": "4111", "n": 1})
    model = row(RowKind.MODEL, 0, call_id="c1", outcome="COMPLETED", tokens_in=7, tokens_out=3)
    model = model.model_copy(update={"duration_s": 0.5})
    with t.turn(message(), "w1"):
        t.committed(StepResult(record=None, rows=[model, tool]), "scripted/m1")  # type: ignore[arg-type]
    chat, call, _turn = exporter.get_finished_spans()
    assert chat.name == "chat m1"
    assert chat.attributes is not None and call.attributes is not None
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "m1"
    assert chat.attributes["gen_ai.provider.name"] == "scripted"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 7
    assert chat.attributes["gen_ai.usage.output_tokens"] == 3
    assert (chat.end_time or 0) - (chat.start_time or 0) == 500_000_000
    assert call.attributes["gen_ai.tool.name"] == "refund"
    assert chat.parent.span_id == _turn.context.span_id
    args = call.attributes.get("gen_ai.tool.call.arguments")
    if content:
        assert args == '{"card": "[redacted]", "n": 1}'  # sensitive fields still redacted
    else:
        assert args is None and "reins.arguments" not in call.attributes


def test_the_sdks_own_bad_value_fails_the_boot_as_a_config_error() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
        "OTEL_BSP_MAX_QUEUE_SIZE": "8",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        with pytest.raises(ConfigError, match="max_export_batch_size"), traced(env, "s", "i"):
            pass
