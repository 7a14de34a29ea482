"""A real Prometheus server (Debian's ``prometheus`` package) scrapes a real local plane with
convplane's own rules loaded; through Prometheus's HTTP API the series are there, and when a
region's node is killed the alerts fire and the survivors' failover series move.

Prometheus runs on a free loopback port with its own config and data directory under the
test's tmp_path, scraping and evaluating every second so every wait stays short (and bounded).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from services.local.host import free_port
from tests.e2e.plane import Plane, start_plane, stop_plane

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "observability" / "rules" / "convplane.rules.yml"
VICTIM = "ap-south"
READY_WAIT_S = 60.0
SERIES_WAIT_S = 60.0
ALERT_WAIT_S = 90.0
#: series the dashboard and rules read, which a plane that served appends must show
SERIES = (
    "convplane_shards_led",
    "convplane_region_status",
    "convplane_append_ack_latency_seconds_bucket",
    "convplane_forward_duration_seconds_bucket",
    "convplane_replica_call_duration_seconds_bucket",
    "convplane_replica_lag_entries",
    "convplane_placement_changes_total",
    "convplane_admission_limit",
    "convplane_background_loop_crash_looping",
)


def _wait_for(what: str, timeout_s: float, probe: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"{what} not seen within {timeout_s:.0f} s (last: {last!r})")


class Prometheus:
    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=10.0)

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.client.get("/api/v1/query", params={"query": expr}).json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        alerts = self.client.get("/api/v1/alerts").json()["data"]["alerts"]
        return [
            a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"
        ]


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    proc, plane = start_plane(tmp_path / "plane")
    try:
        yield plane
    finally:
        stop_plane(proc)


@pytest.fixture
def prometheus(tmp_path: Path, plane: Plane) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: apt-get install prometheus (.ci/run does)")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "convplane",
                "static_configs": [
                    {"targets": [urlsplit(url).netloc], "labels": {"node": region}}
                    for region, url in plane.urls.items()
                ],
            }
        ],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log_file = tmp_path / "prometheus.log"
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                err = log_file.read_text(errors="replace")[-3000:]
                pytest.fail(f"prometheus exited with {proc.returncode}:\n{err}")
            try:
                return server.client.get("/-/ready").status_code == 200
            except httpx.TransportError:
                return False

        _wait_for("prometheus ready", READY_WAIT_S, ready)
        yield server
    finally:
        server.client.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _write_some_events(plane: Plane) -> None:
    """Appends entered at one region for conversations led by each: local acks and forwards."""
    with plane.client("us-east") as client:
        for leader in plane.urls:
            cid = plane.conversation_led_by(leader, f"prom-{leader}")
            assert client.post("/v1/conversations", json={"conversation_id": cid}).status_code in (
                200,
                201,
            )
            for i in range(3):
                r = client.post(
                    f"/v1/conversations/{cid}/events",
                    json={"type": "note", "payload": {"i": i}},
                    headers={"Idempotency-Key": f"{cid}-{i}"},
                )
                assert r.status_code == 201, r.text


def test_prometheus_sees_the_series_and_alerts_when_a_region_is_killed(
    plane: Plane, prometheus: Prometheus
) -> None:
    _write_some_events(plane)
    for name in SERIES:
        _wait_for(f"series {name}", SERIES_WAIT_S, functools.partial(prometheus.query, name))
    led = _wait_for(
        "shards led by every region",
        SERIES_WAIT_S,
        lambda: len(prometheus.query("convplane:shards_led > 0")) == 3,
    )
    assert led
    assert not prometheus.firing("ConvplaneRegionDown")

    victim = next(r for r in plane.info["regions"] if r["name"] == VICTIM)
    os.kill(victim["node_pid"], signal.SIGKILL)

    down = _wait_for(
        "ConvplaneRegionDown", ALERT_WAIT_S, lambda: prometheus.firing("ConvplaneRegionDown")
    )
    assert {a["labels"]["region"] for a in down} == {VICTIM}
    suspected = _wait_for(
        "ConvplaneRegionSuspected",
        ALERT_WAIT_S,
        lambda: prometheus.firing("ConvplaneRegionSuspected"),
    )
    assert {a["labels"]["region"] for a in suspected} == {VICTIM}
    failovers = _wait_for(
        "failovers counted by the survivors",
        ALERT_WAIT_S,
        lambda: prometheus.query(f'sum(convplane_failovers_total{{from_region="{VICTIM}"}}) > 0'),
    )
    assert float(failovers[0]["value"][1]) >= 1
    rto = prometheus.query("sum(convplane_failover_rto_seconds_count)")
    assert rto and float(rto[0]["value"][1]) >= 1
