"""KV replay after a region fails, end to end on a real vLLM over a real Kafka broker.

``convplane up --engine us-east=URL --engine eu-west=URL --kafka-bootstrap-servers ...``: both
survivors get the one real vLLM (CPU build, tiny model) as their engine, each through its own
``convplane worker`` process that self-checks the engine and takes its region's replay jobs
from Kafka. Conversations homed in ap-south, agent conversations with a tool call, half of them
with a stored ``chat_template`` of their own, are written; ap-south's node is killed. The
survivors take its shards, list the moved conversations and publish their replay jobs; the
workers read each transcript from their region's API and prefill it on vLLM.

Then the chat application's next turn of each conversation, built from its own messages with
the ``cache_salt`` and ``model_revision`` that ``/route`` hands out, reports its transcript
prefix as cached (``usage.prompt_tokens_details.cached_tokens``) down to the block floor: the
tokens it shares with the replayed prompt (both tokenized by the server, ``POST /tokenize``),
in whole 32-token blocks. A stored template that replay left out would share no whole block:
the two templates differ from the first token after the BOS on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import tool_conversation as conv
from tests.e2e.plane import Plane, start_plane, stop_plane, until_answered
from tests.vllm.build_model import CHAT_TEMPLATE
from tests.vllm.servers import BLOCK_TOKENS, MODEL_REVISION, VllmServer

pytestmark = pytest.mark.kafka

VICTIM = "ap-south"
SURVIVORS = ("us-east", "eu-west")
CONVERSATIONS = 4
TURN_WORDS = 12  # the tokenizer splits the tagged words: a conversation is ~600 tokens
#: a conversation's own template: the model's, with a preamble of its own
STORED_TEMPLATE = CHAT_TEMPLATE.replace("{{ bos_token }}", "{{ bos_token }}stored template: ", 1)
READY_WAIT_S = 300.0  # the plane, and one self-check per engine on two shared cores
REPLAY_WAIT_S = 300.0  # a hang guard for failover, jobs and prefill on CPU


def settings(stored_template: bool) -> dict[str, Any]:
    return {**conv.SETTINGS, **({"chat_template": STORED_TEMPLATE} if stored_template else {})}


def write_conversation(client: httpx.Client, cid: str, stored_template: bool) -> None:
    """As an application writes: each request with its Idempotency-Key, a retryable answer
    (an outcome unknown while the server's CPU is taken by vLLM) sent again with the same key."""
    r = until_answered(client, "POST", "/v1/conversations", {"conversation_id": cid}, f"{cid}-c")
    assert r.status_code == 201, r.text
    assert r.headers["x-convplane-served-by"] == VICTIM
    bodies = conv.append_bodies(cid, TURN_WORDS)
    assert bodies[0]["type"] == "prompt.settings"
    bodies[0] = {"type": "prompt.settings", "payload": settings(stored_template)}
    for i, body in enumerate(bodies):
        r = until_answered(client, "POST", f"/v1/conversations/{cid}/events", body, f"{cid}-{i}")
        assert r.status_code == 201, r.text


def wait_for_affinity(client: httpx.Client, plane: Plane, cids: list[str]) -> dict[str, Any]:
    workers: dict[str, Any] = {}
    deadline = time.monotonic() + REPLAY_WAIT_S
    while len(workers) < len(cids):
        for cid in set(cids) - set(workers):
            r = client.get(f"/v1/conversations/{cid}/affinity")
            if r.status_code == 200 and r.json()["worker"] is not None:
                workers[cid] = {**r.json()["worker"], "region": r.json()["region"]}
        if time.monotonic() > deadline:
            pytest.fail(f"no affinity after {REPLAY_WAIT_S}s for {set(cids) - set(workers)}:\n"
                        f"{plane.log_tails()}\n{worker_logs(plane)}")  # fmt: skip
        time.sleep(0.5)
    return workers


def worker_logs(plane: Plane) -> str:
    parts = []
    for engine in plane.info["engines"]:
        text = Path(engine["worker_log"]).read_text(errors="replace")
        parts.append(f"--- worker {engine['engine_id']} ---\n{text[-3000:]}")
    return "\n".join(parts)


def prompt_fields(cid: str, stored_template: bool, *, next_turn: bool) -> dict[str, Any]:
    """The request fields that shape the prompt: the transcript as replay sends it, or the
    application's next turn (its own messages plus a new user message)."""
    messages = conv.messages(cid, TURN_WORDS)
    if next_turn:
        messages.append(conv.next_user_message(cid))
    s = settings(stored_template)
    fields = {"messages": messages, "tools": s["tools"],
              "chat_template_kwargs": s["chat_template_kwargs"]}  # fmt: skip
    if stored_template:
        fields["chat_template"] = STORED_TEMPLATE
    return fields


def server_tokens(url: str, fields: dict[str, Any]) -> list[int]:
    r = httpx.post(url + "/tokenize", json={"model": MODEL_REVISION, **fields}, timeout=30.0)
    assert r.status_code == 200, r.text
    tokens: list[int] = r.json()["tokens"]
    return tokens


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def start_engine_plane(
    engine_url: str, kafka_bootstrap_servers: str, state_dir: Path
) -> tuple[subprocess.Popen[bytes], Plane]:
    """``convplane up`` with the one real vLLM as both survivors' engine, jobs over Kafka."""
    engine_args = [a for region in SURVIVORS for a in ("--engine", f"{region}={engine_url}")]
    return start_plane(state_dir, *engine_args, "--kafka-bootstrap-servers",
                       kafka_bootstrap_servers, ready_wait_s=READY_WAIT_S)  # fmt: skip


def test_moved_conversations_are_replayed_on_real_vllm_and_the_next_turn_hits_its_cache(
    well_configured: VllmServer, kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    url = well_configured.url
    proc, plane = start_engine_plane(url, kafka_bootstrap_servers, tmp_path / "plane")
    try:
        engines = plane.info["engines"]
        assert {e["region"] for e in engines} == set(SURVIVORS)
        for e in engines:
            assert e["model_revision"] == MODEL_REVISION and e["worker"] == "kafka", e
            assert e["checks"]["accepts_tools"] == "passed", e
            assert e["checks"]["accepts_chat_template"] == "passed", e
            os.kill(e["worker_pid"], 0)  # its worker runs
        cids = [plane.conversation_led_by(VICTIM, f"real{i}") for i in range(CONVERSATIONS)]
        stored = {cid: i % 2 == 1 for i, cid in enumerate(cids)}
        with plane.client("us-east") as client:
            for cid in cids:
                write_conversation(client, cid, stored[cid])
            victim = next(r for r in plane.info["regions"] if r["name"] == VICTIM)
            os.kill(victim["node_pid"], signal.SIGKILL)
            workers = wait_for_affinity(client, plane, cids)

            for cid in cids:
                worker = workers[cid]
                assert worker["region"] in SURVIVORS, worker
                assert worker["engine_id"] in {e["engine_id"] for e in engines}, worker
                replayed = server_tokens(url, prompt_fields(cid, stored[cid], next_turn=False))
                if stored[cid]:  # the model's own template renders it otherwise from the start
                    fields = prompt_fields(cid, False, next_turn=False)
                    assert shared_prefix(server_tokens(url, fields), replayed) < BLOCK_TOKENS
                assert worker["prompt_tokens"] == len(replayed), (worker, len(replayed))
                route = client.get(f"/v1/conversations/{cid}/route")
                assert route.status_code == 200, route.text
                assert route.json()["worker"]["engine_url"] == url
                assert route.json()["model_revision"] == MODEL_REVISION
                live = prompt_fields(cid, stored[cid], next_turn=True)
                reply = httpx.post(url + "/v1/chat/completions", json={
                    "model": MODEL_REVISION, **live, "max_completion_tokens": 1,
                    "cache_salt": route.json()["cache_salt"],
                }, timeout=120.0)  # fmt: skip
                assert reply.status_code == 200, reply.text
                usage = reply.json()["usage"]
                shared = shared_prefix(replayed, server_tokens(url, live))
                assert shared > len(replayed) // 2, (shared, len(replayed))  # the whole history
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                assert cached == shared // BLOCK_TOKENS * BLOCK_TOKENS, (cid, shared, usage)
                print(f"{cid} (stored template: {stored[cid]}): replayed {len(replayed)} "
                      f"tokens on {worker['engine_id']}; next turn {usage['prompt_tokens']} "
                      f"tokens, {cached} cached (shared prefix {shared})")  # fmt: skip
    finally:
        output = stop_plane(proc)
    assert proc.returncode == 0, output
    for e in plane.info["engines"]:
        with pytest.raises(ProcessLookupError):
            os.kill(e["worker_pid"], 0)  # the plane stopped its workers
