"""OpenTelemetry (the optional extra): off by default; when an OTLP endpoint is set, the
request and every step are exported to it in the platform's own trace."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentplatform import otel
from jobs import tracing
from runs import demo
from runs.engine import run_drive_inline
from runs.models import Run, RunEvent
from runs.services import task_submit

INCOMING = "00-5bf92f3577b34da6a3ce929d0e0e4736-10f067aa0ba902b7-01"


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append((self.path, self.headers.get("Content-Type"), body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.posts = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _spans(server) -> list:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans = []
    for path, content_type, body in server.posts:
        assert path == "/v1/traces"
        assert content_type == "application/x-protobuf"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}.get(
                "service.name"
            )
            for scope in resource.scope_spans:
                spans.extend((service, span) for span in scope.spans)
    return spans


@pytest.mark.no_services
def test_off_unless_an_exporter_is_configured(monkeypatch):
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert not otel.otel_wanted()
    assert not otel.otel_configure()
    assert otel.span_start("nothing") is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    assert otel.otel_wanted()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not otel.otel_wanted()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not otel.otel_wanted()


@pytest.mark.django_db(transaction=True)
def test_request_and_steps_are_exported_over_otlp_in_the_platform_trace(
    collector, monkeypatch, client, workspace, repository
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agentplatform-test")
    try:
        assert otel.otel_configure(force=True)
        assert client.get("/healthz", HTTP_TRACEPARENT=INCOMING).status_code == 200
        with tracing.trace_scope(INCOMING):
            submission = task_submit(
                workspace=workspace,
                repository=repository,
                instruction="Fix add()",
                model_options={"provider": "scripted", "script": demo.fix_script()},
            )
        run = run_drive_inline(run_id=submission.run.id)
        assert run.status == Run.Status.COMPLETED
        otel.otel_flush()
    finally:
        otel.otel_shutdown()
        tracing.trace_clear()

    spans = _spans(collector)
    trace_id = bytes.fromhex(INCOMING.split("-")[1])
    server = [s for _, s in spans if s.name == "GET healthz"]
    assert len(server) == 1
    assert server[0].trace_id == trace_id
    assert server[0].parent_span_id == bytes.fromhex(INCOMING.split("-")[2])
    steps = [s for _, s in spans if s.name.startswith("step ")]
    assert {s.name for s in steps} >= {"step running", "step verifying", "step creating_pr"}
    assert {s.trace_id for s in steps} == {trace_id}
    assert {service for service, _ in spans} == {"agentplatform-test"}
    # Events recorded during a step name the exported step span as their parent.
    step_span_ids = {s.span_id.hex() for s in steps}
    assert step_span_ids
    patch_events = RunEvent.objects.filter(run=run, type="agent.patch.created")
    assert patch_events.exists()
    from jobs.models import OutboxEvent

    parents = {
        tracing.traceparent_parse(OutboxEvent.objects.get(event_id=e.id).payload["traceparent"])
        for e in patch_events
    }
    assert all(parent is not None and parent[0] == trace_id.hex() for parent in parents)
