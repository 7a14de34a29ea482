"""Trace context carried in replay job messages (W3C ``traceparent``/``tracestate`` as Kafka
record headers), through OpenTelemetry's global API: a no-op unless the process configured a
tracer provider (``services.tracing``), so nothing is sent or parsed then.

The publisher's span (``replay.publish``, one per batch) is the parent of each job's
``replay.job`` span on the worker that runs it. Headers come from the network: only the two
W3C names are read, each cut to ``TRACE_HEADER_BYTES_MAX``, and a malformed value just starts
a new trace (the propagator ignores it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager

from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Span

TRACE_HEADERS = ("traceparent", "tracestate")
#: a traceparent is 55 bytes; tracestate is bounded at 512 by the W3C spec
TRACE_HEADER_BYTES_MAX = 512
#: record headers looked at per message (a record may carry others, or many)
RECORD_HEADERS_MAX = 16

#: Kafka record headers: (name, value) pairs
RecordHeaders = tuple[tuple[str, bytes], ...]


def _tracer(provider: trace.TracerProvider | None) -> trace.Tracer:
    """``provider``: None for the process's global one (how the bus and the worker call)."""
    return trace.get_tracer("convplane.replay", tracer_provider=provider)


def publish_span(
    region: str, jobs: int, provider: trace.TracerProvider | None = None
) -> AbstractContextManager[Span]:
    return _tracer(provider).start_as_current_span(
        "replay.publish",
        kind=trace.SpanKind.PRODUCER,
        attributes={"convplane.region": region, "convplane.jobs": jobs},
    )


def current_headers() -> RecordHeaders:
    """The current trace context as record headers (empty when there is none)."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return tuple((k, v.encode()) for k, v in carrier.items() if k in TRACE_HEADERS)


def received_headers(headers: Sequence[tuple[str, bytes]] | None) -> RecordHeaders:
    """The trace headers of a received record, validated as untrusted data."""
    kept = []
    for name, value in list(headers or ())[:RECORD_HEADERS_MAX]:
        if name in TRACE_HEADERS and isinstance(value, bytes):
            kept.append((name, value[:TRACE_HEADER_BYTES_MAX]))
    return tuple(kept)


def job_span(
    headers: RecordHeaders,
    attributes: Mapping[str, str | int],
    provider: trace.TracerProvider | None = None,
) -> AbstractContextManager[Span]:
    """The span of running one job: a child of its publisher's span when the headers carry one."""
    carrier = {name: value.decode("ascii", errors="replace") for name, value in headers}
    return _tracer(provider).start_as_current_span(
        "replay.job",
        context=extract(carrier),
        kind=trace.SpanKind.CONSUMER,
        attributes=dict(attributes),
    )
