"""The prefix a replay rebuilds for the live turn after it, for agent conversations with tool
calls (issue 14): part of ``bench/replay.py``'s report, also runnable alone:
``.venv/bin/python -m bench.replay_prefix [--conversations N] [--seed S]``.

Per conversation (seeded): a system prompt, ``tools`` and template kwargs, then turns in which
the user asks, the assistant calls 0-3 tools (each answered by a ``message.tool``) and answers.
The chat application appends it as events (each body validated by the API's request model),
replay renders the transcript (``replay.chat.render_prompt``, what the worker sends) and
prefills it on a simulated engine (``sim_core``: block hashes over the rendered prompt), then
the application sends its next turn from its own messages. Reported: the live turn's cached
tokens as a share of its prompt, against the best any replay can do (the transcript's common
prefix with the live prompt, floored to 16-token blocks), and what the old render (no tool
calls, tool results or tools) got.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

from pydantic import TypeAdapter

from replay.chat import ChatPrompt, PromptEvent, render_prompt
from replay.engines.sim_core import (
    BLOCK_TOKENS,
    PrefillServerModel,
    SimEngineConfig,
    sim_tokenize,
)
from replay.transcripts import TranscriptEvent
from services.api.event_bodies import AppendEventRequest, payload_of

SALT = "tenant-salt"


def _words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(50_000)}" for _ in range(count))


def agent_conversation(
    rng: random.Random, turns: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(prompt settings, messages) of one agent conversation, as the application keeps them."""
    names = [f"tool_{i}" for i in range(rng.randint(1, 4))]
    tools: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": name, "description": _words(rng, 12),
                                          "parameters": {"type": "object"}}}
        for name in names
    ]  # fmt: skip
    settings: dict[str, Any] = {"tools": tools, "chat_template_kwargs": {"enable_thinking": False}}
    messages: list[dict[str, Any]] = [{"role": "system", "content": _words(rng, 60)}]
    for turn in range(turns):
        messages.append({"role": "user", "content": _words(rng, rng.randint(10, 120))})
        for call in range(rng.randint(0, 3)):
            call_id = f"call_{turn}_{call}"
            arguments = json.dumps({"q": _words(rng, rng.randint(1, 8))})
            function = {"name": rng.choice(names), "arguments": arguments}
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [{"id": call_id, "type": "function",
                                             "function": function}]})  # fmt: skip
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _words(rng, rng.randint(20, 300))})  # fmt: skip
        messages.append({"role": "assistant", "content": _words(rng, rng.randint(20, 200))})
    return settings, messages


def transcript(settings: dict[str, Any], messages: list[dict[str, Any]]) -> list[TranscriptEvent]:
    bodies = [{"type": "prompt.settings", "payload": settings}]
    bodies += [{"type": f"message.{m['role']}", "payload": m} for m in messages]
    api_accepts = TypeAdapter(AppendEventRequest)  # what the API accepts
    checked = [api_accepts.validate_python(b) for b in bodies]
    return [TranscriptEvent(seq, b.type, payload_of(b)) for seq, b in enumerate(checked, start=1)]


def old_render(events: list[TranscriptEvent]) -> ChatPrompt:
    """The render before issue 14: text messages only, no tool calls, results or tools."""
    kept: list[PromptEvent] = [
        e for e in events
        if e.event_type in ("message.system", "message.user", "message.assistant")
        and "tool_calls" not in e.payload
    ]  # fmt: skip
    prompt = render_prompt(kept)
    return ChatPrompt(prompt.messages)


def cached_after_replay(replayed: ChatPrompt, live: ChatPrompt) -> tuple[int, int]:
    """(live prompt tokens, live cached tokens) after prefilling ``replayed`` on a fresh engine."""
    engine = PrefillServerModel(SimEngineConfig(prefill_tokens_per_s=1e6, cache_tokens=10**7))
    for at_s, prompt in ((0.0, replayed), (100.0, live)):
        engine.submit(sim_tokenize(prompt), SALT, 0, at_s)
        while (next_s := engine.next_event_s()) is not None:
            engine.advance(next_s)
    done = engine.pop_completed()[-1]
    return done.prompt_tokens, done.cached_tokens


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure(conversations: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    totals = {"prompt": 0, "cached": 0, "bound": 0, "old_cached": 0, "tool_calls": 0}
    for _ in range(conversations):
        settings, messages = agent_conversation(rng, turns=rng.randint(1, 4))
        events = transcript(settings, messages)
        replayed = render_prompt(events)
        live = ChatPrompt.of_messages(
            [*messages, {"role": "user", "content": _words(rng, 30)}],
            tools=tuple(settings["tools"]),
            chat_template_kwargs=settings["chat_template_kwargs"],
        )
        prompt_tokens, cached = cached_after_replay(replayed, live)
        common = _common(sim_tokenize(replayed), sim_tokenize(live))
        totals["prompt"] += prompt_tokens
        totals["cached"] += cached
        totals["bound"] += common // BLOCK_TOKENS * BLOCK_TOKENS
        totals["old_cached"] += cached_after_replay(old_render(events), live)[1]
        totals["tool_calls"] += sum(1 for m in messages if m.get("tool_calls"))
    return {
        "conversations": conversations,
        "tool_calls": totals["tool_calls"],
        "live_prompt_tokens": totals["prompt"],
        "cached_share": round(totals["cached"] / totals["prompt"], 4),
        "cached_share_bound": round(totals["bound"] / totals["prompt"], 4),
        "cached_share_old_render": round(totals["old_cached"] / totals["prompt"], 4),
    }


def report_line(numbers: dict[str, float]) -> str:
    return (
        f"  prefix after replay ({numbers['conversations']} agent conversations, "
        f"{numbers['tool_calls']} tool calls): live turn cached share "
        f"{numbers['cached_share']:.3f} of its prompt (bound, whole transcript to 16-token "
        f"blocks: {numbers['cached_share_bound']:.3f}; old render without tool events: "
        f"{numbers['cached_share_old_render']:.3f})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    numbers = measure(args.conversations, args.seed)
    print(report_line(numbers))
    print(json.dumps(numbers))


if __name__ == "__main__":
    main()
