"""A region-loss drill on the lab: each region its own host (its PostgreSQL and its node on the
host's address, under a CPU quota). The drill black-holes the region that leads the control
shard (the drill's own driver moves with it); its shards fail over to the other hosts, the
drill's canaries measure the RTO, the region is restored, and the report says passed with no
acknowledged canary lost. Driven over HTTP with the operator key from the root namespace.

Needs the lab and local PostgreSQL binaries; fails loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.lab import Lab
from tests.harness.lab_plane import lab_plane

SHARDS = 16
HOST_CPU_QUOTA = 1.0
HOLD_S = 6.0
#: a hang guard: preflight retries, the hold, the restore and the read-back on a loaded machine
DRILL_WAIT_S = 180.0


def _call(urls: list[str], key: str, method: str, path: str, **kw: Any) -> httpx.Response:
    """The first region's answer other than a retryable 503 (the control shard between
    leaders while the drill moves it), retried under ``DRILL_WAIT_S``."""
    deadline = time.monotonic() + DRILL_WAIT_S
    while True:
        for url in urls:
            try:
                r = httpx.request(method, url + path, timeout=20.0, trust_env=False,
                                  headers={"Authorization": f"Bearer {key}"}, **kw)  # fmt: skip
            except httpx.TransportError:
                continue
            if r.status_code != 503:
                return r
        assert time.monotonic() < deadline, f"{method} {path}: every region 503 or unreachable"
        time.sleep(0.5)


def _drill_of_the_control_leader(urls: list[str], key: str) -> dict[str, Any]:
    placement = _call(urls, key, "GET", "/v1/placement").json()
    target = placement["control_leader"]
    drill = {"kind": "region-loss", "region": target, "hold_s": HOLD_S, "reason": "lab drill"}
    deadline = time.monotonic() + DRILL_WAIT_S
    while True:  # preflight refuses while a shard cannot take its canary yet
        started = _call(urls, key, "POST", "/v1/drills", json=drill)
        if started.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert started.status_code == 201, started.text
    drill_id = started.json()["drill_id"]
    while True:
        report: dict[str, Any] = _call(urls, key, "GET", f"/v1/drills/{drill_id}/report").json()
        if report["phase"] in ("done", "aborted", "failed"):
            return report
        assert time.monotonic() < deadline, report["phase"]
        time.sleep(0.5)


@pytest.mark.postgres
async def test_a_region_loss_drill_of_the_control_leaders_host_passes_on_the_lab(
    lab: Lab, chaos_dir: Path
) -> None:
    plane = lab_plane(lab, chaos_dir / "plane", SHARDS, cpu_quota=HOST_CPU_QUOTA)
    try:
        info = await asyncio.to_thread(plane.start)
        urls = [r["url"] for r in info["regions"]]
        report = await asyncio.to_thread(
            _drill_of_the_control_leader, urls, info["operator_api_key"]
        )
    finally:
        await asyncio.to_thread(plane.stop)
    print(f"\nlab drill of {report['region']}: {report['verdict']} ({report['verdict_reason']}); "
          f"RTO by shard {report['rto_by_shard_s']}, canaries {report['canary_acked']} acked")  # fmt: skip
    assert report["verdict"] == "passed", report
    assert report["shards_moved"] > 0 and report["shards_recovered"] == report["shards_moved"]
    assert report["canary_acked"] > 0 and report["canary_lost"] == 0, report
    phases = [t["phase"] for t in report["timeline"]]
    assert phases == ["planned", "preflight", "injecting", "holding", "restoring", "done"]
