"""Replay scheduler core: window, ordering (tenant WFQ + recency), mark_live, expiry, bounds."""

from __future__ import annotations

from replay.capacity import Grant
from replay.model import ReplayResult
from replay.scheduler import MovedConversation, ReplayScheduler, SchedulerConfig
from tests.unit.clocks import ManualClock

NOW_MS = 10_000_000


def _moved(
    conv: str, tenant: str = "t", ago_s: float = 10, tokens: int = 1000, seq: int = 5
) -> MovedConversation:
    return MovedConversation(tenant, conv, "m@1", NOW_MS - int(ago_s * 1000), tokens, seq)


def _always(_tokens: int, _tenant: str) -> Grant:
    return Grant.GRANTED


def _scheduler(clock: ManualClock, **kwargs: object) -> ReplayScheduler:
    return ReplayScheduler(SchedulerConfig(region="r2", **kwargs), clock)  # type: ignore[arg-type]


def test_keeps_only_the_window_and_orders_most_recent_first() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock, replay_window_s=3600)
    report = scheduler.add_moved(
        [_moved("old", ago_s=7200), _moved("a", ago_s=300), _moved("b", ago_s=5)]
    )
    assert (report.accepted, report.outside_window) == (2, 1)
    jobs = scheduler.dispatch(_always, max_jobs=10)
    assert [j.conversation_id for j in jobs] == ["b", "a"]
    assert jobs[0].job_id == "r2/t/b/5" and jobs[0].region == "r2"
    assert scheduler.snapshot().outside_window_total == 1


def test_tenants_share_replay_tokens_by_weight() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock, tenant_weights={"gold": 3.0, "free": 1.0})
    scheduler.add_moved(
        [_moved(f"g{i}", "gold", ago_s=100 + i) for i in range(40)]
        + [_moved(f"f{i}", "free", ago_s=i) for i in range(40)]  # free's are more recent
    )
    first = scheduler.dispatch(_always, max_jobs=40)
    gold = sum(1 for j in first if j.tenant_id == "gold")
    assert gold == 30  # 3:1 by tokens (equal job sizes)
    gold_order = [j.conversation_id for j in first if j.tenant_id == "gold"]
    assert gold_order == [f"g{i}" for i in range(30)]  # recency within the tenant


def test_idle_tenant_earns_no_credit() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock)
    scheduler.add_moved([_moved(f"a{i}", "a") for i in range(20)])
    scheduler.dispatch(_always, max_jobs=10)
    scheduler.add_moved([_moved(f"b{i}", "b") for i in range(20)])
    nxt = scheduler.dispatch(_always, max_jobs=10)
    assert sum(1 for j in nxt if j.tenant_id == "b") in (5, 6)  # alternates, no catch-up burst


def test_one_id_of_two_tenants_is_two_jobs() -> None:
    """Conversation ids are namespaced by tenant: neither job replaces the other, and a live
    request of one tenant drops only that tenant's job."""
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock)
    report = scheduler.add_moved([_moved("same", "t1", seq=3), _moved("same", "t2", seq=9)])
    assert (report.accepted, report.superseded) == (2, 0)
    assert scheduler.mark_live("t1", "same") is True
    jobs = scheduler.dispatch(_always, 10)
    assert [(j.tenant_id, j.conversation_id, j.through_seq) for j in jobs] == [("t2", "same", 9)]
    assert jobs[0].job_id == "r2/t2/same/9"


def test_mark_live_drops_the_queued_job() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock)
    scheduler.add_moved([_moved("a", ago_s=1), _moved("b", ago_s=2)])
    assert scheduler.mark_live("t", "a") is True
    assert scheduler.mark_live("t", "a") is False
    assert [j.conversation_id for j in scheduler.dispatch(_always, 10)] == ["b"]
    snap = scheduler.snapshot()
    assert (snap.cancelled_live_total, snap.backlog_sessions, snap.backlog_tokens) == (1, 0, 0)


def test_jobs_expire_at_their_deadline() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock, replay_window_s=3600, job_ttl_s=600)
    scheduler.add_moved([_moved("near-window", ago_s=3500), _moved("fresh", ago_s=1)])
    clock.now_s += 200  # "near-window" is now past last_activity + window
    jobs = scheduler.dispatch(_always, 10)
    assert [j.conversation_id for j in jobs] == ["fresh"]
    assert scheduler.snapshot().expired_total == 1
    scheduler.add_moved([_moved("late", ago_s=1)])
    clock.now_s += 700  # past its enqueue + job_ttl
    assert scheduler.expire() == 1
    assert scheduler.snapshot().backlog_sessions == 0


def test_backlog_is_bounded_keeping_the_most_recent() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock, backlog_max=3)
    report = scheduler.add_moved([_moved(f"c{i}", ago_s=i) for i in range(5)])
    assert (report.accepted, report.rejected_full) == (3, 2)
    assert [j.conversation_id for j in scheduler.dispatch(_always, 10)] == ["c0", "c1", "c2"]


def test_dispatch_follows_capacity_grants() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock)
    scheduler.add_moved([_moved(f"s{i}", "small", ago_s=i) for i in range(3)])
    scheduler.add_moved([_moved(f"b{i}", "big", ago_s=i) for i in range(3)])
    budget = {"tokens": 2500}

    def grant(tokens: int, tenant: str) -> Grant:
        if tenant == "small":
            return Grant.TENANT_LIMIT
        if tokens > budget["tokens"]:
            return Grant.NO_SPARE
        budget["tokens"] -= tokens
        return Grant.GRANTED

    jobs = scheduler.dispatch(grant, max_jobs=10)
    assert [j.conversation_id for j in jobs] == ["b0", "b1"]  # small skipped, then no spare
    assert scheduler.snapshot().backlog_sessions == 4


def test_newer_through_seq_supersedes_and_results_are_counted() -> None:
    clock = ManualClock(NOW_MS / 1000)
    scheduler = _scheduler(clock, rate_window_s=10)
    scheduler.add_moved([_moved("a", seq=5, tokens=1000)])
    report = scheduler.add_moved([_moved("a", seq=7, tokens=1200)])
    assert report.superseded == 1
    (job,) = scheduler.dispatch(_always, 10)
    assert (job.through_seq, job.estimated_prompt_tokens) == (7, 1200)
    scheduler.record_result(
        ReplayResult(
            job.job_id, "r2", "t", "a", "m@1", "replayed", "w1", "e1", 1210, 0, 80.0, NOW_MS
        )
    )
    snap = scheduler.snapshot()
    assert (snap.replayed_total, snap.replayed_tokens_total) == (1, 1210)
    assert snap.replayed_tokens_per_s == 121.0
