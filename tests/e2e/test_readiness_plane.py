"""Readiness on a real plane (``convplane up``, 3 regions, SQLite): ``GET /v1/readiness`` is
answered by the control leader from the live load and the drill records, a passed drill makes
its region ready, and the region's loss stops being ready when the live load outgrows what a
survivor can take (the plane runs with a survivor capacity of 5 appends/s:
``CONVPLANE_REGION_APPEND_CAPACITY_PER_S``), and is ready again once the load is gone."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.plane import Plane, start_plane, stop_plane

#: appends/s one region sustains on this plane: an idle plane (counted as 1 append/s per
#: region) needs 1.5 per survivor after a loss (fits); under the writers' load (~25 appends/s
#: on a loaded 2-core machine) a survivor needs ~12 (does not)
CAPACITY_PER_S = 5
WRITERS = 6
DRILL_END_WAIT_S = 120.0
PREFLIGHT_RETRY_S = 30.0
READ_RETRY_S = 30.0
#: the load meter's window (services.control.drills.load.LOAD_WINDOW_S) and some slack
LOAD_SETTLE_S = 15.0
VERDICT_WAIT_S = 60.0


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    env = {"CONVPLANE_REGION_APPEND_CAPACITY_PER_S": str(CAPACITY_PER_S)}
    proc, plane = start_plane(tmp_path_factory.mktemp("readiness"), env=env)
    try:
        yield plane
    finally:
        output = stop_plane(proc)
        assert proc.returncode == 0, output


def call(plane: Plane, method: str, path: str, key: str, **kw: Any) -> httpx.Response:
    """The first region that answers other than 503 (the control shard between leaders, e.g.
    while a drill moves it), under a bound."""
    deadline = time.monotonic() + READ_RETRY_S
    while True:
        for url in plane.urls.values():
            r = httpx.request(method, url + path, headers={"Authorization": f"Bearer {key}"},
                              timeout=30.0, **kw)  # fmt: skip
            if r.status_code != 503:
                return r
        assert time.monotonic() < deadline, r.text
        time.sleep(0.5)


def readiness(plane: Plane) -> dict[str, Any]:
    r = call(plane, "GET", "/v1/readiness?refresh=true", plane.info["viewer_api_key"])
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def region(body: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in body["regions"] if r["region"] == name)


def run_drill(plane: Plane, target: str) -> str:
    drill = {"kind": "region-loss", "region": target, "hold_s": 2.0, "reason": f"e2e {uuid.uuid4()}"}  # fmt: skip
    operator = plane.info["operator_api_key"]
    deadline = time.monotonic() + PREFLIGHT_RETRY_S
    while True:  # preflight refuses while a shard cannot take its canary yet: retried
        r = call(plane, "POST", "/v1/drills", operator, json=drill)
        if not (r.status_code == 409 and "shards not writable" in r.text):
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(1.0)
    assert r.status_code == 201, r.text
    drill_id: str = r.json()["drill_id"]
    deadline = time.monotonic() + DRILL_END_WAIT_S
    while True:
        d = call(plane, "GET", f"/v1/drills/{drill_id}", operator).json()
        if d["phase"] in ("done", "aborted", "failed"):
            assert d["verdict"] == "passed", d
            return drill_id
        assert time.monotonic() < deadline, d
        time.sleep(0.5)


def write_load(plane: Plane, stop: threading.Event, acked: list[int]) -> None:
    """Notes appended as fast as one client can to conversations of every region."""
    cids = [plane.conversation_led_by(r, f"load-{uuid.uuid4().hex[:6]}") for r in plane.urls]
    with plane.client(next(iter(plane.urls))) as client:
        for cid in cids:
            assert (
                client.post("/v1/conversations", json={"conversation_id": cid}).status_code == 201
            )
        while not stop.is_set():
            for cid in cids:
                r = client.post(f"/v1/conversations/{cid}/events", json={"type": "note"})
                acked[0] += r.status_code == 201


def test_readiness_follows_drills_and_falls_when_the_load_outgrows_a_survivor(
    plane: Plane,
) -> None:
    before = readiness(plane)
    # idle and never drilled: every loss is feasible but unproven
    assert [(r["status"], r["score"]) for r in before["regions"]] == [("at_risk", 50)] * 3
    assert all(r["quorum_ok"] and r["capacity_ok"] for r in before["regions"])

    drill_id = run_drill(plane, "us-east")
    drilled = readiness(plane)
    east = region(drilled, "us-east")
    assert east["last_passed_drill"]["drill_id"] == drill_id
    assert (east["status"], east["score"]) == ("ready", 100)
    assert drilled["status"] == "at_risk"  # the other regions are still unproven

    stop, acked = threading.Event(), [0]
    writers = [threading.Thread(target=write_load, args=(plane, stop, acked)) for _ in range(WRITERS)]  # fmt: skip
    for w in writers:
        w.start()
    try:
        deadline = time.monotonic() + VERDICT_WAIT_S
        while region(loaded := readiness(plane), "us-east")["status"] != "not_ready":
            assert time.monotonic() < deadline, (acked, region(loaded, "us-east"))
            time.sleep(1.0)
    finally:
        stop.set()
        for w in writers:
            w.join()
    east = region(loaded, "us-east")
    assert east["score"] == 0 and not east["capacity_ok"], east
    assert east["capacity"]["rate_per_survivor"] > CAPACITY_PER_S
    assert east["reasons"][0].startswith("capacity: infeasible"), east
    metrics = httpx.get(plane.urls["ap-south"] + "/metrics", timeout=20.0).text
    assert "convplane_readiness_score" in metrics

    time.sleep(LOAD_SETTLE_S)  # the load meter's window passes
    after = region(readiness(plane), "us-east")
    assert (after["status"], after["score"]) == ("ready", 100), after
