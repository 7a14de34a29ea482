"""Values shared by the replay scheduler, the job bus, the workers and the engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replay.chat import ChatPrompt


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """Rebuild one conversation's KV cache on some worker of ``region``."""

    job_id: str
    region: str
    tenant_id: str
    conversation_id: str
    model_revision: str
    estimated_prompt_tokens: int
    last_activity_ms: int
    deadline_ms: int  # wall clock; a worker drops the job after this
    through_seq: int  # replay the transcript up to and including this seq


ReplayStatus = Literal["replayed", "skipped_live", "expired", "wrong_model", "failed"]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    job_id: str
    region: str
    tenant_id: str
    conversation_id: str
    model_revision: str
    status: ReplayStatus
    worker_id: str
    engine_id: str
    prompt_tokens: int
    cached_prompt_tokens: int
    duration_ms: float
    finished_at_ms: int


@dataclass(frozen=True, slots=True)
class PrefillRequest:
    """A prefill-only request: the exact prompt the live path will send, max_tokens=1."""

    model: str
    prompt: ChatPrompt  # messages, tools, chat template and kwargs, verbatim
    cache_salt: str  # per tenant: prefix-cache entries never cross tenants
    priority: int  # larger = lower priority in vLLM's priority scheduler; replay uses a high value
    request_id: str


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    prompt_tokens: int
    cached_prompt_tokens: int
    duration_ms: float


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A snapshot of an engine's own counters (vLLM's Prometheus names in comments)."""

    prompt_tokens_total: float  # vllm:prompt_tokens_total
    generation_tokens_total: float  # vllm:generation_tokens_total
    num_requests_running: float  # vllm:num_requests_running
    num_requests_waiting: float  # vllm:num_requests_waiting
    prefix_cache_queries_total: float  # vllm:prefix_cache_queries_total (tokens)
    prefix_cache_hits_total: float  # vllm:prefix_cache_hits_total (tokens)
