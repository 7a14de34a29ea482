"""``GET /v1/readiness`` and the readiness gauges, through the app (services.api.readiness_routes,
services.control.readiness): the monitor reads the plane as a drill's preflight does, and a
survivor whose prefill capacity drops makes its peer region's loss less ready."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.errors import NotLeader
from regions.control import Placement
from regions.membership import Membership, MembershipConfig
from regions.ops_state import OpsState
from regions.placement import place_shards
from regions.readiness import ReadinessPolicy
from services.bootstrap.app import create_app
from services.bootstrap.node import NodeRuntime
from services.cli.readiness import readiness_lines
from services.config import ClusterConfig, NodeSettings, RegionConfig, TenantConfig, api_key_sha256
from services.control.drills.load import PlaneLoad
from services.control.readiness import LoadSampler, ReadinessMonitor
from tests.unit.api_fakes import KEY_A, OPERATOR_KEY, VIEWER_KEY, FakeLog, auth

REGIONS = ("ap-south", "eu-west", "us-east")
SELF = "ap-south"
SHARDS = 6
CONTROL_SHARD = SHARDS


def cluster() -> ClusterConfig:
    keys = (("a", KEY_A, "tenant"), ("sre", OPERATOR_KEY, "operator"), ("watch", VIEWER_KEY, "viewer"))  # fmt: skip
    return ClusterConfig(
        regions=[RegionConfig(name=r, url=f"http://{r}.test", dsn=f"memory://{r}") for r in REGIONS],
        shard_count=SHARDS,
        tenants=[TenantConfig(tenant_id=t, api_key_sha256=api_key_sha256(k), role=role)  # type: ignore[arg-type]
                 for t, k, role in keys],
    )  # fmt: skip


@dataclass
class FakeNode:
    config: LogConfig = field(default_factory=LogConfig)
    leads_control: bool = True

    def leads(self, shard: int) -> bool:
        return shard != CONTROL_SHARD or self.leads_control


@dataclass
class FakeController:
    """What the monitor reads of ``Controller``: placement, membership, quorums, leadership."""

    cluster: ClusterConfig
    membership: Membership
    node: FakeNode = field(default_factory=FakeNode)
    control_shard: int = CONTROL_SHARD

    def placement(self) -> Placement:
        return Placement(1, place_shards(SHARDS, self.cluster.weights()), frozenset(), frozenset(), "t")  # fmt: skip

    async def read_barrier(self) -> None:
        if not self.node.leads_control:
            raise NotLeader("not the control leader", shard=CONTROL_SHARD, leader_region=None)


@dataclass
class World:
    client: httpx.AsyncClient
    #: region -> its replay view (``/peer/drills/load``'s ``replay``), changed by the test
    replay: dict[str, dict[str, float]]
    monitor: ReadinessMonitor
    controller: FakeController


def engines(spare: float) -> dict[str, float]:
    return {"live_tokens_per_s": 30_000.0, "spare_tokens_per_s": spare}


def monitor_for(
    sample_load: LoadSampler, clock: LoopClock
) -> tuple[ReadinessMonitor, FakeController]:
    membership = Membership(self_region=SELF, regions=REGIONS,
                            config=MembershipConfig(1.0, 5.0), started_s=clock.monotonic())  # fmt: skip
    for region in REGIONS[1:]:
        membership.probe_ok(region, clock.monotonic(), suspects=())
    controller = FakeController(cluster(), membership)
    return ReadinessMonitor(
        controller=controller,  # type: ignore[arg-type]
        ops=OpsState(),
        replica=None,
        sample_load=sample_load,
        clock=clock,
        region_append_capacity_per_s=2000.0,
        policy=ReadinessPolicy(),
        interval_s=300.0,
    ), controller


@pytest.fixture
async def world() -> AsyncIterator[World]:
    clock = LoopClock()
    replay = {r: engines(60_000.0) for r in REGIONS}

    async def sample_load() -> PlaneLoad:
        return PlaneLoad(append_rate_per_s=30.0, replay=dict(replay))

    monitor, controller = monitor_for(sample_load, clock)
    settings = NodeSettings(region=SELF, cluster=cluster())

    @asynccontextmanager
    async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
        async with httpx.AsyncClient() as peers:
            yield NodeRuntime(SELF, s.load_cluster(), FakeLog(SELF, {}), peers, clock,
                              random.Random(7), lambda: (0, 0), loss_readiness=monitor)  # fmt: skip

    app = create_app(settings, runtime_factory=runtime)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{SELF}.test")
        )  # fmt: skip
        yield World(client, replay, monitor, controller)


def by_region(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["region"]: r for r in body["regions"]}


async def test_readiness_falls_through_the_api_when_a_survivors_capacity_drops(
    world: World,
) -> None:
    r = await world.client.get("/v1/readiness", headers=auth(VIEWER_KEY))
    assert r.status_code == 200, r.text
    before = by_region(r.json())
    # no drill passed yet: every loss is feasible, but unproven (the drill term is 0)
    assert {b["status"] for b in before.values()} == {"at_risk"}
    assert before["us-east"]["capacity_ok"] and before["us-east"]["score"] == 50
    # eu-west's engines lose most of their capacity: 30,000 live + 5,000 spare tokens/s is
    # less than a survivor's share after losing us-east (90,000 over 2 = 45,000 tokens/s)
    world.replay["eu-west"] = engines(5_000.0)
    cached = await world.client.get("/v1/readiness", headers=auth(OPERATOR_KEY))
    assert by_region(cached.json())["us-east"]["status"] == "at_risk"  # the last evaluation
    r = await world.client.get("/v1/readiness?refresh=true", headers=auth(OPERATOR_KEY))
    after = by_region(r.json())
    assert (after["us-east"]["status"], after["us-east"]["score"]) == ("not_ready", 0)
    assert after["us-east"]["reasons"][0].startswith("capacity: prefill: infeasible")
    assert after["eu-west"]["capacity_ok"]  # losing the weak region itself leaves strong ones
    assert (r.json()["status"], r.json()["score"]) == ("not_ready", 0)
    # what `convplane readiness` prints of that answer
    lines = readiness_lines(r.json())
    assert lines[0] == "plane not_ready (score 0)"
    east = lines.index(next(line for line in lines if "lose us-east" in line))
    assert lines[east].split()[2:5] == ["not_ready", "score", "0"]
    assert "never drilled" in lines[east] and "capacity: prefill" in lines[east + 1]
    metrics = (await world.client.get("/metrics")).text
    samples = {
        (s.name, s.labels.get("region"), s.labels.get("status")): s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name.startswith("convplane_readiness")
    }
    assert samples[("convplane_readiness_score", "us-east", None)] == 0
    assert samples[("convplane_readiness_status", "us-east", "not_ready")] == 1
    assert samples[("convplane_readiness_status", "us-east", "at_risk")] == 0
    assert samples[("convplane_readiness_plane_score", None, None)] == 0


async def test_a_tenant_key_may_not_read_readiness_and_only_the_control_leader_evaluates(
    world: World,
) -> None:
    r = await world.client.get("/v1/readiness", headers=auth(KEY_A))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = await world.client.get("/v1/readiness?refresh=maybe", headers=auth(VIEWER_KEY))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    await world.monitor.step()
    assert world.monitor.evaluations == 1 and world.monitor.latest is not None
    await world.monitor.step()  # within the interval: nothing new to evaluate
    assert world.monitor.evaluations == 1
    world.controller.node.leads_control = False
    await world.monitor.step()
    assert world.monitor.latest is None  # the new control leader evaluates and exports now


async def test_concurrent_refreshes_share_the_evaluation_that_started_after_them() -> None:
    """Five refreshes while one evaluation runs: that one started before them and cannot
    answer them; the next, started after them all, answers every one."""
    gate = asyncio.Event()
    samples = 0

    async def slow_load() -> PlaneLoad:
        nonlocal samples
        samples += 1
        await gate.wait()
        return PlaneLoad(append_rate_per_s=30.0, replay={})

    monitor, _ = monitor_for(slow_load, LoopClock())
    first = asyncio.create_task(monitor.evaluate())
    await asyncio.sleep(0)
    asks = [asyncio.create_task(monitor.read(refresh=True)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    answers = await asyncio.gather(first, *asks)
    assert (samples, monitor.evaluations) == (2, 2)
    assert all(a is answers[1] for a in answers[1:]) and answers[0] is not answers[1]
