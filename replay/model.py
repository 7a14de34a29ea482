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
    #: lets a worker read this one transcript until ``deadline_ms`` (``replay.read_grant``);
    #: signed by the node that dispatched the job
    read_grant: str = ""


def message_key(tenant_id: str, conversation_id: str) -> bytes:
    """A job's or result's Kafka key: one conversation's records on one partition. Conversation
    ids are namespaced by tenant, so the key names both (the bus's ids have no ``/``)."""
    return f"{tenant_id}/{conversation_id}".encode()


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
    #: the engine requests of a ``replayed`` job (one per piece, ``replay.chat.replay_pieces``):
    #: each one's time to its answer (ms), and the prompt tokens they queried and found cached.
    #: The engine's TTFT histogram and prefix-cache counters count them all; a drill takes them
    #: off to see the live requests. Empty and 0 from workers older than these fields.
    request_ms: tuple[float, ...] = ()
    queried_tokens: int = 0
    hit_tokens: int = 0


#: the most engine requests one result describes (a transcript cut in more pieces than this
#: reports its first ones)
RESULT_REQUESTS_MAX = 256


@dataclass(frozen=True, slots=True)
class EngineRequests:
    """What a replay's prefill requests were, as ``ReplayResult`` reports them."""

    request_ms: tuple[float, ...] = ()
    queried_tokens: int = 0
    hit_tokens: int = 0

    def plus(self, outcome: PrefillOutcome) -> EngineRequests:
        return EngineRequests(
            (*self.request_ms, outcome.duration_ms)[:RESULT_REQUESTS_MAX],
            self.queried_tokens + outcome.prompt_tokens,
            self.hit_tokens + outcome.cached_prompt_tokens,
        )


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
    cached_prompt_tokens: int  # 0 when the engine does not report it (see cached_reported)
    duration_ms: float
    cached_reported: bool = True  # vLLM reports cached tokens only with prompt_tokens_details


@dataclass(frozen=True, slots=True)
class EngineProblem:
    """A self-check that failed (``EngineFitness.problems``): its check name and why."""

    code: str  # the failed check's name (``replay.engines.vllm_check.CHECKS``)
    message: str


CheckVerdict = Literal["passed", "failed", "unverified"]


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """One finding of the replay self-check. ``unverified``: its probe could not tell (or could
    not run) and the operator did not declare it; it does not make the engine unfit."""

    name: str
    verdict: CheckVerdict
    reason: str = ""  # why, for every verdict but ``passed``


@dataclass(frozen=True, slots=True)
class EngineFitness:
    """The replay self-check of one engine (``InferenceEngine.self_check``): fit when no check
    failed."""

    checks: tuple[EngineCheck, ...]

    @property
    def fit(self) -> bool:
        return all(check.verdict != "failed" for check in self.checks)

    @property
    def problems(self) -> list[EngineProblem]:
        return [EngineProblem(c.name, c.reason) for c in self.checks if c.verdict == "failed"]

    def verdict(self, name: str) -> CheckVerdict | None:
        return next((c.verdict for c in self.checks if c.name == name), None)

    def verdicts(self) -> dict[str, CheckVerdict]:
        return {c.name: c.verdict for c in self.checks}

    def reasons(self) -> dict[str, str]:
        """Why, for each check not passed."""
        return {c.name: c.reason for c in self.checks if c.verdict != "passed"}

    def as_json(self) -> dict[str, object]:
        """``convplane worker --check --json``: fit, each check's verdict, the reasons."""
        return {"fit": self.fit, "checks": self.verdicts(), "reasons": self.reasons()}


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A snapshot of an engine's own counters (vLLM's Prometheus names in comments).

    The first four are required (an engine without them is "unknown": no replay); the others
    are None when the server does not export them (prefix caching off, an older vLLM)."""

    prompt_tokens_total: float  # vllm:prompt_tokens_total (counted at a request's first output)
    generation_tokens_total: float  # vllm:generation_tokens_total
    num_requests_running: float  # vllm:num_requests_running
    num_requests_waiting: float  # vllm:num_requests_waiting
    # vllm:prefix_cache_queries_total / _hits_total (tokens), counted when a request is
    # *scheduled*: under chunked prefill they run ahead of prompt_tokens_total
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    # vllm:prompt_tokens_by_source_total{source="local_compute"}: prompt tokens this engine
    # computed, counted with prompt_tokens_total (the live-demand series; newer vLLM only)
    computed_prompt_tokens_total: float | None = None
    kv_cache_usage_perc: float | None = None  # vllm:kv_cache_usage_perc (0..1)
    #: vllm:time_to_first_token_seconds_bucket: (upper bound s, requests at most that long),
    #: cumulative, bounds increasing, the last ``+Inf`` (every request); every request counts,
    #: replay's prefills included
    ttft_buckets: tuple[tuple[float, float], ...] | None = None

    def counters(self) -> tuple[float, ...]:
        """Every counter, for restart detection: a counter going down means a restart."""
        values = (
            self.prompt_tokens_total,
            self.generation_tokens_total,
            self.prefix_cache_queries_total,
            self.prefix_cache_hits_total,
            self.computed_prompt_tokens_total,
        )
        return tuple(v if v is not None else 0.0 for v in values)
