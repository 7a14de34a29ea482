"""KV replay after a region fails, end to end and without a GPU: ``convplane up --sim-engines 1``
(3 regions, SQLite, one simulated inference engine per region: real HTTP, vLLM-shaped API,
simulated prefill and prefix cache), conversations homed in ap-south, ap-south's node killed.

The survivors take its shards (automatic failover: ``services.control.controller``), their replay
services list the moved conversations, their in-process workers prefill them on the survivors'
simulated engines, and ``/affinity`` names the warm engine. The conversations are agent
conversations with a tool call (``tests.tool_conversation``); the chat application then sends its
next turn from its own messages with the ``cache_salt`` and ``model_revision`` that ``/route``
hands out, and finds the whole transcript prefix in the prefix cache (to 16-token blocks).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from replay.chat import ChatPrompt
from replay.engines.sim_core import BLOCK_TOKENS, sim_tokenize
from tests import tool_conversation as conv
from tests.e2e.plane import start_plane, stop_plane

READY_WAIT_S = 120.0
REPLAY_WAIT_S = 90.0
CONVERSATIONS = 4
VICTIM = "ap-south"
#: a drill's hold: the moved conversations are replayed well within it
HOLD_S = 30.0


TURN_WORDS = 200


def write_conversation(client: httpx.Client, cid: str) -> None:
    r = client.post("/v1/conversations", json={"conversation_id": cid})
    assert r.status_code == 201, r.text
    assert r.headers["x-convplane-served-by"] == VICTIM
    for body in conv.append_bodies(cid, TURN_WORDS):
        r = client.post(f"/v1/conversations/{cid}/events", json=body)
        assert r.status_code == 201, r.text
    orphan = {"type": "message.tool", "payload": {"content": "a result without its call id"}}
    r = client.post(f"/v1/conversations/{cid}/events", json=orphan)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text


def wait_for_affinity(client: httpx.Client, cids: list[str]) -> dict[str, dict[str, Any]]:
    workers: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + REPLAY_WAIT_S
    while len(workers) < len(cids):
        for cid in cids:
            if cid in workers:
                continue
            r = client.get(f"/v1/conversations/{cid}/affinity")
            if r.status_code == 200 and r.json()["worker"] is not None:
                workers[cid] = {**r.json()["worker"], "region": r.json()["region"]}
        if time.monotonic() > deadline:
            pytest.fail(f"no affinity after {REPLAY_WAIT_S}s for {set(cids) - set(workers)}")
        time.sleep(0.2)
    return workers


def live_prompt(cid: str) -> ChatPrompt:
    """The application's next turn, from its own messages (not from the log)."""
    return ChatPrompt.of_messages(
        [*conv.messages(cid, TURN_WORDS), conv.next_user_message(cid)],
        tools=tuple(conv.TOOLS),
        chat_template_kwargs=conv.SETTINGS["chat_template_kwargs"],
    )


def transcript_tokens(cid: str) -> list[int]:
    prompt = ChatPrompt.of_messages(
        conv.messages(cid, TURN_WORDS),
        tools=tuple(conv.TOOLS),
        chat_template_kwargs=conv.SETTINGS["chat_template_kwargs"],
    )
    return sim_tokenize(prompt)


def engine_prompt_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5.0).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prompt_tokens_total")
    )


def test_survivors_rebuild_moved_conversations_and_the_next_turn_hits_the_cache(
    tmp_path: Path,
) -> None:
    proc, plane = start_plane(tmp_path / "plane", "--sim-engines", "1", ready_wait_s=READY_WAIT_S)
    try:
        engines = plane.info["sim_engines"]
        assert {e["region"] for e in engines} == {"us-east", "eu-west", VICTIM}
        assert all(e["simulated"] for e in engines)
        cids = [plane.conversation_led_by(VICTIM, f"replay{i}") for i in range(CONVERSATIONS)]
        cids = list(dict.fromkeys(cids))  # ids are per prefix, so they differ
        with plane.client("us-east") as client:
            for cid in cids:
                write_conversation(client, cid)

            victim = next(r for r in plane.info["regions"] if r["name"] == VICTIM)
            os.kill(victim["node_pid"], signal.SIGKILL)
            workers = wait_for_affinity(client, cids)

            for worker in workers.values():
                assert worker["region"] != VICTIM
                assert worker["engine_id"].startswith(worker["region"])
                assert worker["prompt_tokens"] > 800  # ~840 words + chat framing + tools
            replayed = 0
            # replay status shows engines and workers: operator and viewer keys only
            operator = {"Authorization": f"Bearer {plane.info['operator_api_key']}"}
            for region in ("us-east", "eu-west"):
                status = httpx.get(plane.urls[region] + "/v1/replays", headers=operator,
                                   timeout=10.0).json()  # fmt: skip
                assert status["mode"] == "embedded"
                replayed += status["counts"].get("result_replayed", 0)
                metrics = httpx.get(plane.urls[region] + "/metrics", timeout=10.0).text
                assert "convplane_replay_replayed_tokens_total" in metrics
            assert replayed >= len(cids)
            survivor_engines = [e["url"] for e in engines if e["region"] != VICTIM]
            assert sum(engine_prompt_tokens(u) for u in survivor_engines) >= 700 * len(cids)

            cid = cids[0]
            worker = workers[cid]
            route = client.get(f"/v1/conversations/{cid}/route")
            assert route.status_code == 200, route.text
            assert route.json()["region"] == worker["region"]
            assert route.json()["worker"]["engine_id"] == worker["engine_id"]
            assert route.json()["model_revision"] == worker["model_revision"]
            salt = route.json()["cache_salt"]
            assert len(bytes.fromhex(salt)) == 32  # 256 bits, keyed per tenant
            prompt = live_prompt(cid)
            reply = httpx.post(
                worker["engine_url"] + "/v1/chat/completions",
                json={"model": route.json()["model_revision"], **prompt.request_fields(),
                      "max_completion_tokens": 1, "cache_salt": salt},
                timeout=30.0,
            )  # fmt: skip
            assert reply.status_code == 200, reply.text
            usage = reply.json()["usage"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            # the whole transcript (all but its generation prompt's last token), to blocks
            transcript = transcript_tokens(cid)
            assert cached == (len(transcript) - 1) // BLOCK_TOKENS * BLOCK_TOKENS, usage
            assert usage["prompt_tokens"] == len(sim_tokenize(prompt))
            print(f"replayed {replayed} conversations; live prompt {usage['prompt_tokens']} "
                  f"tokens, {cached} cached on {worker['engine_id']}")  # fmt: skip
    finally:
        output = stop_plane(proc)
    assert proc.returncode == 0, output
    for engine in plane.info["sim_engines"]:
        with pytest.raises(ProcessLookupError):
            os.kill(engine["pid"], 0)


PREFLIGHT_RETRY_S = 30.0
#: live requests sent to each survivor's engine before the drill (its "before" TTFT)
LIVE_BEFORE = 3


def engine_model(url: str) -> str:
    models = httpx.get(url + "/v1/models", timeout=10.0).json()
    return str(models["data"][0]["id"])


def live_turn(client: httpx.Client, cid: str) -> dict[str, Any]:
    """The application's next turn of ``cid``, sent where ``/route`` says, with its salt; the
    engine's usage."""
    route = client.get(f"/v1/conversations/{cid}/route")
    assert route.status_code == 200 and route.json()["worker"] is not None, route.text
    prompt = live_prompt(cid)
    reply = httpx.post(
        route.json()["worker"]["engine_url"] + "/v1/chat/completions",
        json={"model": route.json()["model_revision"], **prompt.request_fields(),
              "max_completion_tokens": 1, "cache_salt": route.json()["cache_salt"]},
        timeout=30.0,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    return dict(reply.json()["usage"])


def report_page(url: str, drill_id: str, operator: dict[str, str]) -> str:
    """The drill report as HTML. A retryable 503 (the control shard that answers drill reads
    changing leaders after failback, so a forward can reach the old leader) is retried, as the
    error body says to, under a bound."""
    deadline = time.monotonic() + REPLAY_WAIT_S
    while True:
        r = httpx.get(f"{url}/v1/drills/{drill_id}/report",
                      headers={**operator, "Accept": "text/html"}, timeout=10.0)  # fmt: skip
        if r.status_code != 503:
            assert r.status_code == 200, r.text
            return r.text
        assert r.json()["error"]["retryable"] and time.monotonic() < deadline, r.text
        time.sleep(0.5)


def test_a_region_loss_drill_checks_prefill_and_reports_what_replay_rebuilt(
    tmp_path: Path,
) -> None:
    """A drill on a plane with engines: the dry run checks the survivors' live prefill and
    bounds the replay time, and the report says what replay rebuilt during the drill."""
    proc, plane = start_plane(tmp_path / "plane", "--sim-engines", "1", ready_wait_s=READY_WAIT_S)
    try:
        cids = [plane.conversation_led_by(VICTIM, f"drill{i}") for i in range(2)]
        operator = {"Authorization": f"Bearer {plane.info['operator_api_key']}"}
        # timing guards wide open: this test is about replay's numbers, not the RTO (the drill
        # tests in test_drills.py hold that to its promise)
        guards = {"max_rto_s": 60.0, "max_error_ratio": 1.0, "max_ack_p99_ms": 60_000.0}
        drill = {"kind": "region-loss", "region": VICTIM, "hold_s": HOLD_S, "reason": "e2e",
                 "guards": guards}  # fmt: skip
        survivor_engines = [e["url"] for e in plane.info["sim_engines"] if e["region"] != VICTIM]
        for url in survivor_engines:  # live traffic before the drill: its "before" TTFT
            model = engine_model(url)
            for i in range(LIVE_BEFORE):
                reply = httpx.post(url + "/v1/chat/completions", timeout=30.0, json={
                    "model": model, "max_completion_tokens": 1, "cache_salt": "e2e",
                    "messages": [{"role": "user", "content": f"warm up {i} " * 100}]})  # fmt: skip
                assert reply.status_code == 200, reply.text
        with plane.client("us-east") as client:
            for cid in cids:
                write_conversation(client, cid)
            dry = client.post("/v1/drills", json={**drill, "dry_run": True}, headers=operator,
                              timeout=30.0)  # fmt: skip
            assert dry.status_code == 200, dry.text
            plan = dry.json()["plan"]
            assert plan["ok"] and plan["conversations_moved"] >= len(cids), plan
            assert plan["capacity"]["prefill"]["survivor_prefill_capacity_tokens_per_s"] > 0
            assert plan["replay_time_min_s"] > 0  # replay tokens over the survivors' spare
            preflight_deadline = time.monotonic() + PREFLIGHT_RETRY_S
            while True:  # preflight refuses while a shard cannot take its canary yet: retried
                started = client.post("/v1/drills", json=drill, headers=operator, timeout=30.0)
                refused = started.status_code == 409 and "shards not writable" in started.text
                if not refused or time.monotonic() > preflight_deadline:
                    break
                time.sleep(1.0)
            assert started.status_code == 201, started.text
            drill_id = started.json()["drill_id"]
            wait_for_affinity(client, cids)  # replayed on the survivors during the hold
            # the next turns arrive while the fault lasts: live TTFT during, and warm prefixes
            usages = [live_turn(client, cid) for cid in cids]
            assert all(u["prompt_tokens_details"]["cached_tokens"] > 0 for u in usages), usages
            deadline = time.monotonic() + HOLD_S + REPLAY_WAIT_S
            while True:
                r = client.get(f"/v1/drills/{drill_id}/report", headers=operator)
                # 503: the control shard, which answers drill reads, moves with the victim
                assert r.status_code in (200, 503), r.text
                if r.status_code == 200 and r.json()["phase"] in ("done", "aborted", "failed"):
                    break
                assert time.monotonic() < deadline, r.json()
                time.sleep(0.5)
        body = r.json()
        for key in ("replay", "cache_recovery", "live_ttft"):
            print(f"{key}: {body[key]}")
        assert body["verdict"] == "passed", body["verdict_reason"]
        replay = body["replay"]
        assert replay["conversations_replayed"] >= len(cids), replay
        assert replay["tokens_replayed"] > 0 and 0 < replay["makespan_s"] <= HOLD_S, replay
        assert replay["planner_bound_s"] > 0  # the drill's own preflight (spare moves)
        assert replay["planner_tokens_per_s"] > 0 and replay["tokens_per_s"] > 0, replay
        # the cache came back: every moved conversation warm well within the hold
        recovery = body["cache_recovery"]
        moved = recovery["moved_conversations"]
        assert moved >= len(cids) and recovery["warm_conversations"] == moved, recovery
        assert recovery["curve"][-1]["warm_share"] == 1.0
        assert 0 < recovery["time_to_target_share_s"] <= HOLD_S, recovery
        target = recovery["target"]
        assert target["passed"] in (True, False), target  # judged: the fault outlasted it
        assert target["passed"] == (target["time_to_share_s"] <= target["limit_s"]), target
        # live TTFT on both survivors, from their engines' histograms, replays taken off
        ttft = body["live_ttft"]
        assert sorted(ttft) == ["eu-west", "us-east"], ttft
        for region, windows in ttft.items():
            before = windows["before"]
            assert before["requests"] >= LIVE_BEFORE, (region, windows)  # + self-check probes
            assert 0 < before["p50_s"] <= before["p99_s"] < 5.0, (region, windows)
        during = [w["during"] for w in ttft.values()]
        # every next turn, and no replay, counted during the fault
        assert sum(w["requests"] for w in during) == len(cids), ttft
        assert all(0 < w["p50_s"] < 5.0 for w in during if w["requests"]), ttft
        assert all(w["prefix_hit_ratio"] > 0.5 for w in during if w["requests"]), ttft
        html = report_page(plane.urls["us-east"], drill_id, operator)
        assert "Cache recovery" in html and "Live time to first token per survivor" in html
    finally:
        output = stop_plane(proc)
    assert proc.returncode == 0, output
