"""Replay rebuilds the prefix the live request sends, tool calls included (issue 14).

A conversation with a tool call is appended as the API validates it, replayed by the worker on
the simulated engine (its tokenizer renders the whole request: tools, template kwargs, tool
calls and results, so its block hashes are over the rendered prompt), and then the chat
application sends its next turn from *its own* message list. The live request's cached tokens
must cover the whole transcript prefix, to the engine's 16-token block granularity.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from eventlog.clock import LoopClock
from replay.bus import InProcessJobBus
from replay.cache_salt import cache_salt_for
from replay.chat import ChatPrompt
from replay.engines.sim_core import BLOCK_TOKENS, SimEngineConfig, sim_tokenize
from replay.engines.simulated import SimulatedEngine
from replay.model import PrefillRequest, ReplayJob
from replay.transcripts import TranscriptEvent, TranscriptSource
from replay.worker import ReplayWorker, WorkerConfig
from services.api.event_bodies import AnyEvent, AppendEventRequest, payload_of
from tests import tool_conversation as conv

EVENT_BODY: TypeAdapter[AnyEvent] = TypeAdapter(AppendEventRequest)

REVISION = "model@rev1"
TENANT = "t1"
SALT_KEY = bytes(range(32))


class Transcripts(TranscriptSource):
    def __init__(self, events: list[TranscriptEvent]) -> None:
        self.events = events

    async def fetch(
        self, tenant_id: str, conversation_id: str, through_seq: int, read_grant: str = ""
    ) -> list[Any]:
        return [e for e in self.events if e.seq <= through_seq]


class OpenGate:
    def has_spare(self, prompt_tokens: int) -> bool:
        return True

    async def wait_for_spare(self, prompt_tokens: int, tenant_id: str, deadline_s: float) -> None:
        return None

    def release(self, computed_tokens: int | None) -> None:
        return None

    def set_priority_verified(self, verified: bool) -> None:
        return None


def transcript(tag: str) -> list[TranscriptEvent]:
    """The events as the API stores them: every body validated by the API's request model."""
    bodies = [EVENT_BODY.validate_python(b) for b in conv.append_bodies(tag)]
    return [TranscriptEvent(seq, b.type, payload_of(b)) for seq, b in enumerate(bodies, start=1)]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def replay_then_live(
    events: list[TranscriptEvent], tag: str, piece_tokens_max: int = 0
) -> dict[str, int]:
    clock = LoopClock()
    config = SimEngineConfig(prefill_tokens_per_s=2_000_000.0, cache_tokens=1_000_000)
    engine = SimulatedEngine("sim-0", REVISION, config, clock)
    async with InProcessJobBus(jobs_max_per_region=10) as bus:
        worker = ReplayWorker(
            "w1", "eu", bus, engine, Transcripts(events), OpenGate(), clock, random.Random(1),
            WorkerConfig(piece_tokens_max=piece_tokens_max), cache_salt_key=SALT_KEY,
        )  # fmt: skip
        job = ReplayJob(
            job_id="j1", region="eu", tenant_id=TENANT, conversation_id="c1",
            model_revision=REVISION, estimated_prompt_tokens=900, last_activity_ms=0,
            deadline_ms=clock.wall_ms() + 60_000, through_seq=len(events),
        )  # fmt: skip
        replayed = await worker.process(job)
        assert replayed.status == "replayed"
        replay_requests = engine.core.counters.requests_total
        replay_computed = engine.core.computed_tokens_total
        # the application's next turn: its own messages + the new one, its own tools
        live_prompt = ChatPrompt.of_messages(
            [*conv.messages(tag), conv.next_user_message(tag)],
            tools=tuple(conv.TOOLS),
            chat_template_kwargs=conv.SETTINGS["chat_template_kwargs"],
        )
        live = await engine.prefill(
            PrefillRequest(REVISION, live_prompt, cache_salt_for(SALT_KEY, TENANT), 0, "live")
        )
    await engine.aclose()
    replay_prompt = ChatPrompt.of_messages(
        conv.messages(tag),
        tools=tuple(conv.TOOLS),
        chat_template_kwargs=conv.SETTINGS["chat_template_kwargs"],
    )
    return {
        "replayed_prompt_tokens": replayed.prompt_tokens,
        "transcript_tokens": len(sim_tokenize(replay_prompt)),
        "common_prefix_tokens": common_prefix(
            sim_tokenize(replay_prompt), sim_tokenize(live_prompt)
        ),
        "live_prompt_tokens": live.prompt_tokens,
        "live_cached_tokens": live.cached_prompt_tokens,
        "replay_requests": replay_requests,
        "replay_computed_tokens": replay_computed,
        "replayed_computed_tokens": replayed.prompt_tokens - replayed.cached_prompt_tokens,
    }


async def test_the_live_turn_after_replay_hits_the_whole_transcript_with_tool_calls() -> None:
    numbers = await replay_then_live(transcript("a"), "a")
    # replay sent the request the application sends: same token count, so the same tokens
    assert numbers["replayed_prompt_tokens"] == numbers["transcript_tokens"]
    # the two requests differ only from the generation prompt on ("assistant" vs "user")
    assert numbers["common_prefix_tokens"] == numbers["transcript_tokens"] - 1
    blocks = numbers["common_prefix_tokens"] // BLOCK_TOKENS
    assert numbers["live_cached_tokens"] == blocks * BLOCK_TOKENS
    share = numbers["live_cached_tokens"] / numbers["live_prompt_tokens"]
    print(f"live turn after replay: {numbers}, cached share {share:.3f}")
    assert numbers["transcript_tokens"] > 500  # the tool call and its result are in it


async def test_a_replay_sent_in_pieces_rebuilds_the_same_prefix_for_little_more_compute() -> None:
    whole = await replay_then_live(transcript("c"), "c")
    pieces = await replay_then_live(transcript("c"), "c", piece_tokens_max=100)
    assert whole["replay_requests"] == 1 and pieces["replay_requests"] >= 4
    assert pieces["live_cached_tokens"] == whole["live_cached_tokens"]
    # each later piece recomputes at most its predecessor's partial block and generation prompt
    extra = pieces["replay_computed_tokens"] - whole["replay_computed_tokens"]
    assert 0 <= extra <= pieces["replay_requests"] * 17
    assert pieces["replayed_computed_tokens"] == pieces["transcript_tokens"]  # nothing was cached


async def test_a_replay_that_drops_tool_events_rebuilds_only_what_came_before_them() -> None:
    """The measure can fail: the old render (no tool calls, no tool results, no tools) leaves
    the live turn only the blocks before the first difference: here, none (the tools come
    first in the rendered prompt)."""
    events = [
        e
        for e in transcript("b")
        if e.event_type in ("message.system", "message.user", "message.assistant")
        and "tool_calls" not in e.payload
    ]
    numbers = await replay_then_live(events, "b")
    assert numbers["live_cached_tokens"] == 0


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        ("message.user", {"text": "no content"}),
        ("message.user", {"content": "x", "role": "assistant"}),
        ("message.user", {"content": [{"type": "video", "url": "x"}]}),
        ("message.assistant", {"content": "x", "role": "user"}),
        ("message.assistant", {"tool_calls": [{"id": "c", "function": {"name": "f"}}]}),
        ("message.tool", {"content": "42"}),
        ("message.system", {"content": "x", "colour": "red"}),
        ("prompt.settings", {"tools": [{"type": "function", "function": {}}]}),
        ("prompt.settings", {"chat_template": ""}),
    ],
)
def test_the_api_edge_refuses_what_an_engine_would_not_render(
    event_type: str, payload: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError):
        EVENT_BODY.validate_python({"type": event_type, "payload": payload})


def test_bookkeeping_events_keep_their_free_payloads() -> None:
    for body in (
        {"type": "note", "payload": {"text": "anything"}},
        {
            "type": "tool.attempt",
            "payload": {"attempt_id": "a", "tool": "t", "argument_digest": "d", "x": [1]},
        },
    ):
        assert payload_of(EVENT_BODY.validate_python(body)) == body["payload"]
