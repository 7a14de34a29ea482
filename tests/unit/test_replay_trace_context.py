"""Trace context through a replay job's record headers: the worker's ``replay.job`` span is a
child of the publisher's ``replay.publish`` span, and received headers are validated as
untrusted data (only the W3C names, bounded, a malformed one starts a new trace)."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from replay.bus.trace_context import (
    RECORD_HEADERS_MAX,
    TRACE_HEADER_BYTES_MAX,
    current_headers,
    job_span,
    publish_span,
    received_headers,
)


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider, spans


def test_a_job_span_continues_its_publishers_trace() -> None:
    provider, spans = _provider()
    with publish_span("eu-west", 3, provider) as publish:
        headers = current_headers()
    assert [name for name, _ in headers] == ["traceparent"]
    # as a Kafka record would bring them back, with a header of someone else's
    received = received_headers([("x-other", b"1"), *headers])
    with job_span(received, {"convplane.worker": "w1"}, provider):
        pass
    job = next(s for s in spans.get_finished_spans() if s.name == "replay.job")
    assert job.context.trace_id == publish.get_span_context().trace_id
    assert job.parent is not None and job.parent.span_id == publish.get_span_context().span_id
    assert job.parent.is_remote
    provider.shutdown()


def test_without_a_trace_nothing_is_sent_and_a_bad_header_starts_a_new_trace() -> None:
    assert current_headers() == ()  # no span is current
    provider, spans = _provider()
    with job_span(received_headers([("traceparent", b"00-zz-not-a-trace-01")]), {}, provider):
        pass
    (job,) = spans.get_finished_spans()
    assert job.parent is None
    provider.shutdown()


def test_received_headers_are_bounded() -> None:
    long = b"x" * (TRACE_HEADER_BYTES_MAX * 4)
    many = [("tracestate", long)] * (RECORD_HEADERS_MAX * 2)
    kept = received_headers(many)
    assert len(kept) == RECORD_HEADERS_MAX
    assert all(len(value) == TRACE_HEADER_BYTES_MAX for _, value in kept)
    assert received_headers(None) == ()
    assert received_headers([("traceparent", "not-bytes")]) == ()  # type: ignore[list-item]
