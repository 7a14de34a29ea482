"""The body of ``POST /v1/conversations/{id}/events``: one model per event type, joined in a
union discriminated by ``type``, so the OpenAPI document says exactly what the server requires
of each type (a generated client cannot build an event the server refuses).

Payloads are open objects (``additionalProperties: true``): the log stores what the chat
application sends, whole, because replay renders it back into the prompt. Only the fields the
log's rules read are declared and required (``eventlog.conversation_state.validate_event``
checks the same rules again, below the API).

The prompt's events (``message.*``, ``prompt.settings``) take their payload models from
``replay.chat``: what the server accepts there is exactly what replay can send to the engine.
To give another event type a richer payload, write its model in its own module and use it as
the ``payload`` of that type's event model here; the union, the document and the route follow.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self, get_args

from fastapi.openapi.models import Example
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    StringConstraints,
    model_validator,
)

from replay import chat

#: letters, digits and ``._:-``, but never ``.`` or ``..`` alone: URL normalisation turns those
#: into other paths, so forwarding and replay could never reach such a conversation
ID_PATTERN = (
    r"^([A-Za-z0-9_:-][A-Za-z0-9._:-]*"
    r"|\.[A-Za-z0-9_:-][A-Za-z0-9._:-]*"
    r"|\.\.[A-Za-z0-9._:-]+)$"
)
ATTEMPT_ID_MAX = 128
JSON_INT_MAX = 2**53 - 1
TOKEN_COUNT_MAX = 10_000_000

AttemptId = Annotated[
    str, StringConstraints(min_length=1, max_length=ATTEMPT_ID_MAX, pattern=ID_PATTERN)
]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]


def integral(value: Any) -> Any:
    """JSON Schema's integer includes ``5.0``; strict pydantic would refuse it. Strings and
    booleans stay refused (the models are strict)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Integers as JSON Schema means them: 5 and 5.0, never "5" or true. The bounds come before the
# validator so that pydantic prints them as minimum/maximum in the document.
TokenCount = Annotated[int, Field(ge=0, le=TOKEN_COUNT_MAX), BeforeValidator(integral)]
Seq = Annotated[int, Field(ge=0, le=JSON_INT_MAX), BeforeValidator(integral)]


class _AsSent(BaseModel):
    """A payload model that remembers the object the client sent: the log stores that (every
    field, in the client's order), not pydantic's re-serialization of it, because replay sends
    it back to the engine and a prefix cache hits only on identical tokens."""

    _as_sent: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_as_sent(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        payload = handler(data)
        if isinstance(data, dict):
            payload._as_sent = dict(data)
        return payload

    def as_sent(self) -> dict[str, Any]:
        if self._as_sent is not None:
            return self._as_sent
        return self.model_dump(mode="json", exclude_unset=True)


class OpenPayload(_AsSent):
    """A payload that keeps every field the client sent, declared or not."""

    model_config = ConfigDict(extra="allow", strict=True)


# The prompt's events carry what the chat application sends the engine: OpenAI-style chat
# messages and the request fields that shape the prompt (``replay.chat`` defines them and why).
class SystemMessagePayload(_AsSent, chat.SystemMessage):
    """A system message as sent to the engine (``role`` may be left out)."""


class UserMessagePayload(_AsSent, chat.UserMessage):
    """A user message as sent to the engine: text, or content parts (text, image, audio)."""


class AssistantMessagePayload(_AsSent, chat.AssistantMessage):
    """An assistant message as the engine produced it: ``content`` and/or ``tool_calls``."""


class ToolMessagePayload(_AsSent, chat.ToolMessage):
    """A tool's result, answering the assistant's tool call ``tool_call_id``."""


# named after its event type, ``prompt.settings``: the OpenAPI document's (and generated clients')
# name for it, so not ``*Config``; its docstring is the document's description
class PromptSettingsPayload(_AsSent, chat.PromptConfig):
    """Request fields that shape the prompt from this point on: the ``tools`` definitions, the
    chat template and its kwargs (the latest settings event wins)."""


class NotePayload(OpenPayload):
    """Anything the application wants in the transcript that is not part of the prompt."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"text": "user opened settings"}]})


class ToolAttemptPayload(OpenPayload):
    """Recorded *before* the external call. ``attempt_id`` doubles as the idempotency key sent
    to the external system; ask ``GET .../tool-attempts/{attempt_id}`` after a failover before
    running the tool again."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"attempt_id": "att-1", "tool": "get_weather", "argument_digest": "sha256:9f2c"}
            ]
        }
    )

    attempt_id: AttemptId
    tool: NonEmpty = Field(description="the tool's name")
    argument_digest: NonEmpty = Field(description="a digest of the call's arguments")


class ToolEffectPayload(OpenPayload):
    """Recorded *after* the external effect committed (or definitely failed). At most one
    effect per attempt commits: an identical repeat returns the original, a different one is
    409 ``effect_conflict``; an effect for an attempt never recorded is 409 ``unknown_attempt``."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"attempt_id": "att-1", "status": "committed"}]}
    )

    attempt_id: AttemptId
    status: Literal["committed", "failed"]


class _EventCommon(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    token_count: TokenCount | None = Field(
        default=None,
        description="prompt tokens of this event, when the application knows them",
    )
    expected_seq: Seq | None = Field(
        default=None,
        description="append only if the conversation's last seq is this (else 409 seq_conflict)",
    )


EVENT_EXAMPLES: dict[str, dict[str, Any]] = {
    "message.user": {"content": "What's the weather in Paris?"},
    "message.assistant": {
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    "message.system": {"content": "You are a helpful assistant."},
    "message.tool": {"tool_call_id": "call_1", "content": "sunny, 21 °C"},
    "prompt.settings": {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ]
    },
    "tool.attempt": {"attempt_id": "att-1", "tool": "get_weather", "argument_digest": "9f2c"},
    "tool.effect": {"attempt_id": "att-1", "status": "committed"},
    "note": {"text": "escalated to a human"},
}


def _example(event_type: str) -> ConfigDict:
    example: dict[str, Any] = {"type": event_type, "payload": EVENT_EXAMPLES[event_type]}
    return ConfigDict(json_schema_extra={"examples": [example]})


class UserMessageEvent(_EventCommon):
    """A message from the end user."""

    model_config = _example("message.user")
    type: Literal["message.user"]
    payload: UserMessagePayload


class AssistantMessageEvent(_EventCommon):
    """A message the model produced."""

    model_config = _example("message.assistant")
    type: Literal["message.assistant"]
    payload: AssistantMessagePayload


class SystemMessageEvent(_EventCommon):
    """A system prompt or instruction."""

    model_config = _example("message.system")
    type: Literal["message.system"]
    payload: SystemMessagePayload


class ToolMessageEvent(_EventCommon):
    """The result of a tool call, as sent to the engine in the next request."""

    model_config = _example("message.tool")
    type: Literal["message.tool"]
    payload: ToolMessagePayload


class PromptSettingsEvent(_EventCommon):
    """The tools and chat template the application sends with every request from now on."""

    model_config = _example("prompt.settings")
    type: Literal["prompt.settings"]
    payload: PromptSettingsPayload


class ToolAttemptEvent(_EventCommon):
    """The application is about to call a tool."""

    model_config = _example("tool.attempt")
    type: Literal["tool.attempt"]
    payload: ToolAttemptPayload


class ToolEffectEvent(_EventCommon):
    """The tool call's effect committed (or failed) in the external system."""

    model_config = _example("tool.effect")
    type: Literal["tool.effect"]
    payload: ToolEffectPayload


class NoteEvent(_EventCommon):
    """A note kept in the transcript."""

    model_config = _example("note")
    type: Literal["note"]
    payload: NotePayload = Field(default_factory=NotePayload)


EVENT_MODELS: tuple[type[_EventCommon], ...] = (
    UserMessageEvent,
    AssistantMessageEvent,
    SystemMessageEvent,
    ToolMessageEvent,
    PromptSettingsEvent,
    ToolAttemptEvent,
    ToolEffectEvent,
    NoteEvent,
)
AnyEvent = (
    UserMessageEvent
    | AssistantMessageEvent
    | SystemMessageEvent
    | ToolMessageEvent
    | PromptSettingsEvent
    | ToolAttemptEvent
    | ToolEffectEvent
    | NoteEvent
)
AppendEventRequest = Annotated[AnyEvent, Field(discriminator="type")]


def examples_by_type() -> dict[str, Example]:
    """One named example per event type, for the operation's ``openapi_examples``."""
    named: dict[str, Example] = {}
    for model in EVENT_MODELS:
        (event_type,) = get_args(model.model_fields["type"].annotation)
        named[event_type] = {
            "summary": model.__doc__ or event_type,
            "value": {"type": event_type, "payload": EVENT_EXAMPLES[event_type]},
        }
    return named


def payload_of(event: AnyEvent) -> dict[str, Any]:
    """The payload as the client sent it (every field, in its order, no defaults added)."""
    return event.payload.as_sent()
