"""The discrete-event model behind ``bench/replay.py``: two surviving regions of simulated
engines, live Poisson traffic, and (with replay) per region one ``ReplayScheduler`` and per engine
one ``CapacityController``, all on one manual clock. ``simulate`` runs it; the caller reports.

Not a benchmark by itself; see ``bench/replay.py`` for the scenario and what is measured.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field

from eventlog.clock import Clock
from replay.capacity import (
    CapacityConfig,
    CapacityController,
    CapacitySnapshot,
    Grant,
    OperatorConfig,
)
from replay.engines.sim_core import (
    BLOCK_TOKENS,
    PrefillServerModel,
    SimCompletion,
    SimEngineConfig,
    salt_key,
)
from replay.model import ReplayJob, ReplayResult
from replay.scheduler import MovedConversation, ReplayScheduler, SchedulerConfig

REPLAY_PRIORITY = 100
MODEL = "sim-model@rev1"


class ManualClock(Clock):
    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def wall_ms(self) -> int:
        return 1_767_225_600_000 + int(self.now_s * 1000)

    async def sleep(self, seconds: float) -> None:
        raise NotImplementedError("the bench is a discrete-event simulation")


@dataclass
class Params:
    seed: int = 7
    engines_per_region: int = 4
    prefill_tokens_per_s: float = 20_000.0
    cache_tokens: int = 16_000_000  # HBM + CPU offload tier (LMCache-style); see report
    chunk_tokens: int = 512
    headroom: float = 0.1
    moved_sessions: int = 3_000  # of the failed region, split over the two survivors
    own_sessions_per_region: int = 2_000
    prompt_tokens_min: int = 1_000
    prompt_tokens_max: int = 6_000
    turn_tokens: int = 600  # new tokens per live turn (user message + previous reply)
    own_turns_per_s: float = 40.0  # per survivor, turns of existing (warm) conversations
    new_conversations_per_s: float = 5.0  # per survivor, cold first prompts
    moved_return_mean_s: float = 600.0  # a moved conversation's next turn: mean wait
    tenants: int = 5
    tick_s: float = 0.05
    poll_s: float = 0.25
    max_concurrent_replays: int = 4  # a small queue of replay work in each engine
    burst_s: float = 5.0  # spare bucket depth, seconds of capacity x headroom
    spare_window_s: float = 5.0
    rise_deadband: float = 0.7
    rise_window_s: float = 2.0
    waiting_scrapes_to_stop: int = 3
    max_num_seqs: int = 256
    #: a replay is sent as prefixes that each add at most this many tokens (0: one request):
    #: vLLM schedules running requests first, so a running replay holds the step budget
    #: ahead of live requests until its prefill ends; small pieces bound that
    replay_piece_tokens: int = 256
    horizon_max_s: float = 3_600.0


@dataclass
class Session:
    conversation_id: str
    tenant_id: str
    salt: int
    base: int
    length: int
    last_activity_ms: int
    engine: int
    keys: list[int] = field(default_factory=list)
    had_live_turn: bool = False

    def block_keys(self) -> list[int]:
        """Extend the chained block keys to the current length. The bench's synthetic tokens
        are the run ``base, base + 1, ...``, so a block's content is named by its first token:
        key = hash(parent key, first token), chained like ``sim_core.block_keys``."""
        keys = self.keys
        parent = keys[-1] if keys else self.salt
        for start in range(len(keys) * BLOCK_TOKENS, self.length - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            parent = hash((parent, self.base + start))
            keys.append(parent)
        return keys


@dataclass
class ReplayPieces:
    """A replay in flight: its job, the prompt's block keys and length, the piece running."""

    job: ReplayJob
    keys: list[int]
    length: int
    sent_length: int
    computed_tokens: int = 0
    cached_tokens: int = 0


def piece_length(params: Params, replay: ReplayPieces) -> int:
    """The next prefix to send: whole blocks, at most ``replay_piece_tokens`` more."""
    step = params.replay_piece_tokens
    if step <= 0 or replay.length - replay.sent_length <= step:
        return replay.length
    return (replay.sent_length + step) // BLOCK_TOKENS * BLOCK_TOKENS


def submit_piece(params: Params, engine: PrefillServerModel, replay: ReplayPieces,
                 now_s: float) -> int:  # fmt: skip
    length = piece_length(params, replay)
    replay.sent_length = length
    keys = replay.keys[: length // BLOCK_TOKENS]
    return engine.submit_blocks(keys, length, REPLAY_PRIORITY, now_s)


@dataclass
class Region:
    name: str
    engines: list[PrefillServerModel]
    own: list[Session]
    moved: list[Session]
    arrivals: random.Random
    next_arrival_s: float = 0.0
    scheduler: ReplayScheduler | None = None
    controllers: list[CapacityController] = field(default_factory=list)
    in_flight: dict[tuple[int, int], ReplayPieces] = field(default_factory=dict)
    live_tickets: dict[tuple[int, int], tuple[Session, bool, float]] = field(default_factory=dict)
    ttft_own_s: list[tuple[float, float]] = field(default_factory=list)  # (arrival, ttft)
    ttft_moved_s: list[tuple[float, float]] = field(default_factory=list)
    replay_done_s: float = 0.0
    replayed_computed_tokens: int = 0
    replayed_jobs: int = 0
    computed_at_done: int = 0  # all engines' computed tokens at the last replay completion
    diag: Diagnostics = field(default_factory=lambda: Diagnostics())


@dataclass
class Diagnostics:
    """What the region's controllers saw at each poll (summed over its engines)."""

    polls: int = 0  # engine polls
    polls_live_waiting: int = 0  # polls where the controller saw live requests waiting
    polls_zero_spare: int = 0  # polls after which the controller's spare read 0
    spare_sum: float = 0.0  # sum over polls of the estimated spare (tokens/s)
    live_sum: float = 0.0  # sum over polls of the estimated live rate (tokens/s)
    timeline: list[tuple[float, float, float, int]] = field(default_factory=list)
    # (t, estimated spare of the region, computed tokens of all engines, replayed tokens)

    def observe(self, snapshot: CapacitySnapshot) -> None:
        self.polls += 1
        self.polls_live_waiting += snapshot.live_waiting > 0
        self.polls_zero_spare += snapshot.spare_tokens_per_s <= 0
        self.spare_sum += snapshot.spare_tokens_per_s
        self.live_sum += snapshot.live_tokens_per_s


def build_sessions(params: Params, rng: random.Random, prefix: str, count: int) -> list[Session]:
    sessions = []
    for i in range(count):
        tenant = f"tenant-{rng.randrange(params.tenants)}"
        length = rng.randint(params.prompt_tokens_min, params.prompt_tokens_max)
        ago_ms = int(rng.uniform(0, 3_000) * 1000)
        sessions.append(
            Session(
                f"{prefix}-{i}",
                tenant,
                salt_key(tenant),
                (zlib.crc32(prefix.encode()) & 0xFFFF) * 10**9 + i * 10**6,
                length,
                1_767_225_600_000 - ago_ms,
                i % params.engines_per_region,
            )
        )
    return sessions


def build_region(
    params: Params, name: str, index: int, with_replay: bool, clock: ManualClock
) -> Region:
    rng = random.Random(params.seed * 1000 + index)
    config = SimEngineConfig(
        params.prefill_tokens_per_s,
        params.cache_tokens,
        params.chunk_tokens,
        queue_max=100_000,
        max_num_seqs=params.max_num_seqs,
    )
    engines = [PrefillServerModel(config) for _ in range(params.engines_per_region)]
    own = build_sessions(params, rng, f"{name}-own", params.own_sessions_per_region)
    for session in own:  # warm before the failure: their KV is in their engine's cache
        engines[session.engine].cache.insert(session.block_keys())
    moved = build_sessions(params, rng, f"r1-to-{name}", params.moved_sessions // 2)
    region = Region(name, engines, own, moved, random.Random(params.seed * 7919 + index))
    if with_replay:
        region.scheduler = ReplayScheduler(SchedulerConfig(region=name), clock)
        limits = OperatorConfig(0.0)
        capacity = CapacityConfig(
            capacity_tokens_per_s=params.prefill_tokens_per_s,
            headroom=params.headroom,
            max_concurrent_replays=params.max_concurrent_replays,
            burst_s=params.burst_s,
            spare_window_s=params.spare_window_s,
            rise_deadband=params.rise_deadband,
            rise_window_s=params.rise_window_s,
            waiting_scrapes_to_stop=params.waiting_scrapes_to_stop,
        )
        region.controllers = [CapacityController(capacity, clock, limits) for _ in engines]
        region.scheduler.add_moved(
            MovedConversation(
                s.tenant_id, s.conversation_id, MODEL, s.last_activity_ms, s.length, 10
            )
            for s in moved
        )
    region.next_arrival_s = _next_gap(params, region)
    return region


def _rates(params: Params, region: Region) -> tuple[float, float, float]:
    moved = len(region.moved) / params.moved_return_mean_s
    return params.own_turns_per_s, params.new_conversations_per_s, moved


def _next_gap(params: Params, region: Region) -> float:
    return region.arrivals.expovariate(sum(_rates(params, region)))


def live_arrival(params: Params, region: Region, now_s: float) -> None:
    rng = region.arrivals
    own_turns, new, moved = _rates(params, region)
    pick = rng.random() * (own_turns + new + moved)
    is_moved = pick >= own_turns + new
    if is_moved:
        session = rng.choice(region.moved)
        session.length += params.turn_tokens
    elif pick >= own_turns:  # a new conversation of this region: cold, then one of its own
        (session,) = build_sessions(params, rng, f"{region.name}-new{len(region.own)}", 1)
        session.engine = rng.randrange(params.engines_per_region)
        region.own.append(session)
    else:
        session = rng.choice(region.own)
        session.length += params.turn_tokens
    session.had_live_turn = True
    if region.scheduler is not None:
        region.scheduler.mark_live(session.tenant_id, session.conversation_id)
    engine = region.engines[session.engine]
    ticket = engine.submit_blocks(session.block_keys()[:], session.length, 0, now_s)
    region.live_tickets[(session.engine, ticket)] = (session, is_moved, now_s)
    region.next_arrival_s = now_s + _next_gap(params, region)


def on_completion(params: Params, region: Region, engine_index: int, done: SimCompletion) -> None:
    key = (engine_index, done.ticket)
    live = region.live_tickets.pop(key, None)
    if live is not None:
        _, is_moved, arrival_s = live
        (region.ttft_moved_s if is_moved else region.ttft_own_s).append((arrival_s, done.ttft_s))
        return
    replay = region.in_flight.pop(key)
    replay.computed_tokens += done.prompt_tokens - done.cached_tokens
    replay.cached_tokens = done.cached_tokens
    if replay.sent_length < replay.length:  # the next piece, at once
        engine = region.engines[engine_index]
        ticket = submit_piece(params, engine, replay, done.finish_s)
        region.in_flight[(engine_index, ticket)] = replay
        return
    job, computed = replay.job, replay.computed_tokens
    region.controllers[engine_index].release(computed)
    region.replay_done_s = done.finish_s
    region.computed_at_done = sum(e.computed_tokens_total for e in region.engines)
    region.replayed_computed_tokens += computed
    region.replayed_jobs += 1
    assert region.scheduler is not None
    region.scheduler.record_result(
        ReplayResult(
            job.job_id,
            region.name,
            job.tenant_id,
            job.conversation_id,
            MODEL,
            "replayed",
            f"w{engine_index}",
            f"e{engine_index}",
            done.prompt_tokens,
            replay.cached_tokens,
            done.ttft_s * 1000,
            0,
        )
    )


def dispatch_replay(
    params: Params, region: Region, sessions: dict[str, Session], now_s: float
) -> None:
    assert region.scheduler is not None
    for index, controller in enumerate(region.controllers):

        def grant(tokens: int, tenant: str, controller: CapacityController = controller) -> Grant:
            return controller.try_acquire(tokens, tenant)

        for job in region.scheduler.dispatch(
            grant, max_jobs=controller.config.max_concurrent_replays
        ):
            session = sessions[job.conversation_id]
            # queued jobs never had a live turn (mark_live drops them), so the router learns
            # this conversation's KV affinity from where its replay ran
            session.engine = index
            engine = region.engines[index]
            keys = session.block_keys()[:]  # a snapshot: the session's list grows later
            replay = ReplayPieces(job, keys, session.length, sent_length=0)
            ticket = submit_piece(params, engine, replay, now_s)
            region.in_flight[(index, ticket)] = replay


def _sample_timeline(region: Region, now_s: float) -> None:
    spare = sum(c.estimator.rate_spare_tokens_per_s(now_s) for c in region.controllers)
    computed = sum(e.computed_tokens_total for e in region.engines)
    region.diag.timeline.append((now_s, spare, computed, region.replayed_computed_tokens))


def replay_finished(region: Region) -> bool:
    assert region.scheduler is not None
    return not region.in_flight and region.scheduler.snapshot().backlog_sessions == 0


def simulate(params: Params, with_replay: bool, horizon_s: float | None) -> list[Region]:
    """Run until replay is done (with replay) or until ``horizon_s`` (without)."""
    clock = ManualClock()
    regions = [
        build_region(params, name, i, with_replay, clock) for i, name in enumerate(("r2", "r3"))
    ]
    sessions = {s.conversation_id: s for r in regions for s in r.moved}
    next_tick_s = 0.0
    next_poll_s = 0.0
    end_s = horizon_s if horizon_s is not None else params.horizon_max_s
    now_s = 0.0
    while now_s < end_s:
        candidates = [next_tick_s if with_replay else math.inf]
        candidates += [r.next_arrival_s for r in regions]
        candidates += [t for r in regions for e in r.engines if (t := e.next_event_s()) is not None]
        now_s = min(candidates)
        if now_s >= end_s:
            break
        clock.now_s = now_s
        for region in regions:
            for index, engine in enumerate(region.engines):
                event_s = engine.next_event_s()
                if event_s is not None and event_s <= now_s:
                    engine.advance(now_s)
                    for done in engine.pop_completed():
                        on_completion(params, region, index, done)
            if region.next_arrival_s <= now_s:
                live_arrival(params, region, now_s)
        if with_replay and next_tick_s <= now_s:
            next_tick_s = now_s + params.tick_s
            poll = next_poll_s <= now_s
            if poll:
                next_poll_s = now_s + params.poll_s
            for region in regions:
                for index, engine in enumerate(region.engines):
                    engine.advance(now_s)
                    for done in engine.pop_completed():
                        on_completion(params, region, index, done)
                    if poll:
                        region.controllers[index].observe(engine.metrics())
                        region.diag.observe(region.controllers[index].snapshot())
                if poll:
                    _sample_timeline(region, now_s)
                dispatch_replay(params, region, sessions, now_s)
            if horizon_s is None and all(replay_finished(r) for r in regions):
                break
    return regions
