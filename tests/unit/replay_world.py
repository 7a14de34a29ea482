"""A region's replay service over an in-process log, bus and simulated engine (``world``), for
the replay service's tests: write conversations, move a shard here, step the clock, read results
and the service's REST API."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import httpx

from eventlog.clock import Clock, LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode, estimate_tokens
from eventlog.sharding import shard_of
from replay.bus.memory import InProcessJobBus
from replay.engines.sim_core import SimEngineConfig
from replay.engines.simulated import SimulatedEngine
from replay.model import ReplayResult
from services.bootstrap import NodeRuntime
from services.bootstrap.app import create_app
from services.bootstrap.replay import build_replay_service
from services.config import ClusterConfig, NodeSettings, RegionConfig, TenantConfig, api_key_sha256
from services.replay.config import EngineConfig, ReplayConfig
from services.replay.service import ReplayService, ReplayServiceConfig
from tests.unit.clocks import WALL_ORIGIN_MS

REGIONS = ("a", "b", "c")
SHARDS = 4
#: the cluster's peer secret (``api``): what a client might have stolen
PEER_SECRET = "p" * 40
SHARD = 1
REVISION = "sim-rev1"
TENANT_KEY = "tenant-key-0123456789"
#: the legacy worker key of every region (``replay_config``), and region a's own key
SERVICE_KEY = "service-key-0123456789"
A_WORKER_KEY = "a-worker-key-0123456789"
OPERATOR_KEY = "operator-key-0123456789"
VIEWER_KEY = "viewer-key-0123456789"


class SteppedClock(LoopClock):
    """Wall time follows the (virtual) loop; monotonic time moves only when the test steps it
    (token buckets)."""

    def __init__(self) -> None:
        super().__init__()
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s

    def wall_ms(self) -> int:
        return WALL_ORIGIN_MS + int(asyncio.get_running_loop().time() * 1000)


def ids_on_shard(prefix: str, count: int, shard: int = SHARD) -> list[str]:
    ids = (f"{prefix}-{i}" for i in range(10_000))
    return [cid for cid in ids if shard_of(cid, SHARDS) == shard][:count]


def replay_config(**overrides: object) -> ReplayConfig:
    engine = EngineConfig(url="http://sim-b0.test", model_revision=REVISION,
                          capacity_tokens_per_s=200_000.0, engine_id="b-e0")  # fmt: skip
    base = ReplayConfig(
        engines={"b": [engine]},
        service_api_key_sha256=api_key_sha256(SERVICE_KEY),
        worker_concurrency=2,
    )
    return base.model_copy(update=overrides)


@dataclass
class World:
    replicas: dict[str, MemoryReplica]
    home: LogNode  # region "a": where the conversations were written
    survivor: LogNode  # region "b": takes the shard over
    engine: SimulatedEngine
    service: ReplayService
    bus: InProcessJobBus


async def write_conversations(node: LogNode, ids: list[str], words: int = 300) -> int:
    """Three user messages each; returns the log's token estimate of them all."""
    tokens = 0
    for cid in ids:
        await node.create_conversation("t1", cid, REVISION, {})
        for turn in range(3):
            text = " ".join(f"{cid}-w{turn}-{i}" for i in range(words))
            await node.append_event("t1", cid, "message.user", {"content": text})
            tokens += estimate_tokens({"content": text})
    return tokens


@asynccontextmanager
async def world(
    config: ReplayConfig | None = None, clock: Clock | None = None
) -> AsyncIterator[World]:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    log_config = LogConfig(shard_count=SHARDS)

    def node(region: str) -> LogNode:
        return LogNode(region=region, replicas=replicas, config=log_config,
                       clock=LoopClock(), rng=random.Random(region))  # fmt: skip

    home, survivor = node("a"), node("b")
    engine = SimulatedEngine(
        "b-e0", REVISION, SimEngineConfig(prefill_tokens_per_s=200_000.0), LoopClock()
    )
    bus = InProcessJobBus()
    service = build_replay_service(
        region="b", shard_count=SHARDS, config=config or replay_config(), node=survivor,
        clock=clock or LoopClock(), rng=random.Random(3),
        engines={"b-e0": engine},
        bus=bus, mode="embedded", limits=ReplayServiceConfig(dispatch_interval_s=0.01),
        peer_secret=PEER_SECRET,  # the API's nodes (``api``) check the grants it signs
    )  # fmt: skip
    survivor.add_listener(service)
    try:
        await home.lead_shard(SHARD)
        yield World(replicas, home, survivor, engine, service, bus)
    finally:
        await service.close()
        await survivor.close()
        await home.close()
        await engine.aclose()


async def move_shard(w: World) -> None:
    """Region a stops; b, which knew a as the leader, takes the shard (a move)."""
    await w.home.resign_shard(SHARD)
    w.survivor.set_leader_hint(SHARD, "a")
    await w.survivor.lead_shard(SHARD)


async def queue_with_spare(w: World, clock: SteppedClock, ids: list[str]) -> None:
    """Write ``ids`` at home, move the shard to b, queue their replays and let the spare bucket
    fill for one second of measured engine capacity."""
    await write_conversations(w.home, ids, words=10)
    await move_shard(w)
    await w.service.replay_shard(SHARD)
    await w.service.capacity.poll_once()
    clock.now_s += 1.0


def result_of(job_id: str, cid: str, status: str = "replayed", tokens: int = 900) -> ReplayResult:
    return ReplayResult(job_id=job_id, region="b", tenant_id="t1", conversation_id=cid,
                        model_revision=REVISION, status=status,  # type: ignore[arg-type]
                        worker_id="b-w-b-e0", engine_id="b-e0", prompt_tokens=tokens,
                        cached_prompt_tokens=0, duration_ms=5.0, finished_at_ms=1)  # fmt: skip


@asynccontextmanager
async def api(w: World, replay: ReplayConfig | None = None) -> AsyncIterator[httpx.AsyncClient]:
    cluster = ClusterConfig(
        regions=[RegionConfig(name=r, url=f"http://{r}.test", dsn="memory") for r in REGIONS],
        shard_count=SHARDS,
        tenants=[TenantConfig(tenant_id="t1", api_key_sha256=api_key_sha256(TENANT_KEY)),
                 TenantConfig(tenant_id="t2", api_key_sha256=api_key_sha256("other-key-0000")),
                 TenantConfig(tenant_id="sre", api_key_sha256=api_key_sha256(OPERATOR_KEY),
                              role="operator"),
                 TenantConfig(tenant_id="sre-viewer", api_key_sha256=api_key_sha256(VIEWER_KEY),
                              role="viewer")],
        replay=replay or replay_config(),
        peer_secret=PEER_SECRET,
    )  # fmt: skip
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient())

        @asynccontextmanager
        async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
            yield NodeRuntime("b", cluster, w.survivor, peers, LoopClock(), random.Random(1),
                              lambda: (1, 1), None, w.service)  # fmt: skip

        app = create_app(NodeSettings(region="b", cluster=cluster), runtime_factory=runtime)
        await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app)
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://b.test")
        )


def bearer(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}
