"""The console's server side: the append outcome window (pure), the page and its security
headers, ``GET /v1/console/node`` and who may read it, the CORS rules that let a page served
by one region read the others, and the count of appends that entered a node."""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from services.api.append_outcomes import OutcomeWindow
from services.bootstrap import NodeRuntime
from services.bootstrap.app import create_app
from services.config import NodeSettings
from tests.unit.api_fakes import (
    KEY_A,
    OPERATOR_KEY,
    VIEWER_KEY,
    FakeLog,
    auth,
    cluster_with_roles,
    conversation_led_by,
    leaders,
)
from tests.unit.clocks import ManualClock

BROWSER_EAST = "http://localhost:8701"


# --- the outcome window (pure) ---------------------------------------------------------------


def test_the_window_counts_successes_and_server_errors_and_forgets_old_seconds() -> None:
    window = OutcomeWindow(window_s=10)
    for status in (201, 200, 201, 503, 504, 409, 400):
        window.record(100.2, status)
    rates = window.rates(100.9)
    assert rates.received_per_s == pytest.approx(0.7)
    assert rates.succeeded_per_s == pytest.approx(0.3)
    assert rates.errors_per_s == pytest.approx(0.2)
    assert rates.error_ratio == pytest.approx(2 / 5)  # 4xx are the client's: neither
    assert window.rates(109.9).received_per_s == pytest.approx(0.7)  # still inside
    later = window.rates(110.0)  # second 100 left the window
    assert (later.received_per_s, later.error_ratio) == (0.0, None)


def test_a_bucket_reused_for_a_later_second_starts_from_zero() -> None:
    window = OutcomeWindow(window_s=3)
    window.record(5.0, 500)
    window.record(8.5, 201)  # same bucket as second 5 (8 % 3 == 5 % 3)
    rates = window.rates(8.5)
    assert rates.received_per_s * 3 == pytest.approx(1.0)
    assert (rates.errors_per_s, rates.error_ratio) == (0.0, 0.0)


# --- the app ---------------------------------------------------------------------------------

DASHBOARD_URL = "https://grafana.example.test/d/convplane"


def test_a_dashboard_url_must_be_a_plain_http_url() -> None:
    """The console turns it into a link: a javascript: URL or anything with spaces is refused."""
    for bad in ("javascript:alert(1)", "https://a b", "ftp://x"):
        with pytest.raises(ValueError):
            NodeSettings(region="east", cluster=cluster_with_roles(), dashboard_url=bad)


@pytest.fixture
async def east_log() -> FakeLog:
    return FakeLog("east", leaders())


@pytest.fixture
def clock() -> ManualClock:
    # time stands still unless a test moves it; sleeps (admission's sweeper) are real and short
    return ManualClock(100.0, virtual_sleep=False)


@pytest.fixture
async def east(east_log: FakeLog, clock: ManualClock) -> AsyncGenerator[httpx.AsyncClient]:
    settings = NodeSettings(
        region="east",
        cluster=cluster_with_roles(),
        console_urls={"east": BROWSER_EAST},
        dashboard_url=DASHBOARD_URL,
    )

    @asynccontextmanager
    async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
        yield NodeRuntime(
            "east", s.load_cluster(), east_log, httpx.AsyncClient(), clock,
            random.Random(7), lambda: (4, 4),
        )  # fmt: skip

    app = create_app(settings, runtime_factory=runtime)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://east.test") as client:
            yield client


async def test_the_page_and_its_files_are_served_with_a_policy_naming_the_regions(
    east: httpx.AsyncClient,
) -> None:
    page = await east.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/console/static/console.js"' in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    connect = policy.split("connect-src ")[1].split(";")[0].split()
    # the cluster file's origins and where a browser reaches east (console_urls)
    assert connect == ["'self'", "http://east.test", BROWSER_EAST, "http://west.test"]
    for name, kind in (("console.js", "javascript"), ("console.css", "text/css")):
        asset = await east.get(f"/console/static/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]


async def test_the_node_view_answers_operator_and_viewer_keys_only(
    east: httpx.AsyncClient,
) -> None:
    for key, role in ((VIEWER_KEY, "viewer"), (OPERATOR_KEY, "operator")):
        r = await east.get("/v1/console/node", headers=auth(key))
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        assert body["region"] == "east" and body["you"]["role"] == role
        assert body["browser_urls"] == {"east": BROWSER_EAST, "west": "http://west.test"}
        assert body["dashboard_url"] == DASHBOARD_URL  # the page links it in its top bar
        assert body["appends"]["error_ratio"] is None  # nothing appended yet
    tenant = await east.get("/v1/console/node", headers=auth(KEY_A))
    assert tenant.status_code == 403 and tenant.json()["error"]["code"] == "forbidden"
    assert (await east.get("/v1/console/node")).status_code == 401


async def test_another_regions_page_may_call_with_a_key_and_a_foreign_page_may_not(
    east: httpx.AsyncClient,
) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    allowed = await east.options(
        "/v1/drills/d1/abort", headers={"Origin": "http://west.test", **preflight}
    )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://west.test"
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    refused = await east.options(
        "/v1/drills/d1/abort", headers={"Origin": "http://evil.test", **preflight}
    )
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers
    read = await east.get(
        "/v1/console/node", headers={"Origin": "http://west.test", **auth(VIEWER_KEY)}
    )
    assert read.headers["access-control-allow-origin"] == "http://west.test"
    metrics = await east.get("/metrics", headers={"Origin": "http://evil.test"})
    assert "access-control-allow-origin" not in metrics.headers


async def test_appends_that_entered_here_are_counted_with_their_outcome(
    east: httpx.AsyncClient, east_log: FakeLog, clock: ManualClock
) -> None:
    cid = conversation_led_by("east")
    tenant = auth(KEY_A)
    assert (await east.post("/v1/conversations", json={"conversation_id": cid},
                            headers=tenant)).status_code == 201  # fmt: skip
    note = {"type": "note", "payload": {"n": 1}}
    for i in range(3):
        r = await east.post(f"/v1/conversations/{cid}/events", json=note,
                            headers={**tenant, "Idempotency-Key": f"k{i}"})  # fmt: skip
        assert r.status_code == 201, r.text
    bad = await east.post(f"/v1/conversations/{cid}/events", json={"type": "nope"},
                          headers=tenant)  # fmt: skip
    assert bad.status_code == 400
    forwarded = await east.post(f"/v1/conversations/{cid}/events", json=note,
                                headers={**tenant, "X-Convplane-Forwarded": "west"})  # fmt: skip
    assert forwarded.status_code == 201  # served, but counted at its entry node, not here
    east_log.stall = True  # the next append cannot be acknowledged before its deadline
    unknown = await east.post(f"/v1/conversations/{cid}/events", json=note,
                              headers={**tenant, "X-Convplane-Deadline-Ms": "50"})  # fmt: skip
    assert unknown.status_code == 503
    body = (await east.get("/v1/console/node", headers=auth(VIEWER_KEY))).json()
    appends = body["appends"]
    window_s = appends["window_s"]
    assert round(appends["received_per_s"] * window_s) == 5
    assert round(appends["succeeded_per_s"] * window_s) == 3
    assert round(appends["errors_per_s"] * window_s) == 1
    assert appends["error_ratio"] == pytest.approx(1 / 4)
    clock.now_s += window_s  # a window later, on the node's clock, they are gone
    later = (await east.get("/v1/console/node", headers=auth(VIEWER_KEY))).json()["appends"]
    assert (later["received_per_s"], later["error_ratio"]) == (0.0, None)
