"""The replay worker: pull a job when the engine has spare, prefill the transcript, report.

One worker serves one engine and is one member of its region's worker group. Each of its
``concurrency`` slots loops: wait until the spare gate says the engine can take a small probe
of prompt tokens; pull one job; then

1. past its deadline -> result ``expired``;
2. for a model revision the engine does not serve -> result ``wrong_model``; the job is first
   *published again* to the region's topic (same key, so it stays in the conversation's order),
   then the original is committed. A worker that serves the revision picks the copy up; the
   job's deadline bounds how often workers of other revisions can bounce it. (Committing without
   the copy would lose the job; not committing would stall the partition's offset behind it.)
3. wait for spare for the job's estimated tokens (bounded by the deadline -> ``expired``), fetch
   the transcript through ``through_seq``, render it as the live path's chat messages, send a
   prefill-only request at low priority with the tenant's ``cache_salt`` -> ``replayed``;
   retryable errors are retried under a budget with jittered backoff, then -> ``failed``.

The result is published, then the job is finished (its offset may be committed). A result that
cannot be published is logged and the job still finished: the KV is warm either way and results
are hints. Stopping lets running jobs finish for ``drain_timeout_s``, then abandons them without
finishing them, so the bus redelivers them to another worker; a crash does the same.

Rendering (``replay.chat.render_prompt``): the transcript's messages as the application sent
them (tool calls and tool results included) with the conversation's ``tools``, chat template and
kwargs, sent with the tenant's keyed ``cache_salt`` (``replay.cache_salt``) and the pinned model
revision: the exact request the live path will send, so its prefix is a cache hit.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from eventlog.aio import cancel_quietly
from eventlog.backoff import Backoff, jittered
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError, DeadlineExceeded
from replay.bus.port import JobBus, JobBusUnavailable, JobConsumer, JobDelivery
from replay.bus.trace_context import job_span
from replay.cache_salt import cache_salt_for
from replay.chat import render_prompt, replay_pieces
from replay.engines.base import InferenceEngine, ModelRevisionMismatch
from replay.engines.vllm_check import PRIORITY_SCHEDULING, SERVES_REVISION
from replay.model import (
    EngineCheck,
    EngineFitness,
    EngineProblem,
    EngineRequests,
    PrefillOutcome,
    PrefillRequest,
    ReplayJob,
    ReplayResult,
    ReplayStatus,
)
from replay.transcripts import TranscriptSource

log = logging.getLogger(__name__)
T = TypeVar("T")


class SpareGate(Protocol):
    """The engine's spare prefill capacity for replay (``replay.capacity.CapacityController``
    behind a thin adapter: ``replay.capacity.CapacityGate``)."""

    def has_spare(self, prompt_tokens: int) -> bool:
        """Whether the engine could take ``prompt_tokens`` of replay now (reserves nothing)."""

    async def wait_for_spare(self, prompt_tokens: int, tenant_id: str, deadline_s: float) -> None:
        """Return once ``prompt_tokens`` are granted; raise ``DeadlineExceeded`` at ``deadline_s``
        (a ``Clock.monotonic()`` instant). Every grant is followed by one ``release``."""

    def release(self, computed_tokens: int | None) -> None:
        """A granted replay ended; ``computed_tokens`` = prompt - cached, None if unknown."""

    def set_priority_verified(self, verified: bool) -> None:
        """Whether the engine is known to schedule replay behind live requests; when not,
        replay takes a smaller share of the spare (``CapacityConfig``)."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    concurrency: int = 2  # jobs in flight on this worker
    pull_probe_tokens: int = 256  # spare the engine must have before a slot pulls at all
    idle_poll_s: float = 0.5
    transcript_timeout_s: float = 10.0
    prefill_timeout_s: float = 120.0
    publish_timeout_s: float = 10.0
    attempts_max: int = 3  # per step (transcript, prefill, republish)
    backoff_base_s: float = 0.2
    backoff_max_s: float = 5.0
    replay_priority: int = 100  # larger = lower priority in vLLM's priority scheduler
    #: the operator declares the engine runs ``--scheduling-policy priority``: it counts where
    #: the self-check's priority probe cannot tell (``vllm_check``), never over a failed one
    priority_declared: bool = False
    drain_timeout_s: float = 30.0
    reroute_pause_s: float = 1.0  # before re-publishing a wrong_model job: bounds bouncing
    check_timeout_s: float = 60.0  # the engine self-check, all probes
    #: a replay goes out in message prefixes adding about this many tokens each
    #: (``replay_pieces``): about half the engine's scheduler step (vLLM's
    #: ``max_num_batched_tokens``; bench/replay.py: 256 with 512-token steps); 0 = whole
    piece_tokens_max: int = 1024
    #: an unfit engine is checked again after this; where it was reachable and the probes ran,
    #: doubling per failed check up to ``recheck_max_s`` (the priority probe queues work on
    #: the engine, ahead of live requests on an FCFS one)
    recheck_s: float = 30.0
    recheck_max_s: float = 600.0


class _JobExpired(Exception):
    pass


class ReplayWorker:
    def __init__(
        self,
        worker_id: str,
        region: str,
        bus: JobBus,
        engine: InferenceEngine,
        transcripts: TranscriptSource,
        spare_gate: SpareGate,
        clock: Clock,
        rng: random.Random,
        settings: WorkerConfig | None = None,
        *,
        cache_salt_key: bytes,
    ) -> None:
        self.worker_id = worker_id
        self._cache_salt_key = cache_salt_key  # the cluster's salt key (replay.cache_salt)
        self.region = region
        self._bus = bus
        self._engine = engine
        self._transcripts = transcripts
        self._gate = spare_gate
        self._clock = clock
        self._rng = rng
        self.settings = settings or WorkerConfig()
        self._stopping = asyncio.Event()
        self.counts: Counter[str] = Counter()  # pulled and per-status totals
        self.consumer: JobConsumer | None = None  # while running (tests and metrics look at it)
        self.engine_fitness: EngineFitness | None = None  # None: not checked yet

    @property
    def engine_id(self) -> str:
        return self._engine.engine_id

    @property
    def engine_problems(self) -> list[EngineProblem] | None:
        """The self-check's failed checks ([] = fit; None: not checked yet)."""
        return None if self.engine_fitness is None else self.engine_fitness.problems

    def request_stop(self) -> None:
        """Stop pulling; running jobs get ``drain_timeout_s`` to finish."""
        self._stopping.set()

    async def run(self) -> None:
        """Serve until ``request_stop``; cancelling this task abandons running jobs. Joins the
        worker group only once the engine passes its self-check (``engine_fit``)."""
        if not await self.engine_fit():
            return
        consumer = self._bus.job_consumer(self.region, in_flight_max=self.settings.concurrency)
        await consumer.start()
        self.consumer = consumer
        slots = [
            asyncio.create_task(self._slot(consumer), name=f"{self.worker_id}-slot{i}")
            for i in range(self.settings.concurrency)
        ]
        stop = asyncio.create_task(self._stopping.wait())
        try:
            # A slot only ends early when it hit a bug; then the whole worker stops.
            await asyncio.wait([stop, *slots], return_when=asyncio.FIRST_COMPLETED)
            self._stopping.set()
            _done, running = await asyncio.wait(slots, timeout=self.settings.drain_timeout_s)
            if running:
                log.warning("%s: abandoning %d running jobs", self.worker_id, len(running))
        finally:
            stop.cancel()
            for slot in slots:
                slot.cancel()
            await asyncio.gather(stop, *slots, return_exceptions=True)
            await consumer.close()  # finished jobs committed; abandoned ones redelivered
        for slot in slots:  # a slot that died of a bug (InvariantViolation): surface it
            error = None if slot.cancelled() else slot.exception()
            if error is not None:
                raise error

    async def engine_fit(self) -> bool:
        """Run the engine's self-check (``InferenceEngine.self_check``) until it passes (True)
        or the worker is stopped (False), checking again after ``recheck_s`` (doubling up to
        ``recheck_max_s`` while the engine is reachable and the probes run on it). While it fails the worker takes no job (it does not even join the
        group, so no partition waits on it); ``engine_fitness`` says why, and
        the reason is logged each time it changes. A fit engine whose priority scheduling is
        unverified gets a smaller share of its spare (``SpareGate.set_priority_verified``)."""
        s = self.settings
        recheck_s = s.recheck_s
        while not self._stopping.is_set():
            try:
                fitness = await asyncio.wait_for(
                    self._engine.self_check(
                        s.replay_priority, priority_declared=s.priority_declared
                    ),
                    s.check_timeout_s,
                )
            except TimeoutError:
                timed_out = EngineCheck("self_check", "failed", "self-check timed out")
                fitness = EngineFitness((timed_out,))
            if fitness != self.engine_fitness:
                for check in fitness.checks:
                    if check.verdict != "passed":
                        log.log(
                            logging.ERROR if check.verdict == "failed" else logging.WARNING,
                            "%s: engine %s check %s %s: %s",
                            self.worker_id,
                            self._engine.engine_id,
                            check.name,
                            check.verdict,
                            check.reason,
                        )
            self.engine_fitness = fitness
            if fitness.fit:
                self._gate.set_priority_verified(
                    fitness.verdict(PRIORITY_SCHEDULING) in (None, "passed")
                )
                return True
            self.counts["engine_check_failed"] += 1
            pause = asyncio.create_task(self._clock.sleep(recheck_s))
            if fitness.verdict(SERVES_REVISION) == "passed":  # the probes ran on it
                recheck_s = min(recheck_s * 2, max(s.recheck_max_s, s.recheck_s))
            else:  # unreachable, starting, another model: nothing was sent, look again soon
                recheck_s = s.recheck_s
            stop = asyncio.create_task(self._stopping.wait())
            await asyncio.wait([pause, stop], return_when=asyncio.FIRST_COMPLETED)
            for task in (pause, stop):
                await cancel_quietly(task)
        return False

    async def _slot(self, consumer: JobConsumer) -> None:
        s = self.settings
        while not self._stopping.is_set():
            if not self._gate.has_spare(s.pull_probe_tokens):
                await self._clock.sleep(s.idle_poll_s)
                continue
            try:
                delivery = await consumer.next_job(s.idle_poll_s)
            except JobBusUnavailable as exc:
                log.warning("%s: pull failed: %s", self.worker_id, exc)
                await self._clock.sleep(self._backoff().next_s())
                continue
            if delivery is None:
                continue
            self.counts["pulled"] += 1
            await self._handle(consumer, delivery)

    async def _handle(self, consumer: JobConsumer, delivery: JobDelivery) -> None:
        attributes = {"convplane.region": delivery.job.region, "convplane.worker": self.worker_id}
        with job_span(delivery.trace_headers, attributes):
            result = await self.process(delivery.job)
        self.counts[result.status] += 1
        try:
            await asyncio.wait_for(
                self._bus.publish_result(result), self.settings.publish_timeout_s
            )
        except (ConvplaneError, TimeoutError) as exc:
            log.error("%s: result of %s not published: %s", self.worker_id, result.job_id, exc)
        try:
            await consumer.finish(delivery)
        except JobBusUnavailable as exc:  # not committed: the job may run again, harmlessly
            log.warning("%s: finish %s failed: %s", self.worker_id, result.job_id, exc)

    async def process(self, job: ReplayJob) -> ReplayResult:
        """Run one job to a result. Never raises a ConvplaneError (they become ``failed``)."""
        started_s = self._clock.monotonic()
        if self._clock.wall_ms() >= job.deadline_ms:
            return self._result(job, "expired", started_s)
        if job.model_revision != self._engine.model_revision:
            return await self._reroute(job, started_s)
        try:
            outcome, requests = await self._replay(job)
        except _JobExpired:
            return self._result(job, "expired", started_s)
        except ModelRevisionMismatch:
            return await self._reroute(job, started_s)
        except ConvplaneError as exc:
            log.warning("%s: job %s failed: %s", self.worker_id, job.job_id, exc)
            return self._result(job, "failed", started_s)
        return replace(
            self._result(job, "replayed", started_s, outcome),
            request_ms=requests.request_ms,
            queried_tokens=requests.queried_tokens,
            hit_tokens=requests.hit_tokens,
        )

    async def _replay(self, job: ReplayJob) -> tuple[PrefillOutcome, EngineRequests]:
        s = self.settings
        remaining_s = max((job.deadline_ms - self._clock.wall_ms()) / 1000, 0.0)
        try:
            await asyncio.wait_for(
                self._gate.wait_for_spare(
                    job.estimated_prompt_tokens,
                    job.tenant_id,
                    self._clock.monotonic() + remaining_s,
                ),
                remaining_s + 1.0,  # the gate's own deadline should fire first; this is a net
            )
        except (TimeoutError, DeadlineExceeded) as exc:
            raise _JobExpired from exc
        computed_tokens: int | None = None
        try:
            events = await self._retrying(
                job,
                lambda: self._transcripts.fetch(
                    job.tenant_id, job.conversation_id, job.through_seq, job.read_grant
                ),
                s.transcript_timeout_s,
            )
            salt = cache_salt_for(self._cache_salt_key, job.tenant_id)
            computed = 0
            requests = EngineRequests()
            for prompt in replay_pieces(render_prompt(events), s.piece_tokens_max):
                request = PrefillRequest(
                    model=job.model_revision,
                    prompt=prompt,
                    cache_salt=salt,
                    priority=s.replay_priority,
                    request_id=f"replay-{job.job_id}-{self._rng.getrandbits(32):08x}",
                )
                outcome = await self._retrying(
                    job,
                    lambda request=request: self._engine.prefill(request),  # type: ignore[misc]
                    s.prefill_timeout_s,
                )
                computed += outcome.prompt_tokens - outcome.cached_prompt_tokens
                requests = requests.plus(outcome)
            computed_tokens = computed
            # the whole prompt; cached = what was there before this replay computed the rest
            whole = PrefillOutcome(
                outcome.prompt_tokens,
                max(outcome.prompt_tokens - computed, 0),
                outcome.duration_ms,
                outcome.cached_reported,
            )
            return whole, requests
        finally:
            self._gate.release(computed_tokens)

    async def _retrying(
        self, job: ReplayJob, call: Callable[[], Awaitable[T]], timeout_s: float
    ) -> T:
        """Retry retryable errors and timeouts under the attempt budget and the job's deadline."""
        attempt = 0
        backoff = self._backoff()
        while True:
            attempt += 1
            try:
                return await asyncio.wait_for(call(), timeout_s)
            except (ConvplaneError, TimeoutError) as exc:
                retryable = isinstance(exc, TimeoutError) or exc.retryable
                if isinstance(exc, ModelRevisionMismatch) or not retryable:
                    raise
                if attempt >= self.settings.attempts_max:
                    raise DeadlineExceeded(f"gave up after {attempt} attempts: {exc}") from exc
                delay_s = backoff.next_s()
                if isinstance(exc, ConvplaneError) and exc.retry_after_s is not None:
                    delay_s = max(delay_s, exc.retry_after_s)
                if self._clock.wall_ms() + delay_s * 1000 >= job.deadline_ms:
                    raise _JobExpired from exc
                await self._clock.sleep(delay_s)

    async def _reroute(self, job: ReplayJob, started_s: float) -> ReplayResult:
        """Put the job back on the bus for a worker that serves its revision (module docstring)."""
        await self._clock.sleep(jittered(self.settings.reroute_pause_s, self._rng, 0.5, 0.5))
        try:
            await self._retrying(
                job, lambda: self._bus.publish_jobs([job]), self.settings.publish_timeout_s
            )
        except _JobExpired:
            return self._result(job, "expired", started_s)
        except ConvplaneError as exc:
            log.error("%s: could not re-publish %s: %s", self.worker_id, job.job_id, exc)
            return self._result(job, "failed", started_s)
        return self._result(job, "wrong_model", started_s)

    def _backoff(self) -> Backoff:
        """A retry's waits: ``backoff_base_s`` doubling up to ``backoff_max_s``, each jittered
        down to half."""
        s = self.settings
        return Backoff(min(s.backoff_base_s, s.backoff_max_s), s.backoff_max_s, self._rng, 0.5, 0.5)

    def _result(
        self,
        job: ReplayJob,
        status: ReplayStatus,
        started_s: float,
        outcome: PrefillOutcome | None = None,
    ) -> ReplayResult:
        return ReplayResult(
            job_id=job.job_id,
            region=job.region,
            tenant_id=job.tenant_id,
            conversation_id=job.conversation_id,
            model_revision=job.model_revision,
            status=status,
            worker_id=self.worker_id,
            engine_id=self._engine.engine_id,
            prompt_tokens=outcome.prompt_tokens if outcome else 0,
            cached_prompt_tokens=outcome.cached_prompt_tokens if outcome else 0,
            duration_ms=(self._clock.monotonic() - started_s) * 1000,
            finished_at_ms=self._clock.wall_ms(),
        )
