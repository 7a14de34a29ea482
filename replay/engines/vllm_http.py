"""``VllmHttpEngine``: the inference-engine port over vLLM's OpenAI-compatible HTTP server.

Prefill = ``POST /v1/chat/completions`` with the conversation's prompt exactly as the live path
sends it (messages with tool calls, ``tools``, ``chat_template`` and ``chat_template_kwargs``:
``replay.chat``) and ``tool_choice: "none"`` when it has tools (``REPLAY_TOOL_CHOICE``: a
correctly started server never refuses it), ``max_completion_tokens=1`` (``max_tokens`` is deprecated) and
``temperature=0``, plus two vLLM extensions of the request body: ``priority`` (honoured when the server runs
``--scheduling-policy priority``; lower value = scheduled first, so replay sends a high number)
and ``cache_salt`` (prefix-cache entries are only shared between requests with the same salt:
we salt per tenant). Prompt tokens come from ``usage.prompt_tokens``; cached tokens from
``usage.prompt_tokens_details.cached_tokens``, which vLLM only fills when started with
``--enable-prompt-tokens-details`` (otherwise ``cached_reported`` is False). Automatic prefix
caching must be on (the default in vLLM V1). A 404 means the server does not serve the model:
``ModelRevisionMismatch``.

Metrics = ``GET /metrics`` (Prometheus text, see ``prometheus_text``). ``self_check`` (see
``vllm_check``) is what a worker runs before it takes jobs.

The ``httpx.AsyncClient`` is pooled and owned here (or injected: tests pass one with an ASGI
transport); every call has its own timeout. HTTP and transport errors are translated once, here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import httpx

from eventlog.http_headers import REQUEST_ID_HEADER
from replay.engines.base import (
    REPLAY_TOOL_CHOICE,
    EngineRejectedRequest,
    EngineUnavailable,
    InferenceEngine,
    ModelRevisionMismatch,
)
from replay.engines.prometheus_text import parse_engine_metrics
from replay.engines.vllm_check import run_self_check
from replay.model import EngineFitness, EngineMetrics, PrefillOutcome, PrefillRequest


class VllmHttpEngine(InferenceEngine):
    def __init__(
        self,
        engine_id: str,
        base_url: str,
        model_revision: str,
        *,
        prefill_timeout_s: float = 120.0,
        metrics_timeout_s: float = 2.0,
        max_connections: int = 64,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._engine_id = engine_id
        self._model_revision = model_revision
        self._prefill_timeout_s = prefill_timeout_s
        self._metrics_timeout_s = metrics_timeout_s
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            base_url=base_url,
            limits=httpx.Limits(max_connections=max_connections),
            timeout=httpx.Timeout(metrics_timeout_s),
        )

    @property
    def engine_id(self) -> str:
        return self._engine_id

    @property
    def model_revision(self) -> str:
        return self._model_revision

    async def prefill(self, request: PrefillRequest) -> PrefillOutcome:
        return await self._prefill(request, REPLAY_TOOL_CHOICE)

    async def _prefill(self, request: PrefillRequest, tool_choice: str) -> PrefillOutcome:
        """``prefill`` with the ``tool_choice`` to send when the prompt has tools (the
        self-check also asks for the live path's ``"auto"``)."""
        if request.model != self._model_revision:
            raise ModelRevisionMismatch(
                f"engine {self._engine_id} serves {self._model_revision!r}, not {request.model!r}"
            )
        body = {
            "model": request.model,
            **request.prompt.request_fields(),
            **({"tool_choice": tool_choice} if request.prompt.tools else {}),
            "max_completion_tokens": 1,
            "temperature": 0,
            "priority": request.priority,
            "cache_salt": request.cache_salt,
        }
        headers = {REQUEST_ID_HEADER: request.request_id}
        response = await self._call(
            "POST", "/v1/chat/completions", self._prefill_timeout_s, json=body, headers=headers
        )
        elapsed_ms = response.elapsed.total_seconds() * 1000.0
        usage = _json_object(response).get("usage")
        if not isinstance(usage, Mapping):
            raise EngineUnavailable(f"engine {self._engine_id}: response without usage")
        cached = _cached_tokens(usage)
        return PrefillOutcome(
            prompt_tokens=_count(usage.get("prompt_tokens")),
            cached_prompt_tokens=cached or 0,
            duration_ms=elapsed_ms,
            cached_reported=cached is not None,
        )

    async def metrics(self) -> EngineMetrics:
        response = await self._call("GET", "/metrics", self._metrics_timeout_s)
        return parse_engine_metrics(response.text)

    async def served_models(self) -> dict[str, int | None]:
        """Served model names and each one's ``max_model_len`` (None when not reported)."""
        response = await self._call("GET", "/v1/models", self._metrics_timeout_s)
        data = _json_object(response).get("data")
        if not isinstance(data, list):
            raise EngineUnavailable(f"engine {self._engine_id}: /v1/models without data")
        served: dict[str, int | None] = {}
        for card in data:
            if isinstance(card, Mapping) and "id" in card:
                length = card.get("max_model_len")
                valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
                served[str(card["id"])] = length if valid else None
        return served

    async def self_check(
        self, replay_priority: int, *, priority_declared: bool = False
    ) -> EngineFitness:
        """``replay.engines.vllm_check``."""
        return await run_self_check(
            self._model_revision,
            self.served_models,
            self._prefill,
            self.metrics,
            replay_priority=replay_priority,
            priority_declared=priority_declared,
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _call(
        self, method: str, path: str, timeout_s: float, **kwargs: Any
    ) -> httpx.Response:
        try:
            response = await self._client.request(
                method, path, timeout=httpx.Timeout(timeout_s), **kwargs
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailable(
                f"engine {self._engine_id}: {method} {path} failed: {exc!r}"
            ) from exc
        status = response.status_code
        if status < 400:
            return response
        detail = response.text[:300]
        message = f"engine {self._engine_id}: {method} {path} -> {status}: {detail}"
        if status == 429 or status >= 500:
            raise EngineUnavailable(message, retry_after_s=_retry_after_s(response))
        if status == 404 and path == "/v1/chat/completions":  # vLLM: the model is not served
            raise ModelRevisionMismatch(message)
        raise EngineRejectedRequest(message)


def _json_object(response: httpx.Response) -> Mapping[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise EngineUnavailable(f"engine answered non-JSON: {response.text[:200]!r}") from exc
    if not isinstance(body, Mapping):
        raise EngineUnavailable("engine answered a JSON value that is not an object")
    return body


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EngineUnavailable(f"engine answered a bad token count: {value!r}")
    return value


def _cached_tokens(usage: Mapping[str, Any]) -> int | None:
    """None when not reported (vLLM without --enable-prompt-tokens-details)."""
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, Mapping) or details.get("cached_tokens") is None:
        return None
    return _count(details.get("cached_tokens"))


def _retry_after_s(response: httpx.Response) -> float | None:
    raw = response.headers.get("retry-after")
    try:
        value = float(raw) if raw is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
