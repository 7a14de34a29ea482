"""KV replay after a region fails, end to end and without a GPU: ``convplane up --sim-engines 1``
(3 regions, SQLite, one simulated inference engine per region: real HTTP, vLLM-shaped API,
simulated prefill and prefix cache), conversations homed in ap-south, ap-south's node killed.

The survivors take its shards (automatic failover: ``services.controller``), their replay
services list the moved conversations, their in-process workers prefill them on the survivors'
simulated engines, and ``/affinity`` names the warm engine. Sending that engine the chat prompt
the live path would send then finds most of it in the prefix cache.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from replay.worker import TranscriptEvent, cache_salt_for, render_messages
from tests.e2e.plane import start_plane, stop_plane

READY_WAIT_S = 120.0
REPLAY_WAIT_S = 90.0
CONVERSATIONS = 4
VICTIM = "ap-south"


def message(cid: str, turn: int, words: int = 250) -> str:
    return " ".join(f"{cid}:{turn}:{i}" for i in range(words))


def write_conversation(client: httpx.Client, cid: str) -> None:
    r = client.post("/v1/conversations", json={"conversation_id": cid})
    assert r.status_code == 201, r.text
    assert r.headers["x-convplane-served-by"] == VICTIM
    turns = [("message.system", "You are terse."), ("message.user", message(cid, 1)),
             ("message.assistant", message(cid, 2)), ("message.user", message(cid, 3))]  # fmt: skip
    for event_type, text in turns:
        r = client.post(f"/v1/conversations/{cid}/events",
                        json={"type": event_type, "payload": {"content": text}})  # fmt: skip
        assert r.status_code == 201, r.text


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


def live_prompt(client: httpx.Client, cid: str) -> list[dict[str, str]]:
    events = client.get(f"/v1/conversations/{cid}/events", params={"limit": 100}).json()
    transcript = [TranscriptEvent(e["seq"], e["type"], e["payload"]) for e in events["events"]]
    return [{"role": m.role, "content": m.content} for m in render_messages(transcript)]


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
                assert worker["prompt_tokens"] > 700  # ~760 words + chat framing
            replayed = 0
            for region in ("us-east", "eu-west"):
                status = httpx.get(plane.urls[region] + "/v1/replays",
                                   headers=plane.headers, timeout=10.0).json()  # fmt: skip
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
            reply = httpx.post(
                worker["engine_url"] + "/v1/chat/completions",
                json={"model": worker["model_revision"], "messages": live_prompt(client, cid),
                      "max_tokens": 1, "cache_salt": cache_salt_for(plane.info["tenant_id"])},
                timeout=30.0,
            )  # fmt: skip
            assert reply.status_code == 200, reply.text
            usage = reply.json()["usage"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert cached >= 0.9 * usage["prompt_tokens"], usage
            print(f"replayed {replayed} conversations; live prompt {usage['prompt_tokens']} "
                  f"tokens, {cached} cached on {worker['engine_id']}")  # fmt: skip
    finally:
        output = stop_plane(proc)
    assert proc.returncode == 0, output
    for engine in plane.info["sim_engines"]:
        with pytest.raises(ProcessLookupError):
            os.kill(engine["pid"], 0)
