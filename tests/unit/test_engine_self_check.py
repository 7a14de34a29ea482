"""The worker's engine self-check against the simulated engine's vLLM-shaped HTTP face (ASGI,
no network). Each server flag replay depends on is a named check; the simulator refuses what
vLLM 0.32 refuses (tools under "auto" without auto tool choice, an untrusted request template,
a prompt over max_model_len) and, like vLLM, takes a priority under FCFS and ignores it, so
priority scheduling is checked by behaviour: a live-priority prompt joining a queue of
replay-priority ones. A worker whose engine fails takes no job and says why."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from eventlog.clock import LoopClock
from replay.bus import InProcessJobBus
from replay.chat import ChatPrompt
from replay.engines.base import ModelRevisionMismatch
from replay.engines.sim_core import SimEngineConfig
from replay.engines.sim_server import create_app
from replay.engines.simulated import SimulatedEngine
from replay.engines.vllm_http import VllmHttpEngine
from replay.model import PrefillRequest
from replay.worker import ReplayWorker, WorkerConfig
from tests import tool_conversation
from tests.unit.fakes_replay import FakeGate, FakeTranscripts

MODEL = "llama@r1"
#: a step of 2,048 tokens takes 20 ms: the priority probe's queue drains in distinct steps, far
#: slower than requests go through the HTTP face
STEPPED: dict[str, Any] = {"prefill_tokens_per_s": 100_000.0, "chunk_tokens": 2048}
#: every probe in one step: the priority probe cannot tell
ONE_STEP: dict[str, Any] = {"chunk_tokens": 1_000_000, "max_num_seqs": 1024}


@asynccontextmanager
async def engine_over_http(revision: str = MODEL, **settings: Any) -> AsyncIterator[VllmHttpEngine]:
    config = SimEngineConfig(**{**STEPPED, "cache_tokens": 100_000, **settings})
    simulated = SimulatedEngine("sim-0", MODEL, config, LoopClock())
    app = create_app(simulated)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client,
    ):
        yield VllmHttpEngine("sim-0", "http://sim", revision, client=client)


async def test_a_properly_started_engine_passes_every_check_priority_included() -> None:
    async with engine_over_http() as engine:
        fitness = await engine.self_check(replay_priority=100)
    assert fitness.fit
    assert set(fitness.verdicts().values()) == {"passed"}, fitness.reasons()
    assert fitness.reasons() == {}


async def test_an_fcfs_engine_fails_the_priority_probe_even_when_declared() -> None:
    """vLLM takes a priority under FCFS with a 200 and ignores it: the live-priority probe is
    answered with the last of the replay-priority ones queued before it."""
    async with engine_over_http(scheduling_policy="fcfs") as engine:
        fitness = await engine.self_check(replay_priority=100)
        declared = await engine.self_check(replay_priority=100, priority_declared=True)
        request = PrefillRequest(MODEL, ChatPrompt(({"role": "user", "content": "hi"},)), "s",
                                 100, "r1")  # fmt: skip
        assert (await engine.prefill(request)).prompt_tokens > 0  # a 200, as vLLM 0.32 answers
    for result in (fitness, declared):
        assert not result.fit
        assert [p.code for p in result.problems] == ["priority_scheduling"]
        reason = result.reasons()["priority_scheduling"]
        assert "first-come-first-served" in reason and "--scheduling-policy priority" in reason


async def test_an_engine_that_runs_the_whole_queue_in_one_step_leaves_priority_to_a_declaration() -> (
    None
):
    async with engine_over_http(**ONE_STEP) as engine:
        fitness = await engine.self_check(replay_priority=100)
        declared = await engine.self_check(replay_priority=100, priority_declared=True)
    assert fitness.fit
    assert {n: v for n, v in fitness.verdicts().items() if v != "passed"} == {
        "priority_scheduling": "unverified"
    }
    assert "--declare-priority-scheduling" in fitness.reasons()["priority_scheduling"]
    assert declared.fit and set(declared.verdicts().values()) == {"passed"}


@pytest.mark.parametrize(
    ("settings", "failed"),
    [
        ({"prompt_tokens_details": False}, "reports_cached_tokens"),
        ({"cache_tokens": 0}, "caches_prefixes"),
        ({"revision": "llama@r2"}, "serves_revision"),
        ({"trust_request_chat_template": False}, "accepts_chat_template"),
        ({"log_stats": False}, "exports_metrics"),
        ({"exclude_tools_when_tool_choice_none": True}, "accepts_tools"),
    ],
)
async def test_each_missing_flag_is_named(settings: dict[str, Any], failed: str) -> None:
    async with engine_over_http(**settings) as engine:
        fitness = await engine.self_check(replay_priority=100)
    assert not fitness.fit
    assert [p.code for p in fitness.problems] == [failed]
    assert fitness.problems[0].message


async def test_an_engine_without_auto_tool_choice_is_fit_and_takes_replays_tool_requests() -> None:
    """vLLM refuses ``tools`` under the default tool_choice ("auto") unless started with
    --enable-auto-tool-choice; replay sends "none", which every server takes."""
    async with engine_over_http(enable_auto_tool_choice=False) as engine:
        fitness = await engine.self_check(replay_priority=100)
        assert fitness.fit and fitness.verdict("accepts_tools") == "passed"
        prompt = ChatPrompt.of_messages(tool_conversation.messages("a"), tools=tuple(
            tool_conversation.TOOLS))  # fmt: skip
        outcome = await engine.prefill(PrefillRequest(MODEL, prompt, "salt", 100, "r1"))
        assert outcome.prompt_tokens > 0
        body = {"model": MODEL, **prompt.request_fields(), "max_completion_tokens": 1}
        refused = await engine._client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400
    assert "--enable-auto-tool-choice" in refused.json()["error"]["message"]


async def test_the_probe_is_sized_to_the_engines_max_model_len() -> None:
    async with engine_over_http(max_model_len=300) as engine:
        fitness = await engine.self_check(replay_priority=100)
    assert fitness.fit, fitness


async def test_an_unreachable_engine_fails_and_leaves_the_rest_unverified() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse), base_url="http://x") as c:
        engine = VllmHttpEngine("x", "http://x", MODEL, client=c)
        fitness = await engine.self_check(replay_priority=100)
    assert not fitness.fit
    checks = fitness.verdicts()
    assert checks["serves_revision"] == "failed"
    assert {v for n, v in checks.items() if n != "serves_revision"} == {"unverified"}


async def test_a_worker_on_an_unfit_engine_takes_no_job_and_says_why() -> None:
    async with (
        engine_over_http(trust_request_chat_template=False) as engine,
        InProcessJobBus(jobs_max_per_region=10) as bus,
    ):
        settings = WorkerConfig(recheck_s=0.01, idle_poll_s=0.01)
        worker = ReplayWorker(
            "w1", "eu", bus, engine, FakeTranscripts(), FakeGate(), LoopClock(),
            random.Random(1), settings, cache_salt_key=bytes(32),
        )  # fmt: skip
        task = asyncio.create_task(worker.run())
        for _ in range(1000):  # bounded: the test fails, never hangs, if the check never fails
            if worker.counts["engine_check_failed"] >= 2:
                break
            await asyncio.sleep(0.01)
        assert worker.counts["engine_check_failed"] >= 2
        assert worker.consumer is None  # never joined the group
        assert worker.engine_problems is not None
        assert [p.code for p in worker.engine_problems] == ["accepts_chat_template"]
        worker.request_stop()
        await asyncio.wait_for(task, 5.0)


class _PauseLog(LoopClock):
    """Loop time, with every sleep recorded and cut to a millisecond."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await asyncio.sleep(0.001)


async def _pauses_between_checks(engine: VllmHttpEngine) -> list[float]:
    """The pauses a worker takes between 6 failing self-checks of ``engine``."""
    clock = _PauseLog()
    async with InProcessJobBus(jobs_max_per_region=10) as bus:
        engine_checks = 0
        check = engine.self_check

        async def counted(replay_priority: int, *, priority_declared: bool = False) -> Any:
            nonlocal engine_checks
            engine_checks += 1
            if engine_checks >= 6:
                worker.request_stop()
            return await check(replay_priority, priority_declared=priority_declared)

        engine.self_check = counted  # type: ignore[method-assign]
        settings = WorkerConfig(recheck_s=1.0, recheck_max_s=5.0)
        worker = ReplayWorker(
            "w1", "eu", bus, engine, FakeTranscripts(), FakeGate(), clock,
            random.Random(1), settings, cache_salt_key=bytes(32),
        )  # fmt: skip
        assert not await asyncio.wait_for(worker.engine_fit(), 30.0)
    return clock.pauses[:5]


async def test_an_unfit_engine_is_checked_again_less_often_each_time() -> None:
    """The probes (the priority probe's queue above all) put work on the engine, ahead of
    live requests on an FCFS one: rechecks of an engine they reached back off, doubling, up
    to ``recheck_max_s``."""
    async with engine_over_http(trust_request_chat_template=False, **ONE_STEP) as engine:
        assert await _pauses_between_checks(engine) == [1.0, 2.0, 4.0, 5.0, 5.0]


async def test_an_unreachable_engine_is_checked_again_at_the_same_pace() -> None:
    """Nothing reached it (still starting, say): no backoff, so a worker started before its
    engine joins soon after the engine is up."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse), base_url="http://x") as c:
        engine = VllmHttpEngine("x", "http://x", MODEL, client=c)
        assert await _pauses_between_checks(engine) == [1.0] * 5


async def test_a_refused_queue_prompt_leaves_priority_unverified_not_failed() -> None:
    """A gateway's size or rate limit says nothing of the scheduling policy: only a refused
    ``priority`` fails the check."""
    config = SimEngineConfig(**{**STEPPED, "cache_tokens": 100_000})
    app = create_app(SimulatedEngine("sim-0", MODEL, config, LoopClock()))
    asgi = httpx.ASGITransport(app=app)

    async def gateway(request: httpx.Request) -> httpx.Response:
        if b"-queue-" in request.content:  # the priority probe's queued prompts
            return httpx.Response(413, json={"error": {"message": "request too large"}})
        return await asgi.handle_async_request(request)

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.MockTransport(gateway), base_url="http://sim") as c,
    ):
        fitness = await VllmHttpEngine("sim-0", "http://sim", MODEL, client=c).self_check(100)
    assert fitness.fit, fitness.reasons()
    assert fitness.verdict("priority_scheduling") == "unverified"
    assert "request too large" in fitness.reasons()["priority_scheduling"]


@pytest.mark.parametrize(("declared", "verified"), [(False, False), (True, True)])
async def test_a_worker_tells_its_gate_whether_priority_is_verified(
    declared: bool, verified: bool
) -> None:
    async with (
        engine_over_http(**ONE_STEP) as engine,
        InProcessJobBus(jobs_max_per_region=10) as bus,
    ):
        gate = FakeGate()
        settings = WorkerConfig(idle_poll_s=0.01, priority_declared=declared)
        worker = ReplayWorker(
            "w1", "eu", bus, engine, FakeTranscripts(), gate, LoopClock(),
            random.Random(1), settings, cache_salt_key=bytes(32),
        )  # fmt: skip
        assert await worker.engine_fit()
    assert gate.priority_verified is verified
    assert worker.engine_problems == []


async def test_the_simulator_refuses_an_untrusted_template_and_an_empty_salt_like_vllm() -> None:
    async with engine_over_http(trust_request_chat_template=False) as engine:
        client = engine._client  # the ASGI client the adapter was given
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "cache_salt": ""}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
        templated = await client.post("/v1/chat/completions", json={
            **body, "cache_salt": "s", "chat_template": "{{ messages[0].content }}"})  # fmt: skip
        assert templated.status_code == 400
        assert "--trust-request-chat-template" in templated.json()["error"]["message"]
        unknown = await client.post("/v1/chat/completions", json={**body, "model": "x@1",
                                                                   "cache_salt": "s"})  # fmt: skip
        assert unknown.status_code == 404
        card = (await client.get("/v1/models")).json()["data"][0]
        assert card["id"] == MODEL and card["object"] == "model" and "max_model_len" in card


async def test_a_404_from_the_server_is_a_model_revision_mismatch() -> None:
    """The adapter is configured for a revision the server does not serve: vLLM answers 404."""
    async with engine_over_http(revision="llama@r2") as engine:
        request = PrefillRequest("llama@r2", ChatPrompt(({"role": "user", "content": "hi"},)),
                                 "salt", 100, "r1")  # fmt: skip
        with pytest.raises(ModelRevisionMismatch):
            await engine.prefill(request)
