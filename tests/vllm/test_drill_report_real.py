"""A region-loss drill's LLM figures on a real vLLM (CPU build, tiny model) over a real Kafka
broker: the cache-recovery curve, live TTFT from the engine's own histogram, and replay
throughput, in the JSON report and its HTML page.

``convplane up --engine us-east=URL --engine eu-west=URL``: both survivors have the one vLLM,
so each survivor's live figures read the same engine (less its own replay's requests): the
next turns sent during the fault count at both. What this test holds the report to is what
the simulated engines' test (``tests/e2e/test_replay_failover.py``) cannot: that vLLM's own
``/metrics`` (its TTFT buckets, its prefix-cache counters) and its real prefill times turn
into the same figures.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.plane import stop_plane
from tests.vllm.servers import MODEL_REVISION, VllmServer
from tests.vllm.test_failover_real import (
    SURVIVORS,
    VICTIM,
    prompt_fields,
    start_engine_plane,
    wait_for_affinity,
    write_conversation,
)

pytestmark = pytest.mark.kafka

CONVERSATIONS = 2
#: the drill's hold: two ~600-token prefills on two shared cores take seconds
HOLD_S = 45.0
#: live requests sent to the engine before the drill (the "before" TTFT window)
LIVE_BEFORE = 3
#: a hang guard for the report (the hold, the restore and the read-back)
REPORT_WAIT_S = HOLD_S + 180.0


def _report(url: str, drill_id: str, headers: dict[str, str], accept: str) -> httpx.Response:
    """The report, a retryable 503 (the control shard moving with the victim) asked again."""
    deadline = time.monotonic() + REPORT_WAIT_S
    while True:
        r = httpx.get(f"{url}/v1/drills/{drill_id}/report",
                      headers={**headers, "Accept": accept}, timeout=30.0)  # fmt: skip
        if r.status_code != 503:
            assert r.status_code == 200, r.text
            return r
        assert time.monotonic() < deadline, r.text
        time.sleep(1.0)


def test_a_region_loss_drill_reports_cache_recovery_and_live_ttft_from_real_vllm(
    well_configured: VllmServer, kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    engine = well_configured.url
    proc, plane = start_engine_plane(engine, kafka_bootstrap_servers, tmp_path / "plane")
    try:
        operator = {"Authorization": f"Bearer {plane.info['operator_api_key']}"}
        cids = [plane.conversation_led_by(VICTIM, f"drill{i}") for i in range(CONVERSATIONS)]
        for i in range(LIVE_BEFORE):  # live traffic before the drill
            reply = httpx.post(engine + "/v1/chat/completions", timeout=120.0, json={
                "model": MODEL_REVISION, "max_completion_tokens": 1, "cache_salt": "before",
                "messages": [{"role": "user", "content": f"warm up {i} " * 40}]})  # fmt: skip
            assert reply.status_code == 200, reply.text
        guards = {"max_rto_s": 120.0, "max_error_ratio": 1.0, "max_ack_p99_ms": 120_000.0}
        drill = {"kind": "region-loss", "region": VICTIM, "hold_s": HOLD_S, "reason": "vllm",
                 "guards": guards}  # fmt: skip
        with plane.client("us-east") as client:
            for cid in cids:
                write_conversation(client, cid, stored_template=False)
            deadline = time.monotonic() + 60.0
            while True:  # preflight refuses while a shard cannot take its canary yet
                started = client.post("/v1/drills", json=drill, headers=operator, timeout=60.0)
                if started.status_code != 409 or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            assert started.status_code == 201, started.text
            drill_id = started.json()["drill_id"]
            wait_for_affinity(client, plane, cids)  # replayed on the survivors in the hold
            for cid in cids:  # the next turns, while the fault lasts
                route = client.get(f"/v1/conversations/{cid}/route")
                assert route.status_code == 200, route.text
                live = prompt_fields(cid, False, next_turn=True)
                reply = httpx.post(engine + "/v1/chat/completions", json={
                    "model": MODEL_REVISION, **live, "max_completion_tokens": 1,
                    "cache_salt": route.json()["cache_salt"]}, timeout=120.0)  # fmt: skip
                assert reply.status_code == 200, reply.text
                assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            deadline = time.monotonic() + REPORT_WAIT_S
            while True:
                body: dict[str, Any] = _report(plane.urls["us-east"], drill_id, operator,
                                               "application/json").json()  # fmt: skip
                if body["phase"] in ("done", "aborted", "failed"):
                    break
                assert time.monotonic() < deadline, body["phase"]
                time.sleep(1.0)
        for key in ("replay", "cache_recovery", "live_ttft"):
            print(f"{key}: {body[key]}")
        assert body["verdict"] == "passed", body["verdict_reason"]
        replay = body["replay"]
        assert replay["conversations_replayed"] >= len(cids), replay
        assert replay["tokens_replayed"] > 0 and replay["tokens_per_s"] > 0, replay
        assert replay["planner_tokens_per_s"] > 0, replay
        recovery = body["cache_recovery"]
        assert recovery["moved_conversations"] >= len(cids), recovery
        assert recovery["warm_conversations"] == recovery["moved_conversations"], recovery
        assert recovery["curve"][-1]["warm_share"] == 1.0, recovery
        assert 0 < recovery["time_to_target_share_s"] <= HOLD_S, recovery
        target = recovery["target"]
        assert target["passed"] == (target["time_to_share_s"] <= target["limit_s"]), target
        ttft = body["live_ttft"]
        assert sorted(ttft) == sorted(SURVIVORS), ttft
        for region, windows in ttft.items():
            before, during = windows["before"], windows["during"]
            # vLLM's own histogram: the warm-up requests (and the worker's self-check probes)
            assert before["requests"] >= LIVE_BEFORE, (region, windows)
            assert 0 < before["p50_s"] <= before["p99_s"], (region, windows)
            # the one engine's next turns, seen by both survivors; replay's prefills taken off
            assert during["requests"] >= len(cids), (region, windows)
            assert 0 < during["p50_s"] <= during["p99_s"], (region, windows)
            assert during["prefix_hit_ratio"] > 0, (region, windows)
        html = _report(plane.urls["us-east"], drill_id, operator, "text/html").text
        assert "Cache recovery" in html and "Live time to first token per survivor" in html
    finally:
        output = stop_plane(proc)
    assert proc.returncode == 0, output
