"""The API's operations as plans (see ``_core``): what each sends and how its answer is read,
and the tool helpers that make a tool's side effect happen at most once."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from convplane_client._core import Call, Core, Plan, Raised, RunTool
from convplane_client._errors import ConvplaneError, EffectConflict
from convplane_client._headers import IDEMPOTENT_REPLAYED_HEADER, SERVED_BY_HEADER
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

M = TypeVar("M", bound=BaseModel)


class ToolFailed(Exception):
    """Raise it from a tool run by ``run_tool_once`` when the effect *definitely* did not
    happen: the attempt is then recorded as ``failed`` (and never run again). Any other
    exception leaves the attempt pending: its outcome is unknown, and the next
    ``run_tool_once`` runs the tool again with the same ``attempt_id`` as the external system's
    idempotency key."""


def argument_digest(arguments: Any) -> str:
    """``sha256:`` of the arguments' canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _path(conversation_id: str, *rest: str) -> str:
    parts = [quote(conversation_id, safe=""), *(quote(p, safe="") for p in rest)]
    return "/v1/conversations/" + "/".join(parts)


def _parse(model: type[M], response: httpx.Response, **extra: Any) -> M:
    try:
        return model.model_validate({**response.json(), **extra})
    except (ValueError, ValidationError) as exc:
        raise ConvplaneError(
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code} with a body that is not a {model.__name__}",
            code="invalid_response",
            status=response.status_code,
        ) from exc


class Operations(Core):
    def create_conversation(
        self,
        conversation_id: str | None,
        model_revision: str | None,
        metadata: dict[str, Any] | None,
        deadline_s: float | None,
    ) -> Plan[ConversationCreated]:
        cid = conversation_id or self.new_id("c-")  # named, so a retry cannot create a second
        body: dict[str, Any] = {"conversation_id": cid, "metadata": metadata or {}}
        if model_revision is not None:
            body["model_revision"] = model_revision
        call = Call(
            "POST", "/v1/conversations", cid, body, deadline_s=deadline_s, resolve_route=False
        )
        response = yield from self.exchange(call)
        created = _parse(ConversationCreated, response)
        self.routing.learn(cid, created.leader_region)
        return created

    def get_conversation(
        self, conversation_id: str, deadline_s: float | None
    ) -> Plan[Conversation]:
        call = Call("GET", _path(conversation_id), conversation_id, deadline_s=deadline_s)
        return _parse(Conversation, (yield from self.exchange(call)))

    def append(
        self,
        conversation_id: str,
        event_type: str,
        payload: dict[str, Any],
        *,
        token_count: int | None,
        expected_seq: int | None,
        idempotency_key: str | None,
        deadline_s: float | None,
    ) -> Plan[Appended]:
        body: dict[str, Any] = {"type": event_type, "payload": payload}
        if token_count is not None:
            body["token_count"] = token_count
        if expected_seq is not None:
            body["expected_seq"] = expected_seq
        key = idempotency_key or self.new_id("k-")
        call = Call(
            "POST",
            _path(conversation_id, "events"),
            conversation_id,
            body,
            idempotency_key=key,
            deadline_s=deadline_s,
        )
        response = yield from self.exchange(call)
        return _parse(
            Appended,
            response,
            idempotency_key=key,
            replayed=response.headers.get(IDEMPOTENT_REPLAYED_HEADER) == "true",
            served_by=response.headers.get(SERVED_BY_HEADER),
        )

    def list_events(
        self, conversation_id: str, after_seq: int, limit: int, deadline_s: float | None
    ) -> Plan[EventPage]:
        call = Call(
            "GET",
            _path(conversation_id, "events"),
            conversation_id,
            params={"after_seq": after_seq, "limit": limit},
            deadline_s=deadline_s,
        )
        return _parse(EventPage, (yield from self.exchange(call)))

    def transcript(self, conversation_id: str, deadline_s: float | None) -> Plan[list[Event]]:
        """Every committed event, page after page (at most ``transcript_pages_max`` pages)."""
        events: list[Event] = []
        after_seq = 0
        for _ in range(self.config.transcript_pages_max):
            page = yield from self.list_events(
                conversation_id, after_seq, self.config.page_events_max, deadline_s
            )
            if not page.events:
                return events
            events.extend(page.events)
            after_seq = page.next_after_seq
        raise ConvplaneError(
            f"{conversation_id} has more than {self.config.transcript_pages_max} pages",
            code="transcript_too_long",
        )

    def route(self, conversation_id: str, deadline_s: float | None) -> Plan[Route]:
        call = Call(
            "GET",
            _path(conversation_id, "route"),
            conversation_id,
            deadline_s=deadline_s,
            resolve_route=False,
        )
        route = _parse(Route, (yield from self.exchange(call)))
        self.routing.learn(conversation_id, route.region)
        return route

    # --- tool attempts ------------------------------------------------------------------------

    def record_tool_attempt(
        self,
        conversation_id: str,
        attempt_id: str,
        tool: str,
        digest: str,
        deadline_s: float | None,
    ) -> Plan[Appended]:
        """``tool.attempt``, recorded *before* the external call. Recording the same attempt
        again returns the original (``replayed``); with other arguments it is 409 ``conflict``."""
        payload = {"attempt_id": attempt_id, "tool": tool, "argument_digest": digest}
        return (
            yield from self.append(
                conversation_id,
                "tool.attempt",
                payload,
                token_count=None,
                expected_seq=None,
                idempotency_key=None,
                deadline_s=deadline_s,
            )
        )

    def tool_attempt(
        self, conversation_id: str, attempt_id: str, deadline_s: float | None
    ) -> Plan[ToolAttempt]:
        """The attempt's state (404 ``NotFound`` when it was never recorded)."""
        path = _path(conversation_id, "tool-attempts", attempt_id)
        call = Call("GET", path, conversation_id, deadline_s=deadline_s)
        return _parse(ToolAttempt, (yield from self.exchange(call)))

    def commit_tool_effect(
        self,
        conversation_id: str,
        attempt_id: str,
        status: EffectStatus,
        *,
        result: Any,
        error: str | None,
        deadline_s: float | None,
    ) -> Plan[Appended]:
        """``tool.effect``, at most one per attempt: an identical repeat returns the original,
        a different one is 409 ``EffectConflict``. ``result`` / ``error`` go in its payload."""
        payload: dict[str, Any] = {"attempt_id": attempt_id, "status": status}
        if result is not None:
            payload["result"] = result
        if error is not None:
            payload["error"] = error
        return (
            yield from self.append(
                conversation_id,
                "tool.effect",
                payload,
                token_count=None,
                expected_seq=None,
                idempotency_key=None,
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
        deadline_s: float | None,
    ) -> Plan[ToolRun]:
        """Record the attempt; if it was recorded before (an earlier run, another process, a
        retry after a failover), ask its state and return the recorded effect without running
        the tool; else run ``fn(attempt_id)`` (``attempt_id``: the external system's
        idempotency key) and commit its effect. A tool's other exceptions propagate and leave
        the attempt pending."""
        digest = argument_digest(arguments)
        recorded = yield from self.record_tool_attempt(
            conversation_id, attempt_id, tool, digest, deadline_s
        )
        if recorded.replayed:
            attempt = yield from self.tool_attempt(conversation_id, attempt_id, deadline_s)
            if attempt.state != "pending":
                return ToolRun.recorded(attempt, ran=False)
        outcome = yield RunTool(fn, attempt_id)
        status: EffectStatus = "committed"
        result, error = outcome, None
        if isinstance(outcome, Raised):
            if not isinstance(outcome.error, ToolFailed):
                raise outcome.error
            status, result, error = "failed", None, str(outcome.error) or "failed"
        try:
            yield from self.commit_tool_effect(
                conversation_id,
                attempt_id,
                status,
                result=result,
                error=error,
                deadline_s=deadline_s,
            )
        except EffectConflict:  # another run committed first: its effect is the one
            attempt = yield from self.tool_attempt(conversation_id, attempt_id, deadline_s)
            return ToolRun.recorded(attempt, ran=True)
        return ToolRun(attempt_id=attempt_id, state=status, result=result, error=error, ran=True)
