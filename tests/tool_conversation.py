"""An agent conversation with tool calls, as a chat application keeps it and as it appends it
to the log: the data of the replay-prefix tests (unit and e2e) and of ``bench/replay.py``'s
prefix line. The application owns the messages; the log gets one event per message."""

from __future__ import annotations

import json
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                "required": ["city"],
            },
        },
    }
]
SETTINGS: dict[str, Any] = {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}-{i}" for i in range(count))


def messages(tag: str, turn_words: int = 120) -> list[dict[str, Any]]:
    """The conversation so far, OpenAI-style, exactly as the application sends it."""
    call = {
        "id": f"call_{tag}_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Lisbon"})},
    }
    return [
        {"role": "system", "content": "You are a travel agent. " + words(f"{tag}-sys", 40)},
        {"role": "user", "content": [{"type": "text", "text": words(f"{tag}-u1", turn_words)}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": words(f"{tag}-result", turn_words)},
        {"role": "assistant", "content": words(f"{tag}-a1", turn_words)},
        {"role": "user", "content": words(f"{tag}-u2", turn_words)},
    ]


def next_user_message(tag: str) -> dict[str, Any]:
    return {"role": "user", "content": words(f"{tag}-u3", 30)}


def append_bodies(tag: str, turn_words: int = 120) -> list[dict[str, Any]]:
    """``POST /v1/conversations/{id}/events`` bodies: the settings, then one per message, with
    the tool call's bookkeeping events (``tool.attempt``/``tool.effect``) where the
    application makes the call; the message payload is the message itself."""
    bodies: list[dict[str, Any]] = [{"type": "prompt.settings", "payload": SETTINGS}]
    for message in messages(tag, turn_words):
        role = message["role"]
        bodies.append({"type": f"message.{role}", "payload": message})
        for call in message.get("tool_calls") or ():
            attempt = {"attempt_id": call["id"], "tool": call["function"]["name"],
                       "argument_digest": "sha256:0"}  # fmt: skip
            bodies.append({"type": "tool.attempt", "payload": attempt})
            effect = {"attempt_id": call["id"], "status": "committed"}
            bodies.append({"type": "tool.effect", "payload": effect})
    return bodies
