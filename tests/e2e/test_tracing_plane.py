"""Tracing on a real plane, configured only by the standard environment
(``OTEL_TRACES_EXPORTER=console``): an append entered at one region for a conversation led by
another is one trace in both node processes (a forward over the peers' mutual-TLS listener),
and the leader's replica appends are in it. The console exporter writes each span as a JSON
object into the node's log, next to the node's own JSON log lines; spans queued at shutdown
are flushed before the node exits.

A replica append is traced in the context of the task that sends it: a follower's send
already in flight picks up the new entry in its own next send, outside the request's trace
(a clean-clone CI run here saw the leader's own append missing from it). So several appends
are made; each must be one trace in both processes, and at least one must carry the leader's
own replica append and another region's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.plane import start_plane, stop_plane

ENTRY, LEADER = "us-east", "eu-west"
APPENDS = 5


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in a log that holds one-line log records and multi-line spans."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        try:
            obj, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("\n", at) + 1 or len(text)
            continue
        if isinstance(obj, dict):
            objects.append(obj)
    return objects


def _spans(state: Path, region: str) -> list[dict[str, Any]]:
    objects = _json_objects((state / region / "node.log").read_text(errors="replace"))
    return [o for o in objects if "context" in o and "name" in o]


def test_a_forwarded_append_is_one_trace_in_both_node_processes(tmp_path: Path) -> None:
    state = tmp_path / "plane"
    proc, plane = start_plane(state, env={"OTEL_TRACES_EXPORTER": "console"})
    try:
        cid = plane.conversation_led_by(LEADER, "otel")
        with plane.client(ENTRY) as client:
            assert client.post("/v1/conversations", json={"conversation_id": cid}).status_code in (
                200,
                201,
            )
            for i in range(APPENDS):
                r = client.post(
                    f"/v1/conversations/{cid}/events",
                    json={"type": "note"},
                    headers={"Idempotency-Key": f"otel-{i}"},
                )
                assert r.status_code == 201, r.text
                assert r.headers["x-convplane-served-by"] == LEADER
    finally:
        output = stop_plane(proc)
    assert proc.returncode == 0, output
    entry, leader = _spans(state, ENTRY), _spans(state, LEADER)
    appends_in = [
        s
        for s in entry
        if s["kind"] == "SpanKind.SERVER" and s["name"].startswith("POST /v1/conversations/")
        and s["name"].endswith("/events")
    ]  # fmt: skip
    assert len(appends_in) == APPENDS, [s["name"] for s in entry]
    replicas_traced = []
    for append in appends_in:
        trace_id = append["context"]["trace_id"]
        served = [
            s
            for s in leader
            if s["context"]["trace_id"] == trace_id and s["kind"] == "SpanKind.SERVER"
        ]
        assert len(served) == 1 and served[0]["parent_id"] is not None
        replicas_traced.append({
            s["attributes"]["convplane.replica_region"]
            for s in leader
            if s["context"]["trace_id"] == trace_id and s["name"] == "replica.append"
        })  # fmt: skip
    assert any(LEADER in r and len(r) >= 2 for r in replicas_traced), replicas_traced
