"""The peer endpoints answer only nodes: a probe reply steers failure detection."""

from __future__ import annotations

import random

import httpx
from fastapi import FastAPI

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from services.api.auth import Tenants
from services.api.context import ApiState, AppServices, set_app_services
from services.api.control_routes import peer_router
from services.api.errors import install_error_handlers
from services.api.forwarding import Forwarder
from services.api.metrics import Metrics
from services.config import NodeSettings
from services.control.controller import Controller
from services.control.region_nodes import fixed_peer_urls
from tests.unit.api_fakes import cluster_config

SECRET = "s" * 40
#: never used to send here (no probing loop runs); only closed transports, so nothing to leak
PEERS = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(503)))


class NoPeers:
    async def health(self, region: str) -> None:
        return None


def peer_app(peer_secret: str | None) -> FastAPI:
    cluster = cluster_config().model_copy(update={"peer_secret": peer_secret})
    replicas = {r.name: MemoryReplica(r.name) for r in cluster.regions}
    clock, rng = LoopClock(), random.Random(1)
    node = LogNode(
        region="east", replicas=replicas, config=LogConfig(shard_count=4), clock=clock, rng=rng
    )
    settings = NodeSettings(region="east", cluster=cluster)
    metrics = Metrics("east")
    app = FastAPI()
    install_error_handlers(app, 1.0, metrics.count_error)
    app.include_router(peer_router)
    forwarder = Forwarder(
        client=PEERS,
        peer_url=fixed_peer_urls({}),
        clock=clock,
        rng=rng,
        metrics=metrics,
        retries_max=0,
        backoff_s=0.1,
        source_region="east",
    )
    api = ApiState(
        region="east",
        settings=settings,
        cluster=cluster,
        log=node,
        tenants=Tenants(cluster.tenants, clock),
        forwarder=forwarder,
        metrics=metrics,
        clock=clock,
        rng=rng,
        readiness=lambda: (0, 0),
    )
    controller = Controller(
        settings=settings,
        cluster=cluster,
        node=node,
        replicas=replicas,
        prober=NoPeers(),
        clock=clock,
        rng=rng,
    )
    set_app_services(app, AppServices(api=api, controller=controller))
    return app


async def get(app: FastAPI, path: str, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://east.test") as client:
        return await client.get(path, headers=headers)


async def test_peer_endpoints_refuse_callers_without_the_secret() -> None:
    app = peer_app(SECRET)
    for path in ("/peer/health", "/peer/placement"):
        for headers in ({}, {"X-Convplane-Peer-Auth": "wrong"}):
            r = await get(app, path, headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "unauthorized"


async def test_peer_endpoints_answer_nodes() -> None:
    r = await get(peer_app(SECRET), "/peer/health", {"X-Convplane-Peer-Auth": SECRET})
    assert r.status_code == 200
    assert r.json()["region"] == "east"


async def test_without_a_cluster_secret_the_peer_endpoints_are_open() -> None:
    r = await get(peer_app(None), "/peer/placement", {})
    assert r.status_code == 200
    assert "assignment" in r.json()
