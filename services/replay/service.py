"""The region's replay service: the async adapter around the pure ``ReplayScheduler``.

* **Listener** (``eventlog.node.LogListener``): ``shard_led`` with a previous leader in another
  region means the shard moved here: the shard goes on a bounded queue and the lister lists its
  conversations active within the replay window (``moved.MovedConversationLister``) into the scheduler.
  ``conversation_written`` calls ``mark_live``: the live prefill rebuilds the KV anyway.
* **Dispatch loop**: expires old jobs, then releases jobs only as the region's spare capacity and
  the operator limits grant (``region_capacity.RegionCapacity``) and publishes them to the
  region's job bus. A grant is held until the job's result arrives (or its deadline passed).
* **Results loop**: every result of this region frees its grant, feeds the scheduler's counters
  and (``replayed``) the KV affinity table the router reads.
* **Workers**: in embedded mode the node runs one ``ReplayWorker`` per engine on the in-process
  bus; with Kafka they are external ``convplane worker`` processes.

A loop that hits an expected failure (bus or replica unavailable) backs off with jitter and goes
on; an ``InvariantViolation`` ends the loop (logged), never the node: the log keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from eventlog.backoff import Backoff, jittered
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError, NotFound, NotLeader
from replay import read_grant
from replay.affinity import Affinity, AffinityTable
from replay.bus.port import JobBus, ResultStream
from replay.drill_tally import DrillTally, histogram_body
from replay.model import ReplayJob, ReplayResult
from replay.scheduler import AddReport, MovedConversation, ReplayScheduler, SchedulerConfig
from replay.worker import ReplayWorker
from services.replay.config import ReplayConfig
from services.replay.moved import MovedConversationLister
from services.replay.region_capacity import RegionCapacity

log = logging.getLogger("convplane.replay")

#: results that end a job (``wrong_model`` does not: the job went back on the bus)
#: model revisions named in status as unserved (the rest are counted only)
UNSERVED_REVISIONS_SHOWN_MAX = 20
TERMINAL_STATUSES = frozenset({"replayed", "skipped_live", "expired", "failed"})


@dataclass(frozen=True, slots=True)
class ReplayServiceConfig:
    dispatch_interval_s: float = 0.05
    dispatch_batch_max: int = 64
    publish_timeout_s: float = 10.0
    result_poll_s: float = 0.5
    moved_shards_max: int = 65_537  # every shard of the largest cluster, once
    plan_attempts_max: int = 3
    backoff_base_s: float = 0.2
    backoff_max_s: float = 5.0
    outstanding_grace_ms: int = 5_000  # after a job's deadline, its grant is given back
    worker_drain_timeout_s: float = 2.0


class ReplayService:
    def __init__(
        self,
        *,
        region: str,
        shard_count: int,
        config: ReplayConfig,
        lister: MovedConversationLister,
        bus: JobBus,
        capacity: RegionCapacity,
        clock: Clock,
        rng: random.Random,
        workers: Sequence[ReplayWorker] = (),
        engine_urls: Mapping[str, str] | None = None,
        mode: str = "embedded",
        limits: ReplayServiceConfig | None = None,
        read_grant_key: bytes,
    ) -> None:
        self.region = region
        self._read_grant_key = read_grant_key
        self.shard_count = shard_count
        self.config = config
        self.mode = mode
        self.lister = lister
        self.capacity = capacity
        self.workers = list(workers)
        self.engine_urls = dict(engine_urls or {})
        self.limits = limits or ReplayServiceConfig()
        self.scheduler = ReplayScheduler(
            SchedulerConfig(
                region=region,
                replay_window_s=config.replay_window_s,
                job_ttl_s=config.job_ttl_s,
                backlog_max=config.backlog_max,
                tenant_weights=dict(config.tenant_weights),
            ),
            clock,
        )
        self.affinity = AffinityTable(config.affinity_max)
        self.counts: Counter[str] = Counter()  # moved shards, publish failures, results, ...
        self._bus = bus
        self._clock = clock
        self._rng = rng
        self._moved: asyncio.Queue[int] = asyncio.Queue(self.limits.moved_shards_max)
        self._moved_pending: set[int] = set()
        self._outstanding: dict[str, int] = {}  # dispatched job id -> its deadline (wall ms)
        self._tasks: list[asyncio.Task[None]] = []
        self._worker_tasks: list[asyncio.Task[None]] = []
        self._stream: ResultStream | None = None
        self._bus_started = False
        #: called with every result of this region's jobs (metrics: services.control.node_metrics)
        self.result_listeners: list[Callable[[ReplayResult], None]] = []
        #: wall-clock ms of the last conversation replayed here (a drill's replay makespan)
        self.last_replayed_at_ms: int | None = None
        #: model revisions of moved conversations that no engine here serves, with counts
        #: (at most UNSERVED_REVISIONS_SHOWN_MAX revisions)
        self.unserved_model_revisions: Counter[str] = Counter()
        #: replay's own prefills and when moved conversations turned warm, for drills
        self.drill_tally = DrillTally()

    # --- LogListener ----------------------------------------------------------------------

    def shard_led(self, shard: int, epoch: int, previous_region: str | None) -> None:
        if shard >= self.shard_count or previous_region in (None, self.region):
            return  # the control shard, a shard this region already led, or unknown history
        self.counts["shards_moved_here"] += 1
        self.drill_tally.moved_here(self._clock.wall_ms())
        self.request_shard(shard)

    def conversation_written(self, tenant_id: str, conversation_id: str, event_type: str) -> None:
        if self.scheduler.mark_live(tenant_id, conversation_id):
            # a live turn of a moved conversation still queued: its own prefill warms it (one
            # already dispatched counts when its result comes, replayed or skipped_live)
            self.drill_tally.warmed(self._clock.wall_ms())

    # --- operator -------------------------------------------------------------------------

    def request_shard(self, shard: int) -> bool:
        """Queue the shard for planning (False: already queued, or the queue is full)."""
        if shard in self._moved_pending:
            return False
        try:
            self._moved.put_nowait(shard)
        except asyncio.QueueFull:
            self.counts["moved_shards_dropped"] += 1
            return False
        self._moved_pending.add(shard)
        return True

    async def replay_shard(self, shard: int) -> AddReport:
        """Plan a shard now (it must be led here); ``NotLeader`` otherwise."""
        moved = await self.lister.moved_conversations(shard)
        return self._add(moved)

    async def replay_conversations(
        self, tenant_id: str, conversation_ids: Sequence[str]
    ) -> dict[str, str]:
        """Queue each of the tenant's conversations led here; returns conversation id -> what
        happened (ids are namespaced by tenant: another tenant's id is ``not_found``)."""
        outcome: dict[str, str] = {}
        for conversation_id in conversation_ids:
            try:
                moved = await self.lister.conversation(tenant_id, conversation_id)
            except NotLeader as exc:
                outcome[conversation_id] = f"not_led_here (leader: {exc.leader_region})"
                continue
            except NotFound:
                outcome[conversation_id] = "not_found"
                continue
            unservable = self._unservable(moved)
            if unservable is not None:
                outcome[conversation_id] = unservable
                continue
            report = self._add([moved])
            outcome[conversation_id] = (
                "queued"
                if report.accepted or report.superseded
                else "outside_window"
                if report.outside_window
                else "backlog_full"
            )
        return outcome

    def affinity_of(self, tenant_id: str, conversation_id: str) -> Affinity | None:
        return self.affinity.get(tenant_id, conversation_id)

    def _add(self, moved: Sequence[MovedConversation]) -> AddReport:
        """Queue what an engine of this region can replay. A conversation no engine here can
        serve (the region has none, or none serves its pinned model revision: KV is reusable
        only for that exact revision) is counted and named in ``status``, never queued to
        wait forever."""
        servable = [m for m in moved if self._unservable(m) is None]
        report = self.scheduler.add_moved(servable)
        self.counts["conversations_planned"] += len(servable)
        return report

    @property
    def served_model_revisions(self) -> frozenset[str]:
        return frozenset(e.model_revision for e in self.config.engines.get(self.region, ()))

    def _unservable(self, moved: MovedConversation) -> str | None:
        """Why no engine of this region can replay ``moved`` (and count it), or None."""
        served = self.served_model_revisions
        if not served:
            self.counts["not_replayed_no_engine"] += 1
            return "no_engine"
        if moved.model_revision not in served:
            self.counts["not_replayed_model_unserved"] += 1
            if (
                moved.model_revision in self.unserved_model_revisions
                or len(self.unserved_model_revisions) < UNSERVED_REVISIONS_SHOWN_MAX
            ):
                self.unserved_model_revisions[moved.model_revision] += 1
            return "model_unserved"
        return None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(self._spawn(self._serve(), "replay-serve"))
        self._tasks.append(self._spawn(self._plan_loop(), "replay-plan"))
        self._tasks.append(self._spawn(self.capacity.run(), "replay-capacity"))

    async def close(self) -> None:
        for worker in self.workers:
            worker.request_stop()
        if self._worker_tasks:
            await asyncio.wait(self._worker_tasks, timeout=self.limits.worker_drain_timeout_s + 1)
        tasks = [*self._worker_tasks, *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stream, self._stream = self._stream, None
        closing = [stream.close] if stream is not None else []
        if self._bus_started:
            closing.append(self._bus.close)
        for close in closing:  # a broker that is gone must not stop the node's shutdown
            try:
                await close()
            except ConvplaneError as exc:
                log.warning("%s: closing the replay bus: %s", self.region, exc)

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        async def run() -> None:
            await coro

        task = asyncio.create_task(run(), name=f"{name}-{self.region}")
        task.add_done_callback(_log_crash)
        return task

    async def _serve(self) -> None:
        await self._retrying(self._bus.start, "start the job bus")
        self._bus_started = True
        stream = self._bus.result_stream(group_id=f"convplane.replay.results.{self.region}")
        await self._retrying(stream.start, "start the result stream")
        self._stream = stream
        self._tasks.append(self._spawn(self._dispatch_loop(), "replay-dispatch"))
        self._tasks.append(self._spawn(self._results_loop(stream), "replay-results"))
        for worker in self.workers:
            self._worker_tasks.append(self._spawn(worker.run(), worker.worker_id))

    async def _retrying(self, call: Callable[[], Awaitable[None]], what: str) -> None:
        attempt = 0
        backoff = self._backoff()
        while True:
            attempt += 1
            try:
                await call()
                return
            except (ConvplaneError, TimeoutError, OSError) as exc:
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "%s: could not %s (attempt %d): %s", self.region, what, attempt, exc
                    )
                await self._clock.sleep(backoff.next_s())

    def _backoff(self) -> Backoff:
        """A loop's waits after failures: twice ``backoff_base_s`` first, doubling up to
        ``backoff_max_s``, each jittered down to half."""
        limits = self.limits
        first_s = min(limits.backoff_base_s * 2, limits.backoff_max_s)
        return Backoff(first_s, limits.backoff_max_s, self._rng, low=0.5, width=0.5)

    # --- loops ----------------------------------------------------------------------------

    async def _plan_loop(self) -> None:
        while True:
            shard = await self._moved.get()
            self._moved_pending.discard(shard)
            backoff = self._backoff()
            for attempt in range(1, self.limits.plan_attempts_max + 1):
                try:
                    report = await self.replay_shard(shard)
                except NotLeader:
                    self.counts["moved_shards_lost_lead"] += 1
                    break
                except ConvplaneError as exc:
                    log.warning("%s: planning shard %d failed: %s", self.region, shard, exc)
                    if attempt == self.limits.plan_attempts_max:
                        self.counts["moved_shards_plan_failed"] += 1
                    else:
                        await self._clock.sleep(backoff.next_s())
                    continue
                self.counts["moved_shards_planned"] += 1
                log.info("%s: shard %d moved here: %s", self.region, shard, report)
                break

    async def _dispatch_loop(self) -> None:
        while True:
            jobs = self.dispatch_once()
            if jobs:
                await self._publish(jobs)
            if len(jobs) < self.limits.dispatch_batch_max:
                await self._clock.sleep(
                    jittered(self.limits.dispatch_interval_s, self._rng, low=0.75, width=0.5)
                )
            else:
                await asyncio.sleep(0)  # a full batch: go on, but let others run

    def dispatch_once(self) -> list[ReplayJob]:
        """Expire, give back grants of jobs long past their deadline, take what is granted."""
        self.scheduler.expire()
        now_ms = self._clock.wall_ms()
        for job_id, deadline_ms in list(self._outstanding.items()):
            if deadline_ms + self.limits.outstanding_grace_ms < now_ms:
                del self._outstanding[job_id]
                self.capacity.release(None)
                self.counts["outstanding_timed_out"] += 1
        jobs = [
            self._granted(job)
            for job in self.scheduler.dispatch(
                self.capacity.try_acquire, self.limits.dispatch_batch_max
            )
        ]
        for job in jobs:
            if job.job_id in self._outstanding:  # the same job again (a requeue): one grant
                self.capacity.release(None)
            self._outstanding[job.job_id] = job.deadline_ms
        return jobs

    def _granted(self, job: ReplayJob) -> ReplayJob:
        """The job with the read grant its worker shows to read the transcript."""
        grant = read_grant.sign(
            self._read_grant_key,
            job_id=job.job_id,
            tenant_id=job.tenant_id,
            conversation_id=job.conversation_id,
            region=job.region,
            expires_ms=job.deadline_ms,
        )
        return replace(job, read_grant=grant)

    async def _publish(self, jobs: list[ReplayJob]) -> None:
        try:
            await asyncio.wait_for(self._bus.publish_jobs(jobs), self.limits.publish_timeout_s)
            self.counts["jobs_published"] += len(jobs)
        except (ConvplaneError, TimeoutError) as exc:
            # Unknown whether they reached the bus: queue them again (replay is idempotent).
            log.warning("%s: publishing %d jobs failed: %s", self.region, len(jobs), exc)
            self.counts["publish_failures"] += 1
            for job in jobs:
                if self._outstanding.pop(job.job_id, None) is not None:
                    self.capacity.release(None)
            self.scheduler.add_moved(_moved_of(job) for job in jobs)
            await self._clock.sleep(self._backoff().next_s())

    async def _results_loop(self, stream: ResultStream) -> None:
        backoff = self._backoff()
        while True:
            try:
                result = await stream.next_result(self.limits.result_poll_s)
            except ConvplaneError as exc:
                log.warning("%s: reading results failed: %s", self.region, exc)
                await self._clock.sleep(backoff.next_s())
                continue
            backoff.reset()
            if result is not None:
                self.on_result(result)

    def on_result(self, result: ReplayResult) -> None:
        if result.region != self.region:
            return  # the results topic is shared by every region
        self.counts[f"result_{result.status}"] += 1
        for listener in self.result_listeners:
            listener(result)
        # wrong_model is not terminal: the job went back on the bus and keeps its grant
        if result.status in TERMINAL_STATUSES and result.job_id in self._outstanding:
            del self._outstanding[result.job_id]
            computed = result.prompt_tokens - result.cached_prompt_tokens
            self.capacity.release(computed if result.status == "replayed" else None)
            if result.status == "replayed":
                self.counts["tokens_replayed"] += computed
                self.last_replayed_at_ms = self._clock.wall_ms()
                self.drill_tally.replayed(result)
            if result.status in ("replayed", "skipped_live"):
                self.drill_tally.warmed(self._clock.wall_ms())
        self.scheduler.record_result(result)
        self.affinity.learn(result)

    # --- views ----------------------------------------------------------------------------

    def status_bus_rejected(self) -> int:
        """Result records the stream rejected (bad MAC or fields)."""
        return 0 if self._stream is None else self._stream.skipped_malformed

    def drill_view(self) -> dict[str, Any] | None:
        """What a drill measures of this region's replay (``GET /peer/drills/load``): live and
        spare prefill, and the running counts it compares before and after the fault. None
        where the region has no engines."""
        if not self.capacity.engine_controllers:
            return None
        region_capacity = self.capacity.region.snapshot()
        return {
            "live_tokens_per_s": region_capacity.live_tokens_per_s,
            "spare_tokens_per_s": region_capacity.spare_tokens_per_s,
            "conversations_planned": self.counts["conversations_planned"],
            "conversations_replayed": self.counts["result_replayed"],
            "tokens_replayed": self.counts["tokens_replayed"],
            "last_replayed_at_ms": self.last_replayed_at_ms,
            **self._engine_view(),
            **self.drill_tally.to_body(),
        }

    def _engine_view(self) -> dict[str, Any]:
        """The region's engines summed, as last scraped: the TTFT histogram and the
        prefix-cache counters (None where an engine does not export them)."""
        totals = self.capacity.engine_totals()
        return {
            "engine_ttft": None if totals is None else histogram_body(totals.ttft_buckets),
            "prefix_cache_queries_total": None
            if totals is None
            else totals.prefix_cache_queries_total,
            "prefix_cache_hits_total": None if totals is None else totals.prefix_cache_hits_total,
        }

    def status(self) -> dict[str, Any]:
        region_capacity = self.capacity.region.snapshot()
        engines = {}
        for engine_id, controller in self.capacity.engine_controllers.items():
            snap = controller.snapshot()
            engines[engine_id] = {
                "url": self.engine_urls.get(engine_id),
                "spare_tokens_per_s": round(snap.spare_tokens_per_s, 1),
                "live_tokens_per_s": round(snap.live_tokens_per_s, 1),
                "live_waiting": snap.live_waiting,
                "replays_in_flight": snap.in_flight,
                "engine_restarts": controller.estimator.restarts_total,
                # set while the engine's capacity is unknown (no replay there), with the reason
                "unknown": self.capacity.unknown_reasons.get(engine_id),
            }
        return {
            "region": self.region,
            "mode": self.mode,
            "scheduler": asdict(self.scheduler.snapshot()),
            "dispatched_in_flight": len(self._outstanding),
            "spare_tokens_per_s": round(region_capacity.spare_tokens_per_s, 1),
            "live_tokens_per_s": round(region_capacity.live_tokens_per_s, 1),
            "denied": region_capacity.denied,
            "engines": engines,
            "workers": {w.worker_id: dict(w.counts) for w in self.workers},
            # per worker: why its engine failed the self-check (no replay there); [] = fit
            "worker_engine_checks": {
                w.worker_id: None
                if w.engine_problems is None
                else [{"code": p.code, "message": p.message} for p in w.engine_problems]
                for w in self.workers
            },
            "counts": dict(self.counts),
            # result records rejected: failed validation / of which had no valid MAC
            "bus_results_skipped": 0 if self._stream is None else self._stream.skipped_malformed,
            "bus_results_unauthenticated": (
                0 if self._stream is None else self._stream.rejected_unauthenticated
            ),
            "affinity_entries": len(self.affinity),
            "moved_shards_queued": self._moved.qsize(),
            # what cannot be replayed here, and why, instead of a backlog that never drains
            "served_model_revisions": sorted(self.served_model_revisions),
            "not_replayed": {
                "no_engine": self.counts["not_replayed_no_engine"],
                "model_unserved": self.counts["not_replayed_model_unserved"],
                "unserved_model_revisions": dict(self.unserved_model_revisions.most_common()),
            },
        }


def _moved_of(job: ReplayJob) -> MovedConversation:
    return MovedConversation(
        tenant_id=job.tenant_id,
        conversation_id=job.conversation_id,
        model_revision=job.model_revision,
        last_activity_ms=job.last_activity_ms,
        estimated_prompt_tokens=job.estimated_prompt_tokens,
        through_seq=job.through_seq,
    )


def _log_crash(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.error("replay task %s crashed: %r", task.get_name(), error, exc_info=error)
