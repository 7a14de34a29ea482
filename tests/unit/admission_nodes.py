"""Two API nodes (east, west) over fake logs with a controllable clock and a slow log, for the
admission-control tests: build them, wait on a condition or a metric, check an error body."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from eventlog.clock import Clock
from services.bootstrap import NodeRuntime
from services.bootstrap.app import NodeApp, create_app
from services.config import ClusterConfig, NodeSettings
from tests.unit.api_fakes import (
    KEY_A,
    FakeLog,
    HostRouting,
    cluster_config,
    peer_listener,
)
from tests.unit.api_fakes import leaders as fake_leaders
from tests.unit.clocks import WALL_ORIGIN_MS, ManualClock

AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
SECRET = "s" * 40
LOOP_STEPS_MAX = 100_000  # event-loop turns a test may wait for a state it drives itself


def node_clock() -> ManualClock:
    """The node's clock: only the test and the fake log move it; sleeps are real and short
    (the admission sweeper's timer)."""
    return ManualClock(100.0, wall_base_ms=WALL_ORIGIN_MS, virtual_sleep=False)


class SlowLog(FakeLog):
    """FakeLog whose calls take ``latency_s`` of virtual time and wait for ``gate``."""

    def __init__(self, region: str, clock: ManualClock) -> None:
        super().__init__(region, fake_leaders())
        self.clock = clock
        self.latency_s = 0.001
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = 0

    async def _maybe_stall(self) -> None:
        self.entered += 1
        self.clock.now_s += self.latency_s
        await self.gate.wait()


def cluster(peer_secret: str | None = SECRET) -> ClusterConfig:
    return cluster_config().model_copy(update={"peer_secret": peer_secret})


def build_node(
    region: str, log: FakeLog, peers: httpx.AsyncClient, clock: Clock, config: ClusterConfig,
    **limits: Any,
) -> NodeApp:  # fmt: skip
    settings = NodeSettings(region=region, cluster=config, **limits)

    @asynccontextmanager
    async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
        yield NodeRuntime(
            region, s.load_cluster(), log, peers, clock, random.Random(7), lambda: (4, 4)
        )

    return create_app(settings, runtime_factory=runtime)


@dataclass
class Nodes:
    east: httpx.AsyncClient
    west: httpx.AsyncClient
    east_log: SlowLog
    west_log: SlowLog
    clock: ManualClock
    #: what the nodes send each other: to each node's peer listener (``peer_listener``)
    peers: httpx.AsyncClient


@asynccontextmanager
async def two_nodes(peer_secret: str | None = SECRET, **limits: Any) -> AsyncIterator[Nodes]:
    clock = node_clock()
    routing = HostRouting()
    config = cluster(peer_secret)
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient(transport=routing))
        logs = {r: SlowLog(r, clock) for r in ("east", "west")}
        clients = {}
        for region, log in logs.items():
            app = build_node(region, log, peers, clock, config, **limits)
            routing.apps[f"{region}.test"] = peer_listener(app, config)
            await stack.enter_async_context(app.router.lifespan_context(app))
            clients[region] = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url=f"http://{region}.test"
                )
            )
        yield Nodes(clients["east"], clients["west"], logs["east"], logs["west"], clock, peers)


def assert_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.text
    if status in (429, 503):
        assert int(r.headers["retry-after"]) >= 1


async def metric_value(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(LOOP_STEPS_MAX):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("state not reached")


async def until_metric(client: httpx.AsyncClient, name: str, value: float) -> None:
    for _ in range(LOOP_STEPS_MAX // 100):
        if await metric_value(client, name) == value:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{name} never reached {value}")


async def create_conversation(client: httpx.AsyncClient, cid: str) -> None:
    r = await client.post("/v1/conversations", json={"conversation_id": cid}, headers=AUTH_A)
    assert r.status_code == 201, r.text
