"""HTTP face of the simulated engine: the subset of vLLM's OpenAI-compatible API that convplane
uses, so ``VllmHttpEngine`` talks to the simulator unchanged.

    POST /v1/chat/completions   model, messages (OpenAI chat messages: tool calls, tool results,
                                content parts), tools, tool_choice, chat_template,
                                chat_template_kwargs, max_completion_tokens / max_tokens (only
                                1 token is simulated), priority, cache_salt (non-empty when
                                given, as in vLLM); answers OpenAI-shaped JSON with
                                usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens
    GET  /v1/models             the one served model (id = the engine's model revision) and its
                                max_model_len

    GET  /metrics               vLLM-shaped Prometheus text
    GET  /health                200 when up

It refuses what vLLM 0.32 refuses, per the server flags in ``SimEngineConfig``: ``tools``
under ``tool_choice`` "auto" (the default) without ``--enable-auto-tool-choice``, a request's
own ``chat_template`` without ``--trust-request-chat-template``, a prompt over
``--max-model-len``; and like vLLM it takes ``priority`` under FCFS with a 200 and ignores it.
Errors use vLLM's shape ``{"error": {"message", "type", "param", "code"}}``. The app owns the
engine it is given and closes it on shutdown. A simulator: no model runs behind it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field, ValidationError

from eventlog.errors import ConvplaneError
from eventlog.http_headers import REQUEST_ID_HEADER
from replay.chat import (
    TOOLS_MAX,
    AssistantMessage,
    ChatPrompt,
    SystemMessage,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from replay.engines.base import EngineRejectedRequest, ModelRevisionMismatch
from replay.engines.sim_metrics import render_sim_exposition
from replay.engines.simulated import SimulatedEngine
from replay.model import PrefillRequest

MESSAGES_MAX = 10_000
AUTO_TOOLS_REFUSED = (  # vLLM's words
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


_Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class _ChatCompletionBody(BaseModel):
    model: str
    messages: list[_Message] = Field(min_length=1, max_length=MESSAGES_MAX)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=TOOLS_MAX)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    priority: int = 0
    cache_salt: str | None = Field(default=None, min_length=1)  # vLLM: an empty salt is a 400


def _error(status: int, message: str, kind: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def create_app(engine: SimulatedEngine) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await engine.aclose()

    app = FastAPI(title="convplane simulated inference engine", lifespan=lifespan)
    request_counter = iter(range(1 << 62))
    started_at = int(time.time())
    config = engine.core.config
    details = config.prompt_tokens_details

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            raw = await request.json()
            body = _ChatCompletionBody.model_validate(raw)
        except (ValidationError, ValueError) as exc:
            return _error(400, str(exc)[:500], "BadRequestError")
        tools = tuple(raw.get("tools") or ())
        tool_choice = body.tool_choice if body.tool_choice is not None else "auto"
        if tools and tool_choice == "auto" and not config.enable_auto_tool_choice:
            return _error(400, AUTO_TOOLS_REFUSED, "BadRequestError")
        if tool_choice == "none" and config.exclude_tools_when_tool_choice_none:
            tools = ()
        # the prompt is rendered from the messages as sent (verbatim JSON), like a chat template
        prompt = ChatPrompt(
            messages=tuple(raw["messages"]),
            tools=tools,
            chat_template=body.chat_template,
            chat_template_kwargs=dict(body.chat_template_kwargs or {}),
        )
        prefill = PrefillRequest(
            model=body.model,
            prompt=prompt,
            cache_salt=body.cache_salt or "",
            priority=body.priority,
            request_id=request.headers.get(REQUEST_ID_HEADER) or f"sim-{next(request_counter)}",
        )
        try:
            outcome = await engine.prefill(prefill)
        except ModelRevisionMismatch as exc:
            return _error(404, exc.message, "NotFoundError")
        except EngineRejectedRequest as exc:
            return _error(400, exc.message, "BadRequestError")
        except ConvplaneError as exc:
            return _error(503, exc.message, "ServiceUnavailableError")
        return JSONResponse(
            {
                "id": f"chatcmpl-{prefill.request_id}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "."},
                        "finish_reason": "length",
                    }
                ],
                "usage": {
                    "prompt_tokens": outcome.prompt_tokens,
                    "completion_tokens": 1,
                    "total_tokens": outcome.prompt_tokens + 1,
                    # vLLM fills this only with --enable-prompt-tokens-details
                    "prompt_tokens_details": (
                        {"cached_tokens": outcome.cached_prompt_tokens} if details else None
                    ),
                },
            }
        )

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        # vLLM's ModelCard: id = --served-model-name, root = the --model path
        revision = engine.model_revision
        entry = {
            "id": revision,
            "object": "model",
            "created": started_at,
            "owned_by": "vllm",
            "root": revision,
            "parent": None,
            "max_model_len": config.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [entry]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        await engine.metrics()  # advances the simulation to now
        text = render_sim_exposition(engine.core, engine.model_revision, started_at)
        if not config.log_stats:  # --disable-log-stats: no vllm: series at all
            text = ""
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    return app
