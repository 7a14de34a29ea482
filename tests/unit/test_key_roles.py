"""Roles of API keys at the REST layer: tenant keys cannot touch operator endpoints (403
``forbidden``), viewer keys read only, keys written before roles existed are tenant keys."""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from eventlog.clock import LoopClock
from services.bootstrap import NodeRuntime
from services.bootstrap.app import create_app
from services.config import ClusterConfig, NodeSettings, TenantConfig
from tests.unit.api_fakes import (
    KEY_A,
    OPERATOR_KEY,
    VIEWER_KEY,
    FakeLog,
    auth,
    cluster_config,
    cluster_with_roles,
    leaders,
)


@pytest.fixture
async def east() -> AsyncGenerator[httpx.AsyncClient]:
    settings = NodeSettings(region="east", cluster=cluster_with_roles())

    @asynccontextmanager
    async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
        yield NodeRuntime(
            "east", s.load_cluster(), FakeLog("east", leaders()), httpx.AsyncClient(),
            LoopClock(), random.Random(7), lambda: (4, 4),
        )  # fmt: skip

    app = create_app(settings, runtime_factory=runtime)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://east.test") as client:
            yield client


DRILL = {"kind": "region-loss", "region": "west", "hold_s": 5, "reason": "drill"}
OPERATOR_CALLS = [
    ("POST", "/v1/drills", DRILL),
    ("POST", "/v1/drills/d1/abort", {"reason": "stop"}),
    ("POST", "/v1/admin/halt", {"reason": "incident"}),
    ("DELETE", "/v1/admin/halt", None),
    ("POST", "/v1/admin/regions/west/evacuate", None),
    ("POST", "/v1/admin/regions/west/restore", None),
    ("POST", "/v1/audit", {"action": "key.create", "target": "t", "reason": "r"}),
]
OBSERVER_READS = ["/v1/drills", "/v1/drills/d1", "/v1/drills/d1/report", "/v1/audit",
                  "/v1/admin/halt"]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body"), OPERATOR_CALLS)
async def test_a_tenant_key_cannot_start_abort_halt_or_move_anything(
    east: httpx.AsyncClient, method: str, path: str, body: dict[str, object] | None
) -> None:
    for key in (KEY_A, VIEWER_KEY):
        r = await east.request(method, path, json=body, headers=auth(key))
        assert r.status_code == 403, (key, r.text)
        assert r.json() == {
            "error": {"code": "forbidden", "message": r.json()["error"]["message"],
                      "retryable": False}
        }  # fmt: skip


@pytest.mark.parametrize("path", OBSERVER_READS)
async def test_drills_reports_and_audit_are_for_operators_and_viewers(
    east: httpx.AsyncClient, path: str
) -> None:
    r = await east.get(path, headers=auth(KEY_A))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    for key in (OPERATOR_KEY, VIEWER_KEY):
        r = await east.get(path, headers=auth(key))
        # past the role check: this fake node runs no drill driver
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable", r.text


async def test_an_operator_key_passes_the_role_check_and_bad_drills_are_400(
    east: httpx.AsyncClient,
) -> None:
    r = await east.post("/v1/drills", json=DRILL, headers=auth(OPERATOR_KEY))
    assert r.status_code == 503  # past the role check: no drill driver on this fake node
    for bad in ({**DRILL, "hold_s": 0}, {**DRILL, "kind": "meteor"}, {**DRILL, "guards": {"x": 1}},
                {k: v for k, v in DRILL.items() if k != "reason"}):  # fmt: skip
        r = await east.post("/v1/drills", json=bad, headers=auth(OPERATOR_KEY))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", bad


async def test_a_drill_of_one_node_is_400_unless_a_kill_of_a_node_the_region_has(
    east: httpx.AsyncClient,
) -> None:
    """Checked before anything else of the plane is asked (this fake node runs no driver:
    a sound body gets past to its 503). west runs one node."""
    kill = {**DRILL, "kind": "kill"}
    for bad, says in (
        ({**DRILL, "node": 1}, "node applies to kill drills only, not to region-loss"),
        ({**kill, "node": 0}, "west runs one node: kill the region (leave out node) instead"),
    ):
        r = await east.post("/v1/drills", json=bad, headers=auth(OPERATOR_KEY))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        assert r.json()["error"]["message"] == says
    r = await east.post("/v1/drills", json={**kill, "node": -1}, headers=auth(OPERATOR_KEY))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    r = await east.post("/v1/drills", json=kill, headers=auth(OPERATOR_KEY))
    assert r.status_code == 503  # past every check: no drill driver here


async def test_a_viewer_key_reads_but_never_writes(east: httpx.AsyncClient) -> None:
    r = await east.post("/v1/conversations", json={}, headers=auth(VIEWER_KEY))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = await east.post("/v1/conversations", json={}, headers=auth(KEY_A))
    assert r.status_code == 201  # a tenant key still writes
    r = await east.get("/v1/regions", headers=auth(VIEWER_KEY))
    assert r.status_code == 503  # past auth: no controller on this fake node


def test_keys_written_before_roles_are_tenant_keys() -> None:
    body = cluster_config().model_dump()
    for tenant in body["tenants"]:
        tenant.pop("role")
    loaded = ClusterConfig.model_validate(body)
    assert {t.role for t in loaded.tenants} == {"tenant"}
    with pytest.raises(ValueError, match="role"):
        TenantConfig(tenant_id="x", api_key_sha256="0" * 64, role="root")  # type: ignore[arg-type]
