"""The chat request the live path sends an engine, as the transcript stores it, and its render.

A prefix cache hits only on identical tokens, so replay must send the engine exactly the request
the chat application's next turn will send: the same messages (tool calls and tool results
included), the same ``tools`` definitions, chat template and template kwargs, the same model
revision and ``cache_salt``. The transcript therefore stores the OpenAI-style messages *as the
application sends them*, one event per message, and the request-level fields in their own event:

==================== ========================================================================
event type           payload (an OpenAI chat message without ``role``; ``role`` may be given
                     and must then match the type)
==================== ========================================================================
``message.system``   ``content`` (string or text parts), ``name``?
``message.user``     ``content`` (string or parts: ``text``, ``image_url``, ``input_audio``),
                     ``name``?
``message.assistant`` ``content`` (string, text parts or null), ``tool_calls``? (``id``,
                     ``type: "function"``, ``function: {name, arguments}``), ``name``?,
                     ``refusal``?; content or tool_calls must be there
``message.tool``     ``tool_call_id`` (the id of the call it answers, as the application
                     sends it),
                     ``content``
``prompt.settings``  the request-level fields that shape the prompt, in force from this event
                     on: ``tools`` (OpenAI function definitions), ``chat_template``,
                     ``chat_template_kwargs``
==================== ========================================================================

``tool.attempt``, ``tool.effect`` and ``note`` are the log's own bookkeeping (exactly-once tool
effects) and never part of the prompt: the model sees a tool call as the assistant message's
``tool_calls`` and its result as the ``message.tool`` event.

The API's event models (``services/api/event_bodies.py``) use these models as the payloads of
the prompt's events, so the edge accepts exactly what replay can send (400 otherwise);
``render_prompt`` turns a transcript back into the request. What is read back from the log is validated again, as
data: rendering stops at the first message it cannot render (an event written before this
schema, for example), because every token after a difference misses the cache anyway.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

TEXT_CHARS_MAX = 4_000_000  # one message's text: a long document pasted into a chat
PARTS_MAX = 256  # content parts of one message
TOOL_CALLS_MAX = 128  # tool calls of one assistant message
TOOLS_MAX = 256  # tool definitions of one conversation
CHAT_TEMPLATE_CHARS_MAX = 256_000
NAME_CHARS_MAX = 256

Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_CHARS_MAX)]
Text = Annotated[str, StringConstraints(max_length=TEXT_CHARS_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ImageUrl(_Strict):
    url: Annotated[str, StringConstraints(min_length=1, max_length=TEXT_CHARS_MAX)]
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(_Strict):
    data: Annotated[str, StringConstraints(min_length=1, max_length=TEXT_CHARS_MAX)]
    format: Literal["wav", "mp3"]


class AudioPart(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


UserPart = Annotated[TextPart | ImagePart | AudioPart, Field(discriminator="type")]
TextContent = Text | Annotated[list[TextPart], Field(min_length=1, max_length=PARTS_MAX)]
UserContent = Text | Annotated[list[UserPart], Field(min_length=1, max_length=PARTS_MAX)]


class ToolCallFunction(_Strict):
    name: Name
    arguments: Text  # a JSON string, as the model produced it: stored and sent verbatim


class ToolCall(_Strict):
    id: Name
    type: Literal["function"] = "function"
    function: ToolCallFunction


class SystemMessage(_Strict):
    role: Literal["system"] = "system"
    content: TextContent
    name: Name | None = None


class UserMessage(_Strict):
    role: Literal["user"] = "user"
    content: UserContent
    name: Name | None = None


class AssistantMessage(_Strict):
    """``content``, ``tool_calls`` or both. OpenAI's API refuses an assistant message with
    neither; vLLM renders it as an empty turn. Stored as the application sent it, so the live
    request and its replay agree either way (a JSON Schema rule for "one of them" breaks client
    generators, and a generated client must be able to send whatever the server accepts)."""

    role: Literal["assistant"] = "assistant"
    content: TextContent | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=TOOL_CALLS_MAX)] | None = (
        None
    )
    name: Name | None = None
    refusal: Text | None = None


class ToolMessage(_Strict):
    role: Literal["tool"] = "tool"
    tool_call_id: Name
    content: TextContent


class FunctionDefinition(_Strict):
    name: Name
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema, sent verbatim
    strict: bool | None = None


class ToolDefinition(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class PromptConfig(_Strict):
    tools: Annotated[list[ToolDefinition], Field(max_length=TOOLS_MAX)] | None = None
    chat_template: (
        Annotated[str, StringConstraints(min_length=1, max_length=CHAT_TEMPLATE_CHARS_MAX)] | None
    ) = None
    chat_template_kwargs: dict[str, Any] | None = None


MESSAGE_MODELS: Mapping[str, type[_Strict]] = {
    "message.system": SystemMessage,
    "message.user": UserMessage,
    "message.assistant": AssistantMessage,
    "message.tool": ToolMessage,
}
SETTINGS_EVENT = "prompt.settings"
PROMPT_EVENT_TYPES = frozenset({*MESSAGE_MODELS, SETTINGS_EVENT})
ROLE_OF_EVENT: Mapping[str, str] = {t: t.removeprefix("message.") for t in MESSAGE_MODELS}


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """The prompt-shaping part of a chat completion request: what replay sends, verbatim."""

    messages: tuple[Mapping[str, Any], ...]  # OpenAI chat messages, ``role`` first
    tools: tuple[Mapping[str, Any], ...] = ()
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of_messages(cls, messages: Iterable[Mapping[str, Any]], **settings: Any) -> ChatPrompt:
        return cls(tuple(messages), **settings)

    def request_fields(self) -> dict[str, Any]:
        """The fields of a ``/v1/chat/completions`` body that shape the prompt."""
        body: dict[str, Any] = {"messages": [dict(m) for m in self.messages]}
        if self.tools:
            body["tools"] = [dict(t) for t in self.tools]
        if self.chat_template is not None:
            body["chat_template"] = self.chat_template
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        return body


class PromptEvent(Protocol):
    """What ``render_prompt`` needs of a transcript event (``replay.worker.TranscriptEvent``)."""

    @property
    def event_type(self) -> str: ...

    @property
    def payload(self) -> Mapping[str, Any]: ...


def render_prompt(events: Iterable[PromptEvent]) -> ChatPrompt:
    """The request the live path sends after this transcript (see the module docstring).

    Each message is the stored payload with its ``role``, key order and values as stored (so
    the engine renders the same tokens). Settings are the latest ``prompt.settings`` event.
    """
    messages: list[Mapping[str, Any]] = []
    settings = PromptConfig()
    settings_payload: Mapping[str, Any] = {}
    for event in events:
        event_type, payload = event.event_type, event.payload
        if event_type == SETTINGS_EVENT:
            try:
                settings = PromptConfig.model_validate(dict(payload))
            except ValidationError:
                break
            settings_payload = payload
            continue
        model = MESSAGE_MODELS.get(event_type)
        if model is None:
            continue  # tool.attempt / tool.effect / note: bookkeeping, not prompt
        try:
            model.model_validate(dict(payload))
        except ValidationError:
            break  # everything after a message we cannot render would miss the cache anyway
        role = ROLE_OF_EVENT[event_type]
        messages.append({"role": role, **{k: v for k, v in payload.items() if k != "role"}})
    return ChatPrompt(
        messages=tuple(messages),
        tools=tuple(settings_payload.get("tools") or ()),
        chat_template=settings.chat_template,
        chat_template_kwargs=dict(settings_payload.get("chat_template_kwargs") or {}),
    )


def canonical_json(value: Any) -> str:
    """One spelling of a JSON value (sorted keys, no spaces): for hashing, never for sending."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def replay_pieces(prompt: ChatPrompt, piece_tokens_max: int) -> list[ChatPrompt]:
    """The prompt as successively longer message prefixes, each adding about
    ``piece_tokens_max`` tokens (estimated at 4 characters a token), the last the whole prompt.

    vLLM schedules running requests before waiting ones, so a replay that is running holds
    the step budget ahead of live requests that arrive later until its prefill ends; sent in
    pieces, each piece hits the cache of the one before and holds the budget for about one
    step. Cuts fall between messages (a message is never split), so a piece can be larger."""
    pieces: list[ChatPrompt] = []
    estimate = 0
    for count, message in enumerate(prompt.messages[:-1], start=1):
        estimate += len(canonical_json(message)) // 4
        if piece_tokens_max > 0 and estimate >= piece_tokens_max:
            pieces.append(replace(prompt, messages=prompt.messages[:count]))
            estimate = 0
    pieces.append(prompt)
    return pieces
