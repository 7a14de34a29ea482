"""Replay scheduler core (pure): which moved conversations to replay, in what order, and when.

Input: the conversations whose shards moved to this region (``MovedConversation``). Kept are
those active within ``replay_window_s`` (now - last activity <= window); the rest are counted
(``outside_window``) and dropped: their KV would most likely be evicted before their next turn.

Order (the exact rule):

1. **Across tenants: weighted fair queuing by tokens** (start-time fair queuing). Each tenant
   with queued jobs has a virtual start tag ``S``; the next job comes from the tenant with the
   smallest ``S`` (ties: tenant id). Dispatching a job of ``n`` estimated tokens moves that
   tenant's tag to ``S + n / weight`` (weight from ``tenant_weights``, default 1). A tenant that
   becomes backlogged starts at ``max(its last tag, V)`` where ``V`` is the start tag of the last
   dispatched job, so idle time earns no credit. Over any busy interval backlogged tenants get
   replay tokens in proportion to their weights (within one job's tokens).
2. **Within a tenant: most recently active first** (``last_activity_ms`` descending, ties by
   conversation id): the conversations most likely to get their next turn soon are warmed first.

``mark_live(tenant_id, conversation_id)`` drops a queued job (the live prefill rebuilds the KV
anyway). Conversations are keyed by tenant and id (ids are namespaced by tenant, see
``eventlog.conversations``): two tenants' conversations with one id are two jobs.
A job expires at ``min(last_activity + replay_window, enqueued + job_ttl_s)``; expired jobs are
dropped (counted) when met at the head or by ``expire()``. ``dispatch`` releases jobs only as
the capacity grant function allows: a tenant over its own limit is skipped for that call, any
other denial stops the call. The backlog holds at most ``backlog_max`` conversations: a batch is
taken most recent first and what does not fit is counted in ``rejected_full``.

Time comes from the injected ``Clock`` (``wall_ms``: job deadlines are wall-clock instants).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from eventlog.clock import Clock
from eventlog.errors import InvariantViolation
from replay.capacity import Grant
from replay.model import ReplayJob, ReplayResult

AcquireFn = Callable[[int, str], Grant]


@dataclass(frozen=True, slots=True)
class MovedConversation:
    tenant_id: str
    conversation_id: str
    model_revision: str
    last_activity_ms: int
    estimated_prompt_tokens: int
    through_seq: int


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    region: str
    replay_window_s: float = 3600.0
    job_ttl_s: float = 1800.0
    backlog_max: int = 200_000
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    rate_window_s: float = 10.0
    rate_samples_max: int = 100_000


@dataclass(frozen=True, slots=True)
class AddReport:
    accepted: int
    outside_window: int
    rejected_full: int
    superseded: int  # already queued: replaced by the newer entry (or the newer one kept)


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    backlog_sessions: int
    backlog_tokens: int
    dispatched_total: int
    replayed_total: int
    replayed_tokens_total: int
    replayed_tokens_per_s: float
    expired_total: int
    cancelled_live_total: int
    rejected_full_total: int
    outside_window_total: int


@dataclass(slots=True)
class _Tenant:
    weight: float
    heap: list[tuple[int, str]] = field(default_factory=list)  # (-last_activity_ms, conv id)
    start_tag: float = 0.0
    backlogged: bool = False


class ReplayScheduler:
    def __init__(self, config: SchedulerConfig, clock: Clock) -> None:
        if config.backlog_max <= 0 or config.replay_window_s <= 0:
            raise InvariantViolation("backlog_max and replay_window_s must be positive")
        self.config = config
        self._clock = clock
        self._jobs: dict[tuple[str, str], ReplayJob] = {}  # (tenant_id, conversation_id)
        self._tenants: dict[str, _Tenant] = {}
        self._virtual_time = 0.0
        self._backlog_tokens = 0
        self._replayed: deque[tuple[int, int]] = deque(maxlen=config.rate_samples_max)
        self.dispatched_total = 0
        self.replayed_total = 0
        self.replayed_tokens_total = 0
        self.expired_total = 0
        self.cancelled_live_total = 0
        self.rejected_full_total = 0
        self.outside_window_total = 0

    # --- input -------------------------------------------------------------------------------

    def add_moved(self, conversations: Iterable[MovedConversation]) -> AddReport:
        now_ms = self._clock.wall_ms()
        window_ms = int(self.config.replay_window_s * 1000)
        ttl_ms = int(self.config.job_ttl_s * 1000)
        offered = list(conversations)
        fresh = [c for c in offered if now_ms - c.last_activity_ms <= window_ms]
        outside = len(offered) - len(fresh)
        accepted = rejected = superseded = 0
        fresh.sort(key=lambda c: (-c.last_activity_ms, c.conversation_id, c.tenant_id))
        for moved in fresh:
            old = self._jobs.get((moved.tenant_id, moved.conversation_id))
            if old is not None:
                superseded += 1
                if old.through_seq >= moved.through_seq:
                    continue
                self._drop(old)
            elif len(self._jobs) >= self.config.backlog_max:
                rejected += 1
                continue
            deadline_ms = min(moved.last_activity_ms + window_ms, now_ms + ttl_ms)
            self._enqueue(self._job(moved, deadline_ms), now_ms)
            accepted += old is None
        self.rejected_full_total += rejected
        self.outside_window_total += outside
        return AddReport(accepted, outside, rejected, superseded)

    def mark_live(self, tenant_id: str, conversation_id: str) -> bool:
        """A live request arrived: drop the queued job. False if none was queued."""
        job = self._jobs.get((tenant_id, conversation_id))
        if job is None:
            return False
        self._drop(job)
        self.cancelled_live_total += 1
        return True

    def record_result(self, result: ReplayResult) -> None:
        if result.status != "replayed":
            return
        self.replayed_total += 1
        self.replayed_tokens_total += result.prompt_tokens
        self._replayed.append((self._clock.wall_ms(), result.prompt_tokens))

    # --- output ------------------------------------------------------------------------------

    def dispatch(self, acquire: AcquireFn, max_jobs: int) -> list[ReplayJob]:
        """Up to ``max_jobs`` next jobs, each granted by ``acquire(tokens, tenant)``."""
        now_ms = self._clock.wall_ms()
        out: list[ReplayJob] = []
        skipped: set[str] = set()
        while len(out) < max_jobs:
            tenant_id = self._next_tenant(now_ms, skipped)
            if tenant_id is None:
                break
            tenant = self._tenants[tenant_id]
            job = self._jobs[(tenant_id, tenant.heap[0][1])]
            grant = acquire(job.estimated_prompt_tokens, tenant_id)
            if grant is Grant.TENANT_LIMIT:
                skipped.add(tenant_id)
                continue
            if grant is not Grant.GRANTED:
                break
            heapq.heappop(tenant.heap)
            self._forget(job)
            self._virtual_time = tenant.start_tag
            tenant.start_tag += job.estimated_prompt_tokens / tenant.weight
            self.dispatched_total += 1
            out.append(job)
        return out

    def expire(self) -> int:
        now_ms = self._clock.wall_ms()
        expired = [job for job in self._jobs.values() if job.deadline_ms < now_ms]
        for job in expired:
            self._drop(job)
        self.expired_total += len(expired)
        return len(expired)

    def snapshot(self) -> SchedulerSnapshot:
        now_ms = self._clock.wall_ms()
        window_ms = int(self.config.rate_window_s * 1000)
        while self._replayed and self._replayed[0][0] < now_ms - window_ms:
            self._replayed.popleft()
        recent_tokens = sum(tokens for _, tokens in self._replayed)
        return SchedulerSnapshot(
            backlog_sessions=len(self._jobs),
            backlog_tokens=self._backlog_tokens,
            dispatched_total=self.dispatched_total,
            replayed_total=self.replayed_total,
            replayed_tokens_total=self.replayed_tokens_total,
            replayed_tokens_per_s=recent_tokens / self.config.rate_window_s,
            expired_total=self.expired_total,
            cancelled_live_total=self.cancelled_live_total,
            rejected_full_total=self.rejected_full_total,
            outside_window_total=self.outside_window_total,
        )

    # --- internals ---------------------------------------------------------------------------

    def _job(self, moved: MovedConversation, deadline_ms: int) -> ReplayJob:
        return ReplayJob(
            job_id=f"{self.config.region}/{moved.tenant_id}/{moved.conversation_id}/"
            f"{moved.through_seq}",
            region=self.config.region,
            tenant_id=moved.tenant_id,
            conversation_id=moved.conversation_id,
            model_revision=moved.model_revision,
            estimated_prompt_tokens=max(1, moved.estimated_prompt_tokens),
            last_activity_ms=moved.last_activity_ms,
            deadline_ms=deadline_ms,
            through_seq=moved.through_seq,
        )

    def _enqueue(self, job: ReplayJob, now_ms: int) -> None:
        tenant = self._tenants.get(job.tenant_id)
        if tenant is None:
            weight = self.config.tenant_weights.get(job.tenant_id, 1.0)
            if weight <= 0:
                raise InvariantViolation(f"tenant weight must be > 0: {job.tenant_id}")
            tenant = self._tenants[job.tenant_id] = _Tenant(weight)
        self._clean_head(job.tenant_id, tenant, now_ms)
        if not tenant.backlogged:
            tenant.backlogged = True
            tenant.start_tag = max(tenant.start_tag, self._virtual_time)
        heapq.heappush(tenant.heap, (-job.last_activity_ms, job.conversation_id))
        self._jobs[(job.tenant_id, job.conversation_id)] = job
        self._backlog_tokens += job.estimated_prompt_tokens

    def _forget(self, job: ReplayJob) -> None:
        del self._jobs[(job.tenant_id, job.conversation_id)]
        self._backlog_tokens -= job.estimated_prompt_tokens

    def _drop(self, job: ReplayJob) -> None:
        """Remove a queued job; its heap entry is discarded lazily (``_clean_head``)."""
        self._forget(job)

    def _clean_head(self, tenant_id: str, tenant: _Tenant, now_ms: int) -> None:
        while tenant.heap:
            neg_activity, conversation_id = tenant.heap[0]
            job = self._jobs.get((tenant_id, conversation_id))
            if job is not None and job.last_activity_ms == -neg_activity:
                if job.deadline_ms >= now_ms:
                    return
                self._forget(job)
                self.expired_total += 1
            heapq.heappop(tenant.heap)
        tenant.backlogged = False

    def _next_tenant(self, now_ms: int, skipped: set[str]) -> str | None:
        best: str | None = None
        best_tag = 0.0
        for tenant_id, tenant in self._tenants.items():
            if not tenant.backlogged or tenant_id in skipped:
                continue
            self._clean_head(tenant_id, tenant, now_ms)
            if not tenant.backlogged:
                continue
            if best is None or (tenant.start_tag, tenant_id) < (best_tag, best):
                best, best_tag = tenant_id, tenant.start_tag
        return best
