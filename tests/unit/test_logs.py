"""A node's JSON log lines carry the request's id, tenant, conversation, shard, epoch and trace
id, and never a secret: a real node (``open_runtime`` wiring, in-memory replicas) is driven
with a tenant key, a wrong key and a forged peer secret while every logger writes at DEBUG
through the node's formatter."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider

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
from services.logs import json_formatter, redact
from tests.unit.api_fakes import KEY_A
from tests.unit.memory_runtime import memory_runtime

REGIONS = ("ap-south", "eu-west", "us-east")
SELF = "us-east"
SHARDS = 4
PEER_SECRET = "peer-secret-that-must-not-be-logged-5d1c"
WRONG_KEY = "wrong-key-that-must-not-be-logged-77ab"
#: requests tried while the node takes its shards, this far apart
ATTEMPTS_MAX = 1000
RETRY_PAUSE_S = 0.02


def _cluster() -> ClusterConfig:
    return ClusterConfig(
        regions=[
            RegionConfig(name=r, url="http://127.0.0.1:9", dsn=f"memory://{r}") for r in REGIONS
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
        peer_secret=PEER_SECRET,
    )


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(json_formatter(SELF))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture
async def node() -> AsyncIterator[httpx.AsyncClient]:
    provider = TracerProvider()
    app = create_app(
        NodeSettings(region=SELF, cluster=_cluster()),
        runtime_factory=memory_runtime(),
        tracer_provider=provider,
    )
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")
        )
    provider.shutdown()


def _led_here() -> str:
    placement = place_shards(SHARDS, dict.fromkeys(REGIONS, 1.0))
    return next(c for i in range(1000) if placement[shard_of(c := f"logged-{i}", SHARDS)] == SELF)


async def _until_served(
    node: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> httpx.Response:
    for _ in range(ATTEMPTS_MAX):
        r = await node.post(url, json=body, headers=headers)
        if r.status_code != 503:
            return r
        await asyncio.sleep(RETRY_PAUSE_S)  # 503: the node is still taking its shards
    pytest.fail(f"POST {url} was never served")


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


async def test_a_refused_append_logs_its_request_fields_and_no_secret(
    node: httpx.AsyncClient, captured: io.StringIO
) -> None:
    auth = {"Authorization": f"Bearer {KEY_A}", "X-Request-Id": "req-42"}
    cid = _led_here()
    r = await _until_served(node, "/v1/conversations", {"conversation_id": cid}, auth)
    assert r.status_code in (200, 201), r.text
    r = await _until_served(
        node, f"/v1/conversations/{cid}/events", {"type": "note", "expected_seq": 7}, auth
    )
    assert r.status_code == 409, r.text
    await node.get(f"/v1/conversations/{cid}", headers={"Authorization": f"Bearer {WRONG_KEY}"})
    await node.get(
        "/peer/health",
        headers={"X-Convplane-Peer-Auth": PEER_SECRET, "Authorization": f"Bearer {KEY_A}"},
    )
    text = captured.getvalue()
    for secret in (KEY_A, WRONG_KEY, PEER_SECRET):
        assert secret not in text
    lines = _lines(captured)
    refused = next(line for line in lines if "seq_conflict" in line["event"])
    assert refused["request_id"] == "req-42"
    assert refused["tenant"] == "a"
    assert refused["conversation"] == cid
    assert refused["shard"] == shard_of(cid, SHARDS)
    assert refused["epoch"] >= 1
    assert len(refused["trace_id"]) == 32 and int(refused["trace_id"], 16) != 0
    assert refused["region"] == SELF and refused["level"] == "debug"


def test_redact_masks_credentials_in_any_text() -> None:
    text = (
        f"Authorization: Bearer {KEY_A}; headers={{'authorization': 'Bearer {WRONG_KEY}'}} "
        f'"x-convplane-peer-auth": "{PEER_SECRET}"'
    )
    masked = redact(text)
    for secret in (KEY_A, WRONG_KEY, PEER_SECRET):
        assert secret not in masked
    assert masked.count("[redacted]") == 3


def test_an_exception_logged_with_a_key_in_it_is_redacted(captured: io.StringIO) -> None:
    try:
        raise RuntimeError(f"upstream said: Authorization: Bearer {KEY_A}")
    except RuntimeError:
        logging.getLogger("convplane.test").exception("call failed")
    line = _lines(captured)[-1]
    assert KEY_A not in captured.getvalue()
    assert "[redacted]" in line["exception"] and line["event"] == "call failed"
