"""The blocking client: each method drives one of the core's plans (``_operations``) over an
``httpx.Client``. Safe to share between threads."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import httpx

from convplane_client._base import ClientBase
from convplane_client._core import Action, Plan, Raised, Send, Sleep
from convplane_client._models import (
    Appended,
    Conversation,
    ConversationCreated,
    EffectStatus,
    Event,
    EventPage,
    Route,
    ToolAttempt,
    ToolRun,
)

T = TypeVar("T")


class Client(ClientBase[httpx.Client]):
    """The blocking client of the plane (``ClientBase`` says what it takes)."""

    def _default_http(self) -> httpx.Client:
        return httpx.Client()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()

    # --- the API --------------------------------------------------------------------------------

    def create_conversation(
        self,
        conversation_id: str | None = None,
        *,
        model_revision: str | None = None,
        metadata: dict[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> ConversationCreated:
        return self._drive(
            self._ops.create_conversation(conversation_id, model_revision, metadata, deadline_s)
        )

    def get_conversation(
        self, conversation_id: str, *, deadline_s: float | None = None
    ) -> Conversation:
        return self._drive(self._ops.get_conversation(conversation_id, deadline_s))

    def append(
        self,
        conversation_id: str,
        event_type: str,
        payload: dict[str, Any],
        *,
        token_count: int | None = None,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
        deadline_s: float | None = None,
    ) -> Appended:
        return self._drive(
            self._ops.append(
                conversation_id,
                event_type,
                payload,
                token_count=token_count,
                expected_seq=expected_seq,
                idempotency_key=idempotency_key,
                deadline_s=deadline_s,
            )
        )

    def list_events(
        self,
        conversation_id: str,
        *,
        after_seq: int = 0,
        limit: int = 100,
        deadline_s: float | None = None,
    ) -> EventPage:
        return self._drive(self._ops.list_events(conversation_id, after_seq, limit, deadline_s))

    def transcript(self, conversation_id: str, *, deadline_s: float | None = None) -> list[Event]:
        return self._drive(self._ops.transcript(conversation_id, deadline_s))

    def route(self, conversation_id: str, *, deadline_s: float | None = None) -> Route:
        return self._drive(self._ops.route(conversation_id, deadline_s))

    def record_tool_attempt(
        self,
        conversation_id: str,
        attempt_id: str,
        tool: str,
        argument_digest: str,
        *,
        deadline_s: float | None = None,
    ) -> Appended:
        return self._drive(
            self._ops.record_tool_attempt(
                conversation_id, attempt_id, tool, argument_digest, deadline_s
            )
        )

    def tool_attempt(
        self, conversation_id: str, attempt_id: str, *, deadline_s: float | None = None
    ) -> ToolAttempt:
        return self._drive(self._ops.tool_attempt(conversation_id, attempt_id, deadline_s))

    def commit_tool_effect(
        self,
        conversation_id: str,
        attempt_id: str,
        status: EffectStatus = "committed",
        *,
        result: Any = None,
        error: str | None = None,
        deadline_s: float | None = None,
    ) -> Appended:
        return self._drive(
            self._ops.commit_tool_effect(
                conversation_id,
                attempt_id,
                status,
                result=result,
                error=error,
                deadline_s=deadline_s,
            )
        )

    def run_tool_once(
        self,
        conversation_id: str,
        attempt_id: str,
        tool: str,
        arguments: Any,
        fn: Callable[[str], Any],
        *,
        deadline_s: float | None = None,
    ) -> ToolRun:
        """Run ``fn(attempt_id)`` unless the attempt's effect is already recorded; see
        ``Operations.run_tool_once``."""
        return self._drive(
            self._ops.run_tool_once(conversation_id, attempt_id, tool, arguments, fn, deadline_s)
        )

    # --- the driver -----------------------------------------------------------------------------

    def _drive(self, plan: Plan[T]) -> T:
        outcome: object = None
        while True:
            try:
                action = plan.send(outcome)
            except StopIteration as done:
                return cast(T, done.value)
            outcome = self._perform(action)

    def _perform(self, action: Action) -> object:
        if isinstance(action, Send):
            try:
                return self._http.send(action.request)
            except httpx.TransportError as exc:
                return exc
        if isinstance(action, Sleep):
            self._ops.clock.sleep(action.seconds)
            return None
        try:
            result = action.fn(action.attempt_id)
        except Exception as exc:
            return Raised(exc)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError("Client runs plain functions as tools; use AsyncClient for async ones")
        return result
