"""An OTLP/HTTP trace receiver of the test's own, on loopback: what a collector would be given.

It answers ``POST /v1/traces`` as the OTLP/HTTP specification says (a protobuf
``ExportTraceServiceRequest`` in, an ``ExportTraceServiceResponse`` out, gzip understood),
decodes every span with the resource of the process that sent it, and keeps them for the test.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as decoded from the wire, with its sender's resource attributes."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    attributes: dict[str, Any]
    resource: dict[str, Any]

    @property
    def process(self) -> tuple[str, int]:
        """Which process sent it: its service instance and pid."""
        return (str(self.resource.get("service.instance.id")), int(self.resource["process.pid"]))


class OtlpReceiver:
    """The receiver; ``endpoint`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` should say."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != PATH:
                    self.send_error(404)
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._take(ExportTraceServiceRequest.FromString(body))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        ReceivedSpan(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            status_code=s.status.code,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            resource=resource,
                        )
                    )
        with self._lock:
            self.spans.extend(got)
            self.requests += 1

    def taken(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def receiver() -> Iterator[OtlpReceiver]:
    """A receiver for the duration of a fixture."""
    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()
