"""Traces: OpenTelemetry spans of the fleet's work, exported over OTLP/HTTP when configured.

:func:`traced` builds a process's :class:`OtelTracer` at boot from the standard ``OTEL_*``
variables, and only when they name an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off); otherwise nothing is built and the loops keep the
do-nothing :class:`router.fleet.tracing.Tracer`. The SDK reads its other variables itself (headers,
timeout, batch sizes, sampler, resource). Spans leave from the batch processor's own thread,
so a collector that is slow or gone never holds up a turn: when its queue is full, spans are
dropped. Content (a tool call's arguments) is recorded only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``. Design: docs/adr/0150-traces.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pydantic import BaseModel, ConfigDict

from kernel.chain import ChainRow, RowKind
from kernel.context import StepResult
from kernel.errors import ConfigError
from kernel.record import TrajectoryRecord
from kernel.trace import call_attributes
from router.fleet.observe import CommitObserver
from router.fleet.tracing import Tracer, root_span_id_of, trace_id_of
from router.wire.turns import TurnMessage

log = logging.getLogger("reins.tracing")
CONTENT_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_PROPAGATOR = TraceContextTextMapPropagator()
_OK_OUTCOMES = frozenset({"ok", "COMPLETED"})
_O = TypeVar("_O", bound=CommitObserver)
SHUTDOWN_WAIT_S = 2.0  # the most a process's exit waits for its last spans to leave


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "false"):
        return False
    if raw == "true":
        return True
    raise ConfigError(f"{name}: expected true or false, got {env[name]!r}")


class TraceSettings(BaseModel):
    """What reins reads of the ``OTEL_*`` variables: whether to trace, and content capture."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str = ""  # "" : tracing off
    content: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TraceSettings:
        """Read the variables; refuse, naming the variable, what reins cannot honour."""
        content = _flag(env, CONTENT_VAR)
        if _flag(env, "OTEL_SDK_DISABLED"):
            return cls(content=content)
        exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
        if exporter == "none":
            return cls(content=content)
        if exporter != "otlp":
            raise ConfigError(f"OTEL_TRACES_EXPORTER: reins exports otlp or none, got {exporter!r}")
        for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = env.get(var, "").strip()
            if protocol and protocol != "http/protobuf":
                raise ConfigError(f"{var}: reins exports http/protobuf, got {protocol!r}")
        var = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        endpoint = env.get(var, "").strip()
        if not endpoint:
            var = "OTEL_EXPORTER_OTLP_ENDPOINT"
            endpoint = env.get(var, "").strip()
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"{var}: expected an http:// or https:// URL, got {endpoint!r}")
        return cls(endpoint=endpoint, content=content)


class _TrajectoryIds(RandomIdGenerator):
    """Random ids, except while :meth:`fixed` holds: then the trajectory's own (its root)."""

    def __init__(self) -> None:
        self._fixed = threading.local()

    @contextlib.contextmanager
    def fixed(self, trace_id: int, span_id: int) -> Iterator[None]:
        self._fixed.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._fixed.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._fixed, "ids", None)
        return ids[0] if ids else super().generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._fixed, "ids", None)
        return ids[1] if ids else super().generate_span_id()


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _root_context(tenant: str, trajectory_id: str) -> Context:
    """A context whose parent is the trajectory's root span, wherever that is recorded."""
    parent = SpanContext(
        trace_id_of(tenant, trajectory_id),
        root_span_id_of(tenant, trajectory_id),
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes: None left out (OpenTelemetry takes none)."""
    return {k: v for k, v in values.items() if v is not None}


class OtelTracer(Tracer):
    """The spans of :mod:`router.fleet.tracing`, made with the OpenTelemetry SDK."""

    enabled = True

    def __init__(self, provider: TracerProvider, ids: _TrajectoryIds, content: bool) -> None:
        self.provider, self._ids, self.content = provider, ids, content
        self._tracer = provider.get_tracer("reins")

    def admitted(self, rec: TrajectoryRecord, began: float, sent_by: str) -> str:
        span = self._tracer.start_span(
            "reins.admit",
            context=_root_context(rec.tenant, rec.trajectory_id),
            kind=SpanKind.PRODUCER,
            start_time=_ns(began),
            attributes={
                "reins.tenant": rec.tenant,
                "reins.trajectory_id": rec.trajectory_id,
                "reins.turn": rec.turn,
                "reins.admitted_by": sent_by,
                "gen_ai.agent.name": rec.agent,
            },
        )
        span.end()
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent", "")

    def turn(self, msg: TurnMessage, worker: str) -> AbstractContextManager[None]:
        return self._turn(msg, worker)

    @contextlib.contextmanager
    def _turn(self, msg: TurnMessage, worker: str) -> Iterator[None]:
        parent = self._parent(msg)
        with self._tracer.start_as_current_span(
            "reins.turn",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "reins.tenant": msg.tenant,
                "reins.trajectory_id": msg.trajectory_id,
                "reins.worker": worker,
                "reins.record_version": msg.version,
            },
        ):
            yield

    def _parent(self, msg: TurnMessage) -> Context:
        """The admission span the message names, if it is of this trajectory's trace; else the
        trajectory's root (a follow-on turn, a message of an untraced router, a foreign id)."""
        root = _root_context(msg.tenant, msg.trajectory_id)
        if not msg.trace:
            return root
        carried = _PROPAGATOR.extract({"traceparent": msg.trace})
        ctx = trace.get_current_span(carried).get_span_context()
        if ctx.is_valid and ctx.trace_id == trace_id_of(msg.tenant, msg.trajectory_id):
            return carried
        return root

    def committed(self, result: StepResult, route: str) -> None:
        provider, _, model = route.partition("/")
        for row in result.rows:
            if row.kind in (RowKind.MODEL, RowKind.TOOL):
                self._call(row, provider, model)

    def _call(self, row: ChainRow, provider: str, model: str) -> None:
        name, attrs = call_attributes(row, model)
        args = attrs.pop("reins.arguments", None)
        if self.content and args is not None:
            attrs["gen_ai.tool.call.arguments"] = json.dumps(args, sort_keys=True)
        if row.kind is RowKind.MODEL:
            attrs["gen_ai.provider.name"] = provider
            route = (row.detail or {}).get("route")
            if isinstance(route, str):  # a routed model's: the deployment that answered
                attrs["reins.route"] = route
        span = self._tracer.start_span(
            name,
            kind=SpanKind.CLIENT if row.kind is RowKind.MODEL else SpanKind.INTERNAL,
            start_time=_ns(row.at - row.duration_s),
            attributes=_attributes(attrs),
        )
        if row.outcome not in _OK_OUTCOMES or row.error is not None:
            span.set_status(Status(StatusCode.ERROR, f"{row.outcome}: {row.error or ''}"))
        span.end(end_time=_ns(row.at))

    def stopped(self, rec: TrajectoryRecord, row: ChainRow) -> None:
        """The trajectory's own span, from its submission to its stop: the root of its trace,
        under the id every other span of the trace names as its parent."""
        tenant, tid = rec.tenant, rec.trajectory_id
        with self._ids.fixed(trace_id_of(tenant, tid), root_span_id_of(tenant, tid)):
            span = self._tracer.start_span(
                f"invoke_agent {rec.agent}",
                context=Context(),
                kind=SpanKind.INTERNAL,
                start_time=_ns(rec.submitted_at),
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": rec.agent,
                    "reins.tenant": tenant,
                    "reins.trajectory_id": tid,
                    "reins.stop_reason": row.outcome or "",
                    "reins.steps": rec.ledger.steps.actual,
                },
            )
        span.end(end_time=_ns(row.at))

    def shutdown(self) -> None:
        """Send what is still queued, waiting at most :data:`SHUTDOWN_WAIT_S` for a collector."""
        done = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        done.start()
        done.join(SHUTDOWN_WAIT_S)
        if done.is_alive():
            log.warning("spans still unsent after %.0fs at exit: dropped", SHUTDOWN_WAIT_S)


def tracer_for(
    settings: TraceSettings, env: Mapping[str, str], service: str, instance: str
) -> OtelTracer:
    """A tracer exporting to ``settings.endpoint``'s collector, as ``service`` (unless
    ``OTEL_SERVICE_NAME`` names it) and ``instance``, from this process."""
    attributes: dict[str, Any] = {"service.instance.id": instance, "process.pid": os.getpid()}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service
    processor = BatchSpanProcessor(OTLPSpanExporter())
    return otel_tracer(processor, settings.content, Resource.create(attributes))


def otel_tracer(
    processor: SpanProcessor, content: bool = False, resource: Resource | None = None
) -> OtelTracer:
    """A tracer whose spans go to ``processor`` (the OTLP batch processor, or a test's)."""
    ids = _TrajectoryIds()
    provider = TracerProvider(resource=resource, id_generator=ids)
    provider.add_span_processor(processor)
    return OtelTracer(provider, ids, content)


def observing(blank: Callable[[], _O], observer: _O | None, tracer: Tracer | None) -> _O | None:
    """What a process hands its loops: ``observer`` (or a ``blank`` one, when it traces but
    has no metrics) with ``tracer`` set on it."""
    if tracer is None:
        return observer
    out = observer if observer is not None else blank()
    out.tracer = tracer
    return out


@contextlib.contextmanager
def traced(env: Mapping[str, str], service: str, instance: str) -> Iterator[OtelTracer | None]:
    """A process's tracer for the duration of the block, or ``None`` when ``env`` configures
    no exporter; its last spans are sent (bounded) when the block ends."""
    settings = TraceSettings.from_env(env)
    if not settings.endpoint:
        yield None
        return
    try:
        tracer = tracer_for(settings, env, service, instance)
    except ValueError as exc:  # the SDK's own reading of its variables (OTEL_BSP_*, ...)
        raise ConfigError(f"OTEL_* traces settings: {exc}") from None
    log.info("exporting traces to %s", settings.endpoint)
    try:
        yield tracer
    finally:
        tracer.shutdown()
