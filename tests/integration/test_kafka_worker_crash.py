"""A ``convplane worker`` process SIGKILLed mid-job, on a real broker with real processes.

Two ``convplane worker`` processes form one consumer group on a one-partition jobs topic; each
serves its own ``convplane sim-engine serve`` process (a simulator over HTTP, slow prefill, so a
job is mid-flight for seconds). Transcripts come from a small fake region API served by the test
(``TranscriptApi``), which can hold a conversation's transcript until the test releases it: that
is how the test orders the holder's two jobs without timing guesses.

The story: the partition's owner (the *holder*) pulls J0 (long) and J1 (short); J0 waits at the
transcript API while J1 finishes, so the committed offset must stay before J0. J0 is released,
reaches the holder's engine (its ``/metrics`` shows it running), and the holder is SIGKILLed.
After the group's session timeout the other worker owns the partition, gets J0 and J1 again
(nothing was committed past J0), replays them, and only then is the offset committed.

Needs the session broker (``kafka_bootstrap_servers``): fails loudly without one, never skips.
Every wait is on an outcome, with a generous give-up limit; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from replay.bus.kafka import KafkaBusConfig, KafkaJobBus
from replay.bus.port import worker_group
from replay.model import ReplayJob
from tests.integration.bus_regions import BUS_SECRET
from tests.integration.kafka_replay import (
    GIVE_UP_S,
    MODEL,
    TENANT,
    Child,
    SimEngineProc,
    children,
    committed_offset,
    result_log,
    spawn,
    start_sim_engine,
    until,
)

pytestmark = pytest.mark.kafka


SESSION_TIMEOUT_S = 6.0  # the broker's minimum: the crash is noticed as soon as Kafka allows
ENGINE_TOKENS_PER_S = 200.0  # slow on purpose: a 1,200-token prefill runs for ~6 s
ENGINE_CHUNK_TOKENS = 64
# The workers' spare gate believes in a fast engine: this test is about the group, not about
# pacing (at 200 tokens/s, J0's grant would leave J1 waiting for capacity behind it).
GATE_TOKENS_PER_S = 20_000.0
#: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: a fresh broker's
#: coordinator answering in the response instead of raising
COORDINATOR_NOT_READY = (14, 15, 16)


# --- processes ----------------------------------------------------------------------------


def spawn_worker(
    name: str, region: str, engine_url: str, bootstrap_servers: str, api_url: str, log_dir: Path
) -> Child:
    """``convplane worker`` with two slots and the shortest session timeout the broker allows."""
    return spawn(name, ["worker", "--region", region, "--engine-url", engine_url,
                        "--bootstrap-servers", bootstrap_servers, "--region-url", api_url,
                        "--api-key", "test-key", "--model-revision", MODEL, "--worker-id", name,
                        "--capacity-tokens-per-s", str(GATE_TOKENS_PER_S), "--concurrency", "2",
                        "--session-timeout-s", str(SESSION_TIMEOUT_S),
                        "--bus-secret", BUS_SECRET.hex(), "--cache-salt-key", "0" * 64],
                 log_dir)  # fmt: skip


# --- the region API's transcript endpoint, faked -------------------------------------------


class TranscriptApi:
    """``GET /v1/conversations/{id}/events`` as ``HttpTranscriptSource`` reads it, served by
    uvicorn in the test's loop. A conversation in ``held`` is answered only once its event is
    set; ``asked`` counts requests per conversation."""

    def __init__(self, transcripts: dict[str, list[dict[str, Any]]]) -> None:
        self.transcripts = transcripts
        self.held: dict[str, asyncio.Event] = {}
        self.asked: dict[str, int] = {}
        self.url = ""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/conversations/{conversation_id}/events")
        async def events(conversation_id: str, after_seq: int = 0) -> JSONResponse:
            self.asked[conversation_id] = self.asked.get(conversation_id, 0) + 1
            gate = self.held.get(conversation_id)
            if gate is not None:
                await gate.wait()
            found = self.transcripts.get(conversation_id)
            if found is None:
                return JSONResponse({"error": {"code": "not_found"}}, status_code=404)
            return JSONResponse({"events": [e for e in found if e["seq"] > after_seq]})

        return app

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[TranscriptApi]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            await until("the transcript API is up", lambda: server.started)
            yield self
        finally:
            for gate in self.held.values():
                gate.set()  # a held request must not block the shutdown
            server.should_exit = True
            await asyncio.wait_for(task, 30)
            sock.close()


def transcript(cid: str, words: int) -> list[dict[str, Any]]:
    text = " ".join(f"{cid}-w{i}" for i in range(words))
    return [
        {"seq": 1, "type": "message.system", "payload": {"content": "You are terse."}},
        {"seq": 2, "type": "message.user", "payload": {"content": text}},
    ]


# --- Kafka helpers -------------------------------------------------------------------------


async def group_state(settings: KafkaBusConfig, group: str) -> tuple[str, int]:
    """(state, member count) of a consumer group, as the broker's coordinator sees it;
    ("unknown", 0) while the coordinator is not available yet (a fresh broker's first group)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
    except KafkaError as exc:
        if not exc.retriable:
            raise
        return "unknown", 0
    finally:
        await admin.close()
    [described] = response.groups
    error_code, _group_id, state, _protocol_type, _protocol, members = described[:6]
    if error_code in COORDINATOR_NOT_READY:
        return "unknown", 0
    assert error_code == 0, described
    return str(state), len(members)


def make_job(region: str, name: str, cid: str, tokens: int, ttl_ms: int = 600_000) -> ReplayJob:
    now_ms = time.time_ns() // 1_000_000
    return ReplayJob(f"{region}-{name}", region, TENANT, cid, MODEL, tokens, now_ms,
                     now_ms + ttl_ms, 2)  # fmt: skip


# --- the test ------------------------------------------------------------------------------


async def test_a_sigkilled_worker_leaves_its_job_to_the_group_and_nothing_is_committed_past_it(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    region = f"x{uuid.uuid4().hex[:10]}"  # fresh topic and group: no earlier run's jobs
    settings = KafkaBusConfig(kafka_bootstrap_servers, bus_secrets={region: BUS_SECRET},
                                client_id=f"test-{region}",
                                partitions_per_topic=1)  # fmt: skip
    long_cid, short_cid = f"{region}-long", f"{region}-short"
    api = TranscriptApi(
        {long_cid: transcript(long_cid, 1200), short_cid: transcript(short_cid, 30)}
    )
    api.held[long_cid] = asyncio.Event()
    async with (
        KafkaJobBus(settings, regions=[region]) as bus,  # creates the one-partition topic
        api.serving(),
        children() as started,
        httpx.AsyncClient() as http,
        result_log(bus, region) as results,
    ):
        engines: dict[str, SimEngineProc] = {}
        workers: dict[str, Child] = {}
        for name in ("wa", "wb"):
            engines[name] = await start_sim_engine(
                f"{name}-engine", started, tmp_path,
                prefill_tokens_per_s=ENGINE_TOKENS_PER_S, chunk_tokens=ENGINE_CHUNK_TOKENS,
            )  # fmt: skip
            workers[name] = spawn_worker(
                name, region, engines[name].url, kafka_bootstrap_servers, api.url, tmp_path
            )
            started.append(workers[name])
        everyone = list(started)

        async def group_stable() -> bool:
            return await group_state(settings, worker_group(region)) == ("Stable", 2)

        await until("both workers joined one stable group", group_stable, everyone)
        # each worker's engine self-check (its probe requests: replay.engines.vllm_check) ran
        # before it joined: each engine's count of them is the baseline of what follows (the
        # priority probe runs as many rounds as its timing needs, so the two may differ)
        probes = {n: (await engines[n].metrics(http)).generation_tokens_total for n in workers}
        assert min(probes.values()) > 0, probes

        # J0 (offset 0) is held at the transcript API; J1 (offset 1) finishes first.
        j0 = make_job(region, "j0", long_cid, 1200)
        j1 = make_job(region, "j1", short_cid, 40)
        await bus.publish_jobs([j0, j1])
        [first] = await until("J1's result", lambda: results.of(j1.job_id), everyone)
        holder = first.worker_id
        [other] = [name for name in workers if name != holder]
        await until("the holder asks for J0's transcript", lambda: api.asked.get(long_cid))
        assert await committed_offset(settings, region) is None, "committed past running J0"

        api.held[long_cid].set()

        async def j0_running_at_holder() -> bool:
            return (await engines[holder].metrics(http)).num_requests_running >= 1

        await until("J0 mid-prefill on the holder's engine", j0_running_at_holder, everyone)
        workers[holder].process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(workers[holder].process.wait, GIVE_UP_S)
        assert workers[holder].process.returncode == -signal.SIGKILL
        assert await committed_offset(settings, region) is None
        assert (await engines[other].metrics(http)).generation_tokens_total == probes[other]

        survivors = [c for c in everyone if c is not workers[holder]]
        [redone] = await until(
            "J0 finished by the other worker", lambda: results.of(j0.job_id, other), survivors
        )
        assert (redone.status, redone.engine_id) == ("replayed", other)  # the CLI names it so
        assert redone.prompt_tokens > 1200

        async def committed_to_the_end() -> bool:
            return await committed_offset(settings, region) == 2

        await until("the offset committed past J0 and J1", committed_to_the_end, survivors)
        # nothing was committed past J0, so the other worker got J1 again (at-least-once)
        await until("J1 redelivered", lambda: results.of(j1.job_id, other), survivors)
        assert results.of(j0.job_id, holder) == [], "a killed worker published J0's result"
        assert {r.status for r in results.results} == {"replayed"}
        other_engine = await engines[other].metrics(http)
        assert other_engine.generation_tokens_total == probes[other] + 2  # J0 and J1, once each
