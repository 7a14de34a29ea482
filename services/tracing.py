"""OpenTelemetry tracing of a region node, off unless the standard ``OTEL_*`` environment turns
it on: ``OTEL_TRACES_EXPORTER=otlp`` (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` as the SDK reads them) or ``console``;
``OTEL_SDK_DISABLED=true`` wins. Unset (the default), nothing is instrumented at all.

One trace follows a chat application's append across regions:

* the FastAPI instrumentation makes a server span for every request at every node
  (``/metrics`` and the peers' probes excluded), continuing a ``traceparent`` it receives;
* a forward to the leader's region carries the current context in its headers (W3C trace
  context), so the leader's server span is a child of the entry node's;
* the leader's replica calls run in its replication loop, not in the request's task, so the
  request registers its span under the conversation id while it appends (``appending``), and
  a replica append of a batch is a child of the span of one of the batch's requests, linked to
  the others'.

The exporter's queue is the SDK's bounded batch queue; its calls have the SDK's timeout.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager

from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext

from eventlog.model import LogEntry

#: requests whose span a replica call can find at once; more are traced without replica spans
PENDING_APPENDS_MAX = 4096
#: the most a node's shutdown waits for queued spans to be exported
TRACE_FLUSH_TIMEOUT_MS = 5_000
#: requests that get no server span (scrapes and the peers' 5/s probes)
TRACE_EXCLUDED_URLS = "/metrics,/healthz,/peer/health"


def tracer_provider_from_env(
    region: str, environ: Mapping[str, str] | None = None
) -> TracerProvider | None:
    """The provider the ``OTEL_*`` environment asks for, or None (tracing off)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n and n != "none"]
    if not names:
        return None
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: convplane knows otlp, console, none")
    resource = Resource.create({"service.name": "convplane-node", "convplane.region": region})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def install_from_env(region: str) -> TracerProvider | None:
    """A process's tracing from its ``OTEL_*`` environment, made the global provider as well
    (the replay bus and worker trace through OpenTelemetry's global API); None: off."""
    provider = tracer_provider_from_env(region)
    if provider is not None:
        trace.set_tracer_provider(provider)
    return provider


class NodeTracing:
    """A node's tracer, and the appends under way whose spans replica calls join."""

    def __init__(self, provider: TracerProvider, region: str) -> None:
        self.provider = provider
        self.region = region
        self.tracer = provider.get_tracer("convplane")
        #: (tenant, conversation) -> the span of the append of it under way here
        self._pending: dict[tuple[str, str], SpanContext] = {}

    def inject(self, headers: dict[str, str]) -> None:
        """Add the current context (``traceparent``) to a forward's headers."""
        inject(headers)

    @contextlib.contextmanager
    def _registered(self, key: tuple[str, str], span: SpanContext) -> Iterator[None]:
        self._pending[key] = span
        try:
            yield
        finally:
            if self._pending.get(key) is span:
                del self._pending[key]

    def appending(self, tenant_id: str, conversation_id: str) -> AbstractContextManager[None]:
        """While an append to a tenant's conversation is under way here, its replica calls join
        its trace (the first request of a conversation wins; the bound keeps the map small)."""
        span = trace.get_current_span().get_span_context()
        key = (tenant_id, conversation_id)
        if not span.is_valid or key in self._pending or len(self._pending) >= PENDING_APPENDS_MAX:
            return contextlib.nullcontext()
        return self._registered(key, span)

    def replica_span(
        self, call: str, replica_region: str, shard: int, entries: Sequence[LogEntry]
    ) -> AbstractContextManager[Span | None]:
        """A span for one replica call: the child of a request's span whose entries it carries
        (linked to the others'); none for a call that carries no traced request's entry."""
        by_span_id: dict[int, SpanContext] = {}
        for entry in entries:
            span = self._pending.get((entry.tenant_id, entry.conversation_id))
            if span is not None:
                by_span_id.setdefault(span.span_id, span)
        contexts = list(by_span_id.values())
        if not contexts:
            return contextlib.nullcontext()
        return self.tracer.start_as_current_span(
            f"replica.{call}",
            context=trace.set_span_in_context(NonRecordingSpan(contexts[0])),
            kind=trace.SpanKind.CLIENT,
            links=[Link(c) for c in contexts[1:]],
            attributes={
                "convplane.region": self.region,
                "convplane.replica_region": replica_region,
                "convplane.shard": shard,
                "convplane.entries": len(entries),
            },
        )
