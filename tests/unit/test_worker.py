"""The replay worker against the in-process bus, a fake engine, gate and transcript source."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
from collections.abc import AsyncIterator

import httpx
import pytest

from eventlog.aio import cancel_quietly
from eventlog.clock import LoopClock
from eventlog.errors import DeadlineExceeded, NotFound
from replay.bus import InProcessJobBus
from replay.cache_salt import cache_salt_for
from replay.chat import render_prompt
from replay.engines.base import EngineRejectedRequest, EngineUnavailable
from replay.model import ReplayJob, ReplayResult
from replay.transcripts import TranscriptEvent, TranscriptUnavailable
from replay.transcripts_http import HttpTranscriptSource
from replay.worker import ReplayWorker, WorkerConfig
from services.api.schemas import Event, EventPage
from tests.unit.fakes_replay import FakeEngine, FakeGate, FakeTranscripts

REGION = "eu"
SALT_KEY = bytes(range(32))
FAST = WorkerConfig(
    concurrency=2,
    idle_poll_s=0.01,
    backoff_base_s=0.001,
    backoff_max_s=0.002,
    reroute_pause_s=0.0,
    drain_timeout_s=5.0,
)


def make_job(
    n: int,
    *,
    clock: LoopClock,
    revision: str = "rev-a",
    ttl_ms: int = 60_000,
    conversation_id: str | None = None,
) -> ReplayJob:
    return ReplayJob(
        job_id=f"j{n}",
        region=REGION,
        tenant_id="t1",
        conversation_id=conversation_id or f"c{n}",
        model_revision=revision,
        estimated_prompt_tokens=100,
        last_activity_ms=0,
        deadline_ms=clock.wall_ms() + ttl_ms,
        through_seq=3,
    )


@pytest.fixture
async def bus() -> AsyncIterator[InProcessJobBus]:
    async with InProcessJobBus(jobs_max_per_region=100) as b:
        yield b


def make_worker(
    bus: InProcessJobBus,
    engine: FakeEngine,
    gate: FakeGate | None = None,
    name: str = "w1",
    settings: WorkerConfig = FAST,
) -> ReplayWorker:
    return ReplayWorker(
        name,
        REGION,
        bus,
        engine,
        FakeTranscripts(),
        gate or FakeGate(),
        LoopClock(),
        random.Random(7),
        settings,
        cache_salt_key=SALT_KEY,
    )


async def collect(bus: InProcessJobBus, count: int) -> list[ReplayResult]:
    stream = bus.result_stream()
    results: list[ReplayResult] = []
    while len(results) < count:
        result = await stream.next_result(timeout_s=5.0)
        assert result is not None, f"only {len(results)} of {count} results arrived"
        results.append(result)
    return results


async def test_replays_a_job_with_the_live_prompt_low_priority_and_tenant_salt(
    bus: InProcessJobBus,
) -> None:
    engine, clock = FakeEngine(), LoopClock()
    worker = make_worker(bus, engine)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    [result] = await collect(bus, 1)
    worker.request_stop()
    await task

    assert result.status == "replayed" and result.worker_id == "w1" and result.engine_id == "e1"
    assert result.prompt_tokens == len("be brief") + len("hello from c1") + len("hi")
    # the engine request it made, as the engine counts it (a drill takes replay's off)
    assert len(result.request_ms) == 1 and result.queried_tokens == result.prompt_tokens
    [request] = engine.requests
    assert request.model == "rev-a"
    assert [m["role"] for m in request.prompt.messages] == ["system", "user", "assistant"]
    assert request.cache_salt == cache_salt_for(SALT_KEY, "t1")
    assert request.priority == FAST.replay_priority
    assert bus.pending_count(REGION) == 0


async def test_expired_job_is_dropped_with_an_expired_result(bus: InProcessJobBus) -> None:
    engine, clock = FakeEngine(), LoopClock()
    worker = make_worker(bus, engine)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock, ttl_ms=-1)])
    [result] = await collect(bus, 1)
    worker.request_stop()
    await task
    assert result.status == "expired"
    assert engine.requests == []


async def test_wrong_model_job_is_handed_on_to_a_worker_that_serves_it(
    bus: InProcessJobBus,
) -> None:
    clock = LoopClock()
    wrong, right = FakeEngine("e-old", "rev-old"), FakeEngine("e-new", "rev-a")
    wrong_worker = make_worker(bus, wrong, name="w-old")
    wrong_task = asyncio.create_task(wrong_worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    first = await collect(bus, 1)
    assert [r.status for r in first] == ["wrong_model"]
    assert bus.pending_count(REGION) <= 1  # the job is back on the bus, not lost
    wrong_worker.request_stop()
    await wrong_task
    assert bus.pending_count(REGION) == 1

    bounced = wrong_worker.counts["wrong_model"]  # it may have bounced the copy a few times

    right_worker = make_worker(bus, right, name="w-new")
    right_task = asyncio.create_task(right_worker.run())
    results = await collect(bus, bounced)  # the rest of the bounces, then the replay
    right_worker.request_stop()
    await right_task
    assert {(r.status, r.worker_id) for r in results[:-1]} <= {("wrong_model", "w-old")}
    assert (results[-1].status, results[-1].worker_id) == ("replayed", "w-new")
    assert wrong.requests == [] and len(right.requests) == 1


async def test_worker_without_spare_does_not_pull(bus: InProcessJobBus) -> None:
    engine, clock, gate = FakeEngine(), LoopClock(), FakeGate(spare=False)
    worker = make_worker(bus, engine, gate)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    await gate.asked_often.wait()  # the worker asked many times and was told no
    assert worker.counts["pulled"] == 0 and bus.pending_count(REGION) == 1

    gate.open.set()
    [result] = await collect(bus, 1)
    worker.request_stop()
    await task
    assert result.status == "replayed"
    assert FAST.pull_probe_tokens in gate.asked
    assert gate.granted == 1 and gate.released == [result.prompt_tokens]


async def test_cancelled_worker_leaves_its_running_job_to_another(bus: InProcessJobBus) -> None:
    clock = LoopClock()
    stuck = FakeEngine("e1")
    stuck.hold = asyncio.Event()  # never set: the job is mid-prefill when the worker dies
    victim = make_worker(bus, stuck, name="victim")
    victim_task = asyncio.create_task(victim.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    await stuck.entered.wait()
    await cancel_quietly(victim_task)  # a crash: no finish, no result

    survivor = make_worker(bus, FakeEngine("e2"), name="survivor")
    survivor_task = asyncio.create_task(survivor.run())
    [result] = await collect(bus, 1)
    survivor.request_stop()
    await survivor_task
    assert result.job_id == "j1" and result.worker_id == "survivor" and result.status == "replayed"


async def test_graceful_stop_finishes_the_running_job(bus: InProcessJobBus) -> None:
    engine, clock = FakeEngine(), LoopClock()
    engine.hold = asyncio.Event()
    worker = make_worker(bus, engine)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    await engine.entered.wait()
    worker.request_stop()
    engine.hold.set()
    await task
    [result] = await collect(bus, 1)
    assert result.status == "replayed" and bus.pending_count(REGION) == 0


async def test_stop_past_the_drain_timeout_abandons_the_job_for_redelivery(
    bus: InProcessJobBus,
) -> None:
    engine, clock = FakeEngine(), LoopClock()
    engine.hold = asyncio.Event()
    settings = WorkerConfig(concurrency=1, idle_poll_s=0.01, drain_timeout_s=0.0)
    worker = make_worker(bus, engine, settings=settings)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    await engine.entered.wait()
    worker.request_stop()
    await task
    assert bus.pending_count(REGION) == 1  # back on the bus, uncommitted
    assert worker.counts["replayed"] == 0


async def test_retryable_engine_error_is_retried_and_a_rejection_fails(
    bus: InProcessJobBus,
) -> None:
    engine, clock = FakeEngine(), LoopClock()
    engine.failures = [EngineUnavailable("busy"), EngineRejectedRequest("bad prompt")]
    worker = make_worker(
        bus,
        engine,
        settings=WorkerConfig(
            concurrency=1, idle_poll_s=0.01, backoff_base_s=0.001, backoff_max_s=0.002
        ),
    )
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock), make_job(2, clock=clock)])
    results = await collect(bus, 2)
    worker.request_stop()
    await task
    assert [r.status for r in results] == ["failed", "replayed"]
    assert len(engine.requests) == 3


async def test_retry_budget_is_bounded(bus: InProcessJobBus) -> None:
    engine, clock = FakeEngine(), LoopClock()
    engine.failures = [EngineUnavailable("down")] * 10
    worker = make_worker(
        bus,
        engine,
        settings=WorkerConfig(
            concurrency=1,
            idle_poll_s=0.01,
            attempts_max=3,
            backoff_base_s=0.001,
            backoff_max_s=0.002,
        ),
    )
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    [result] = await collect(bus, 1)
    worker.request_stop()
    await task
    assert result.status == "failed" and len(engine.requests) == 3


async def test_missing_transcript_fails_the_job_without_prefill(bus: InProcessJobBus) -> None:
    engine, clock = FakeEngine(), LoopClock()
    worker = make_worker(bus, engine)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock, conversation_id="missing")])
    [result] = await collect(bus, 1)
    worker.request_stop()
    await task
    assert result.status == "failed" and engine.requests == []


def test_render_sends_messages_as_stored_and_omits_bookkeeping_events() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    events = [
        TranscriptEvent(1, "prompt.settings", {"tools": tools, "chat_template_kwargs": {"x": 1}}),
        TranscriptEvent(2, "message.system", {"content": "sys"}),
        TranscriptEvent(3, "message.user", {"role": "user", "content": parts}),
        TranscriptEvent(4, "message.assistant", {"content": None, "tool_calls": [call]}),
        TranscriptEvent(5, "tool.attempt", {"attempt_id": "call_1", "tool": "f"}),
        TranscriptEvent(6, "tool.effect", {"attempt_id": "call_1", "outcome": {}}),
        TranscriptEvent(7, "message.tool", {"tool_call_id": "call_1", "content": "42"}),
        TranscriptEvent(8, "note", {"content": "internal"}),
        TranscriptEvent(9, "message.assistant", {"content": "done"}),
    ]
    prompt = render_prompt(events)
    assert list(prompt.messages) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "assistant", "content": "done"},
    ]
    assert list(prompt.tools) == tools and prompt.chat_template_kwargs == {"x": 1}


def test_render_stops_at_the_first_message_it_cannot_send() -> None:
    events = [
        TranscriptEvent(1, "message.user", {"content": "one"}),
        TranscriptEvent(2, "message.user", {"text": "written before the chat schema"}),
        TranscriptEvent(3, "message.user", {"content": "three"}),
    ]
    assert list(render_prompt(events).messages) == [{"role": "user", "content": "one"}]


def test_cache_salt_is_keyed_per_tenant_and_256_bits() -> None:
    salt = cache_salt_for(SALT_KEY, "t1")
    assert salt != cache_salt_for(SALT_KEY, "t2")
    assert salt != cache_salt_for(bytes(32), "t1")
    assert len(bytes.fromhex(salt)) == 32
    assert salt == hmac.new(SALT_KEY, b"convplane/cache-salt/v1\x00t1", hashlib.sha256).hexdigest()


async def test_http_transcript_source_pages_through_the_region_api() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        after = int(request.url.params["after_seq"])
        limit = int(request.url.params["limit"])
        # the region API's own response model, so the worker and the API cannot drift apart
        page = EventPage(
            events=[
                Event(
                    event_id=f"e{s}",
                    seq=s,
                    type="message.user",
                    payload={"content": str(s)},
                    token_count=1,
                    created_at="2026-01-01T00:00:00Z",
                )
                for s in range(after + 1, min(after + limit, 7) + 1)
            ],
            next_after_seq=min(after + limit, 7),
        )
        return httpx.Response(200, json=page.model_dump())

    async with httpx.AsyncClient(
        base_url="http://region", transport=httpx.MockTransport(handler)
    ) as client:
        source = HttpTranscriptSource(client, "svc-key", page_limit=2)
        events = await source.fetch("t1", "c1", through_seq=5, read_grant="v1.grant")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [r.url.params["after_seq"] for r in seen] == ["0", "2", "4"]
    assert seen[0].headers["authorization"] == "Bearer svc-key"
    assert seen[0].headers["x-convplane-tenant"] == "t1"
    assert all(r.headers["x-convplane-replay-grant"] == "v1.grant" for r in seen)


@pytest.mark.parametrize(("status", "error"), [(404, NotFound), (503, TranscriptUnavailable)])
async def test_http_transcript_source_types_its_errors(status: int, error: type[Exception]) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json={}))
    async with httpx.AsyncClient(base_url="http://region", transport=transport) as client:
        with pytest.raises(error):
            await HttpTranscriptSource(client, "k").fetch("t1", "c1", through_seq=3)


class DeadlineGate(FakeGate):
    async def wait_for_spare(self, prompt_tokens: int, tenant_id: str, deadline_s: float) -> None:
        raise DeadlineExceeded("no capacity before the job's deadline")


async def test_no_capacity_before_the_deadline_expires_the_job(bus: InProcessJobBus) -> None:
    engine, clock, gate = FakeEngine(), LoopClock(), DeadlineGate()
    worker = make_worker(bus, engine, gate)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    [result] = await collect(bus, 1)
    worker.request_stop()
    await task
    assert result.status == "expired" and engine.requests == [] and gate.released == []


async def test_a_granted_replay_is_released_even_when_it_fails(bus: InProcessJobBus) -> None:
    engine, clock, gate = FakeEngine(), LoopClock(), FakeGate()
    engine.failures = [EngineRejectedRequest("bad prompt")]
    worker = make_worker(bus, engine, gate)
    task = asyncio.create_task(worker.run())
    await bus.publish_jobs([make_job(1, clock=clock)])
    [result] = await collect(bus, 1)
    worker.request_stop()
    await task
    assert result.status == "failed" and gate.granted == 1 and gate.released == [None]


async def test_http_transcript_source_escapes_the_conversation_id_in_the_path() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.raw_path.decode())
        return httpx.Response(200, json={"events": [], "next_after_seq": 0})

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(base_url="http://region", transport=transport) as client:
        await HttpTranscriptSource(client, "k").fetch("t1", "../admin/x?y", through_seq=3)
    assert paths[0].startswith("/v1/conversations/..%2Fadmin%2Fx%3Fy/events?")
