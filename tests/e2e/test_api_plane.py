"""The public API of a real 3-region plane: ``convplane up`` as a subprocess, SQLite replicas,
one node process per region, requests over HTTP."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.plane import Plane, start_plane, stop_plane


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    proc, plane = start_plane(tmp_path_factory.mktemp("plane"))
    try:
        yield plane
    finally:
        output = stop_plane(proc)
        assert proc.returncode == 0, output
        for region in plane.info["regions"]:
            with pytest.raises(ProcessLookupError):
                os.kill(region["node_pid"], 0)  # every node stopped with the supervisor


def test_cluster_json_describes_the_plane(plane: Plane) -> None:
    info = json.loads((Path(plane.info["cluster_file"]).parent / "cluster.json").read_text())
    assert info == plane.info
    assert [r["name"] for r in info["regions"]] == ["us-east", "eu-west", "ap-south"]
    for region in info["regions"]:
        assert region["db_pid"] is None and Path(region["path"]).exists()
        assert isinstance(region["node_pid"], int)
        assert httpx.get(region["url"] + "/healthz").json()["status"] == "ok"


def test_create_append_read(plane: Plane) -> None:
    region = "us-east"
    cid = plane.conversation_led_by(region, "basic")
    with plane.client(region) as c:
        created = c.post("/v1/conversations", json={"conversation_id": cid, "metadata": {"a": 1}})
        assert created.status_code == 201, created.text
        assert created.json()["leader_region"] == region
        url = f"/v1/conversations/{cid}/events"
        seqs = []
        for text in ("hello", "world"):
            r = c.post(url, json={"type": "message.user", "payload": {"content": text}})
            assert r.status_code == 201, r.text
            assert len(r.json()["acked_by"]) >= 2  # a majority of 3 regions
            assert r.json()["committed_at"].endswith("Z")
            seqs.append(r.json()["seq"])
        assert seqs == [1, 2]
        page = c.get(url, params={"after_seq": 0, "limit": 10}).json()
        assert [(e["seq"], e["payload"]["content"]) for e in page["events"]] == [
            (1, "hello"), (2, "world"),
        ]  # fmt: skip
        assert page["next_after_seq"] == 2
        conv = c.get(f"/v1/conversations/{cid}").json()
        assert conv["last_seq"] == 2 and conv["metadata"] == {"a": 1} and conv["epoch"] >= 1


def test_idempotent_retry_returns_the_same_seq(plane: Plane) -> None:
    cid = plane.conversation_led_by("eu-west", "idem")
    with plane.client("eu-west") as c:
        assert c.post("/v1/conversations", json={"conversation_id": cid}).status_code == 201
        url = f"/v1/conversations/{cid}/events"
        body = {"type": "message.user", "payload": {"content": "once"}}
        first = c.post(url, json=body, headers={"Idempotency-Key": "retry-1"})
        again = c.post(url, json=body, headers={"Idempotency-Key": "retry-1"})
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json()["seq"] == first.json()["seq"] == 1
        assert again.json()["event_id"] == first.json()["event_id"]
        assert c.get(f"/v1/conversations/{cid}").json()["last_seq"] == 1


def test_expected_seq_mismatch_is_409(plane: Plane) -> None:
    cid = plane.conversation_led_by("ap-south", "cas")
    with plane.client("ap-south") as c:
        assert c.post("/v1/conversations", json={"conversation_id": cid}).status_code == 201
        url = f"/v1/conversations/{cid}/events"
        assert c.post(url, json={"type": "note", "expected_seq": 0}).status_code == 201
        r = c.post(url, json={"type": "note", "expected_seq": 0})
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "seq_conflict"


def test_tool_effect_is_committed_once(plane: Plane) -> None:
    cid = plane.conversation_led_by("us-east", "tool")
    attempt = {"attempt_id": "att-1", "tool": "charge_card", "argument_digest": "sha256:abc"}
    effect = {"attempt_id": "att-1", "status": "committed", "receipt": "r-1"}
    with plane.client("us-east") as c:
        assert c.post("/v1/conversations", json={"conversation_id": cid}).status_code == 201
        url = f"/v1/conversations/{cid}/events"
        pending = c.get(f"/v1/conversations/{cid}/tool-attempts/att-1")
        assert pending.status_code == 404
        assert c.post(url, json={"type": "tool.attempt", "payload": attempt}).status_code == 201
        state = c.get(f"/v1/conversations/{cid}/tool-attempts/att-1").json()["state"]
        assert state == "pending"
        first = c.post(url, json={"type": "tool.effect", "payload": effect})
        assert first.status_code == 201, first.text
        repeat = c.post(url, json={"type": "tool.effect", "payload": effect})
        assert repeat.status_code in (200, 201) and repeat.json()["seq"] == first.json()["seq"]
        other = {**effect, "receipt": "r-2"}
        conflict = c.post(url, json={"type": "tool.effect", "payload": other})
        assert conflict.status_code == 409
        assert conflict.json()["error"]["code"] == "effect_conflict"
        status = c.get(f"/v1/conversations/{cid}/tool-attempts/att-1").json()
        assert status["state"] == "committed"
        assert [e["type"] for e in status["events"]] == ["tool.attempt", "tool.effect"]


def test_request_to_a_non_leader_region_is_forwarded(plane: Plane) -> None:
    cid = plane.conversation_led_by("ap-south", "fwd")
    with plane.client("us-east") as c:
        created = c.post("/v1/conversations", json={"conversation_id": cid})
        assert created.status_code == 201, created.text
        assert created.headers["x-convplane-served-by"] == "ap-south"
        assert created.json()["leader_region"] == "ap-south"
        url = f"/v1/conversations/{cid}/events"
        key = {"Idempotency-Key": "fwd-1"}
        first = c.post(url, json={"type": "note", "payload": {"n": 1}}, headers=key)
        again = c.post(url, json={"type": "note", "payload": {"n": 1}}, headers=key)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.headers["x-convplane-served-by"] == "ap-south"
        assert again.json()["seq"] == first.json()["seq"]
        page = c.get(url)
        assert page.headers["x-convplane-served-by"] == "ap-south"
        assert [e["seq"] for e in page.json()["events"]] == [1]
    with plane.client("eu-west") as c:  # and from the third region too
        assert c.get(f"/v1/conversations/{cid}").json()["last_seq"] == 1


def test_errors_metrics_and_auth_over_http(plane: Plane) -> None:
    url = plane.urls["us-east"]
    assert httpx.get(url + "/v1/conversations/x").status_code == 401
    with plane.client("us-east") as c:
        r = c.post("/v1/conversations", content=b"{", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        big = {"conversation_id": "big", "metadata": {"x": "y" * 300_000}}
        assert c.post("/v1/conversations", json=big).status_code == 413
        assert c.get("/v1/conversations/nope-404").status_code == 404
    metrics = httpx.get(url + "/metrics").text
    assert "convplane_http_requests_total" in metrics
    assert "convplane_append_ack_latency_seconds_bucket" in metrics
