"""Admission over a real ``convplane up`` plane (3 node processes, SQLite): one tenant floods,
the other keeps being served; the flood is refused with 429 before any work, and forwards
between the nodes carry the peer secret, so the flooder is charged only where it entered."""

from __future__ import annotations

import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.e2e.plane import Plane, start_plane, stop_plane

FLOODERS = 6
FLOOD_REQUESTS_EACH = 60
VICTIM_CONVERSATIONS = 8


def _tenant_key(plane: Plane, tenant_id: str) -> str:
    keys = {t["tenant_id"]: t["api_key"] for t in plane.info["tenants"]}
    return str(keys[tenant_id])


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10.0).text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _flood(url: str, key: str, cid: str, stop: threading.Event) -> list[httpx.Response]:
    replies = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=20.0) as client:
        for i in range(FLOOD_REQUESTS_EACH):
            if stop.is_set():
                break
            body = {"type": "note", "payload": {"i": i}}
            replies.append(client.post(f"/v1/conversations/{cid}/events", json=body))
    return replies


def test_a_flooding_tenant_does_not_starve_another(tmp_path: Path) -> None:
    proc, plane = start_plane(tmp_path)
    stop = threading.Event()
    try:
        entry, leader = plane.urls["us-east"], plane.urls["eu-west"]
        flood_key = _tenant_key(plane, "demo-limited")
        flood_cid = plane.conversation_led_by("eu-west", "flood")  # forwarded by us-east
        created = httpx.post(
            entry + "/v1/conversations",
            json={"conversation_id": flood_cid},
            headers={"Authorization": f"Bearer {flood_key}"},
            timeout=20.0,
        )
        assert created.status_code == 201, created.text
        with ThreadPoolExecutor(FLOODERS) as pool:
            floods = [
                pool.submit(_flood, entry, flood_key, flood_cid, stop) for _ in range(FLOODERS)
            ]
            victim = []
            with plane.client("us-east") as c:
                for i in range(VICTIM_CONVERSATIONS):
                    cid = plane.conversation_led_by(("us-east", "eu-west")[i % 2], f"calm{i}")
                    victim.append(c.post("/v1/conversations", json={"conversation_id": cid}))
                    victim.append(c.post(f"/v1/conversations/{cid}/events", json={"type": "note"}))
            flood = [r for f in floods for r in f.result()]
        assert [r.status_code for r in victim] == [201] * len(victim), [r.text for r in victim]
        statuses = Counter(r.status_code for r in flood)
        assert set(statuses) <= {201, 429, 503}, statuses
        assert statuses[429] > 0 and statuses[201] > 0, statuses
        for r in flood:
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "quota_exceeded"
                assert int(r.headers["retry-after"]) >= 1
                assert r.headers["x-convplane-served-by"] == "us-east"  # refused at the entry
        quota_rejections = 'convplane_admission_rejections_total{reason="quota_exceeded"}'
        assert _metric(entry, quota_rejections) >= statuses[429]
        # the leader trusted every forward (peer secret) and charged nobody a second time
        assert _metric(leader, quota_rejections) == 0
        assert _metric(leader, "convplane_peer_auth_failures_total") == 0
        assert _metric(entry, "convplane_admission_limit") >= 1
    finally:
        stop.set()
        output = stop_plane(proc)
    assert proc.returncode == 0, output
