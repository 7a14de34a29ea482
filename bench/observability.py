"""What observability costs on the request path: appends/s through one in-process region node
(the real wiring, ``open_runtime``, over an embedded SQLite replica; a one-region cluster, so
only the node's own work is measured), with tracing off (the default) and on (the SDK with an
in-memory exporter), alternating rounds in one run; and the time of one ``/metrics`` scrape.

    .venv/bin/python -m bench.observability [--appends 1000] [--writers 16] [--rounds 3]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.bootstrap.app import create_app
from services.config import (
    ClusterConfig,
    NodeSettings,
    RegionConfig,
    TenantConfig,
    api_key_sha256,
)

KEY = "bench-observability-key-0123456789abcdef"
REGION = "us-east"
READY_POLLS_MAX = 600
SCRAPES = 50


def _settings(state: Path) -> NodeSettings:
    cluster = ClusterConfig(
        regions=[
            RegionConfig(name=REGION, url="http://node", dsn=f"sqlite+aiosqlite:///{state}/r.db")
        ],
        shard_count=16,
        tenants=[
            TenantConfig(
                tenant_id="bench",
                api_key_sha256=api_key_sha256(KEY),
                requests_per_s=1e6,
                burst=1_000_000,
            )
        ],
        default_model_revision="m-1",
    )
    return NodeSettings(region=REGION, cluster=cluster)


async def _round(state: Path, appends: int, writers: int, traced: bool) -> dict[str, Any]:
    provider = None
    spans = InMemorySpanExporter()
    if traced:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
    app = create_app(_settings(state), tracer_provider=provider)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://node", headers=headers
            )
        )
        for _ in range(READY_POLLS_MAX):
            if (await client.get("/healthz")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        cids = [f"bench-{traced}-{time.monotonic_ns()}-{w}" for w in range(writers)]
        for cid in cids:
            r = await client.post("/v1/conversations", json={"conversation_id": cid})
            assert r.status_code in (200, 201), r.text

        async def writer(cid: str, count: int) -> None:
            for _ in range(count):
                r = await client.post(f"/v1/conversations/{cid}/events", json={"type": "note"})
                assert r.status_code == 201, r.text

        started = time.perf_counter()
        await asyncio.gather(*(writer(c, appends // writers) for c in cids))
        elapsed = time.perf_counter() - started
        scrape_s = []
        for _ in range(SCRAPES):
            t0 = time.perf_counter()
            assert (await client.get("/metrics")).status_code == 200
            scrape_s.append(time.perf_counter() - t0)
    if provider is not None:
        provider.shutdown()
    return {
        "events_per_s": (appends // writers) * writers / elapsed,
        "scrape_ms_p50": statistics.median(scrape_s) * 1000,
        "spans": len(spans.get_finished_spans()),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            for mode in ("off", "on"):
                state = Path(tmp) / f"{mode}{n}"
                state.mkdir()
                out = await _round(state, args.appends, args.writers, traced=mode == "on")
                results[mode].append(out)
                print(mode, n, json.dumps(out), flush=True)
    off = statistics.median(r["events_per_s"] for r in results["off"])
    on = statistics.median(r["events_per_s"] for r in results["on"])
    summary = {
        "events_per_s_tracing_off": round(off, 1),
        "events_per_s_tracing_on": round(on, 1),
        "ratio_on_over_off": round(on / off, 3),
        "scrape_ms_p50": round(statistics.median(r["scrape_ms_p50"] for r in results["off"]), 2),
        "spans_per_append_traced": round(results["on"][0]["spans"] / args.appends, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main())
