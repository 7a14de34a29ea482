"""HTTP face of the simulated engine: the subset of vLLM's OpenAI-compatible API that convplane
uses, so ``VllmHttpEngine`` talks to the simulator unchanged.

    POST /v1/chat/completions   model, messages (OpenAI chat messages: tool calls, tool results,
                                content parts), tools, chat_template, chat_template_kwargs,
                                max_completion_tokens / max_tokens (only 1 token is simulated),
                                priority, cache_salt (non-empty when given, as in vLLM); answers
                                OpenAI-shaped JSON with usage.prompt_tokens and
                                usage.prompt_tokens_details.cached_tokens
    GET  /v1/models             the one served model (id = the engine's model revision)
    GET  /metrics               vLLM-shaped Prometheus text
    GET  /health                200 when up

Errors use vLLM's shape ``{"error": {"message", "type", "param", "code"}}``. The app owns the
engine it is given and closes it on shutdown. A simulator: no model runs behind it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

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
MAX_MODEL_LEN = 131_072


_Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class _ChatCompletionBody(BaseModel):
    model: str
    messages: list[_Message] = Field(min_length=1, max_length=MESSAGES_MAX)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=TOOLS_MAX)
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
    details = engine.core.config.prompt_tokens_details

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            raw = await request.json()
            body = _ChatCompletionBody.model_validate(raw)
        except (ValidationError, ValueError) as exc:
            return _error(400, str(exc)[:500], "BadRequestError")
        # the prompt is rendered from the messages as sent (verbatim JSON), like a chat template
        prompt = ChatPrompt(
            messages=tuple(raw["messages"]),
            tools=tuple(raw.get("tools") or ()),
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
        if body.priority != 0 and engine.core.config.scheduling_policy != "priority":
            # vLLM's request validation (``add_request``): priorities need the priority policy
            return _error(400, f"Got priority {body.priority} but Priority scheduling is not "
                          "enabled.", "BadRequestError")  # fmt: skip
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
        entry = {"id": revision, "object": "model", "created": started_at, "owned_by": "vllm",
                 "root": revision, "parent": None, "max_model_len": MAX_MODEL_LEN,
                 "permission": []}  # fmt: skip
        return {"object": "list", "data": [entry]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        await engine.metrics()  # advances the simulation to now
        text = render_sim_exposition(engine.core, engine.model_revision, started_at)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    return app
