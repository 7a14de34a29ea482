"""One trace of a forwarded append: the entry region's server span, the leader region's server
span (its child, through the forward's ``traceparent``) and the leader's replica appends, all
in one trace. Two real nodes (``open_runtime`` wiring, in-memory replicas in place of the
databases) talk in-process; an in-memory exporter collects the spans."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventlog.sharding import shard_of
from regions.placement import place_shards
from services.bootstrap.app import create_app
from services.config import (
    ClusterConfig,
    NodeSettings,
    RegionConfig,
    TenantConfig,
    api_key_sha256,
)
from services.tracing import tracer_provider_from_env
from tests.unit.api_fakes import KEY_A, HostRouting
from tests.unit.memory_runtime import memory_runtime

REGIONS = ("east", "west")
SHARDS = 4
AUTH = {"Authorization": f"Bearer {KEY_A}"}
#: appends tried while the leader takes its shards (each a real request: no sleeping)
APPEND_ATTEMPTS_MAX = 2000


class IsolatedRouting(HostRouting):
    """Runs each peer request in a fresh context, as a request from another process would be:
    the leader can learn the trace only from the forward's ``traceparent`` header."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = super().handle_async_request(request)
        return await asyncio.create_task(call, context=contextvars.Context())


@dataclass
class Plane:
    clients: dict[str, httpx.AsyncClient]
    spans: InMemorySpanExporter


def _cluster() -> ClusterConfig:
    return ClusterConfig(
        regions=[
            RegionConfig(name=r, url=f"http://{r}.test", dsn=f"memory://{r}") for r in REGIONS
        ],
        shard_count=SHARDS,
        tenants=[
            TenantConfig(
                tenant_id="a",
                api_key_sha256=api_key_sha256(KEY_A),
                requests_per_s=100_000,
                burst=100_000,
            )
        ],
        default_model_revision="m-1",
    )


def _led_by(region: str) -> str:
    placement = place_shards(SHARDS, dict.fromkeys(REGIONS, 1.0))
    return next(
        cid for i in range(1000) if placement[shard_of(cid := f"traced-{i}", SHARDS)] == region
    )


@pytest.fixture
async def plane() -> AsyncIterator[Plane]:
    routing = IsolatedRouting()

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with AsyncExitStack() as stack:
        clients = {}
        for region in REGIONS:
            app = create_app(
                NodeSettings(region=region, cluster=_cluster()),
                runtime_factory=memory_runtime(routing),
                tracer_provider=provider,
            )
            routing.apps[f"{region}.test"] = httpx.ASGITransport(app=app)
            await stack.enter_async_context(app.router.lifespan_context(app))
            clients[region] = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url=f"http://{region}.test"
                )
            )
        yield Plane(clients, spans)
    provider.shutdown()


async def _post_until_served(
    client: httpx.AsyncClient, url: str, body: dict[str, str], headers: dict[str, str]
) -> httpx.Response:
    for _ in range(APPEND_ATTEMPTS_MAX):
        r = await client.post(url, json=body, headers=headers)
        if r.status_code in (200, 201):
            return r
        assert r.status_code == 503, r.text  # the leader is still taking its shards
    pytest.fail(f"POST {url} was never served")


def _attr(span: ReadableSpan, key: str) -> object:
    return (span.attributes or {}).get(key)


async def test_a_forwarded_append_is_one_trace_across_regions_and_replicas(plane: Plane) -> None:
    cid = _led_by("west")
    east = plane.clients["east"]
    await _post_until_served(east, "/v1/conversations", {"conversation_id": cid}, AUTH)
    r = await _post_until_served(
        east,
        f"/v1/conversations/{cid}/events",
        {"type": "note"},
        {**AUTH, "Idempotency-Key": "traced-1"},
    )
    assert r.headers["x-convplane-served-by"] == "west"
    acked = next(
        s
        for s in plane.spans.get_finished_spans()
        if s.name.startswith("POST /v1/conversations/{conversation_id}/events")
        and s.parent is None
        and _attr(s, "http.status_code") in (200, 201)
    )
    trace_id = acked.context.trace_id
    in_trace = [s for s in plane.spans.get_finished_spans() if s.context.trace_id == trace_id]
    servers = [s for s in in_trace if s.kind.name == "SERVER"]
    hosts = {str(_attr(s, "http.host") or _attr(s, "server.address")) for s in servers}
    assert any("east" in h for h in hosts) and any("west" in h for h in hosts), hosts
    leader_span = next(s for s in servers if s.parent is not None)
    assert leader_span.parent is not None and leader_span.parent.is_remote  # from the header
    replica_calls = [s for s in in_trace if s.name == "replica.append"]
    assert {_attr(s, "convplane.replica_region") for s in replica_calls} == set(REGIONS)
    assert {_attr(s, "convplane.region") for s in replica_calls} == {"west"}


def test_tracing_is_off_unless_the_environment_turns_it_on() -> None:
    assert tracer_provider_from_env("east", {}) is None
    assert tracer_provider_from_env("east", {"OTEL_TRACES_EXPORTER": "none"}) is None
    on = {"OTEL_TRACES_EXPORTER": "console"}
    assert tracer_provider_from_env("east", {**on, "OTEL_SDK_DISABLED": "true"}) is None
    provider = tracer_provider_from_env("east", on)
    assert provider is not None
    assert provider.resource.attributes["convplane.region"] == "east"
    provider.shutdown()
    with pytest.raises(ValueError, match="zipkin"):
        tracer_provider_from_env("east", {"OTEL_TRACES_EXPORTER": "zipkin"})
