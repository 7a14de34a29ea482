"""Admission control on virtual time: adaptive limit, deadline queue, tenant quotas."""

from __future__ import annotations

import pytest

from eventlog.errors import InvariantViolation
from services.api.admission import build_admission_controller
from services.api.admission_control import (
    AdaptiveLimit,
    AdmissionConfig,
    AdmissionConfigError,
    AdmissionController,
    Admitted,
    DeadlineQueue,
    LimitConfig,
    Queued,
    Quota,
    Shed,
    TenantBuckets,
    Waiter,
)
from services.config import ClusterConfig, NodeSettings, RegionConfig, TenantConfig
from tests.unit.clocks import ManualClock


def run_rounds(limiter: AdaptiveLimit, clock: ManualClock, latency_s: float, rounds: int) -> None:
    """Each round fills every slot of the current limit, then all requests finish."""
    for _ in range(rounds):
        permits = []
        while (permit := limiter.try_acquire()) is not None:
            permits.append(permit)
        clock.now_s += latency_s
        for permit in permits:
            permit.release(latency_s)


def test_limit_grows_shrinks_on_latency_and_recovers() -> None:
    clock = ManualClock(1000.0)
    limiter = AdaptiveLimit(
        clock, LimitConfig(limit_initial=20, limit_max=200, baseline_window_s=3600)
    )
    run_rounds(limiter, clock, 0.010, rounds=10)
    grown = limiter.limit
    assert grown > 20  # no queueing: the limit probes upwards
    run_rounds(limiter, clock, 0.100, rounds=10)  # 10x the no-load latency: queueing
    shrunk = limiter.limit
    assert shrunk < grown / 4
    assert limiter.baseline_s == pytest.approx(0.010)
    run_rounds(limiter, clock, 0.010, rounds=10)
    assert limiter.limit > shrunk * 2
    assert limiter.limit <= 200


def test_limit_respects_min_max_and_drops() -> None:
    clock = ManualClock(1000.0)
    limiter = AdaptiveLimit(clock, LimitConfig(limit_initial=10, limit_min=5, limit_max=12))
    run_rounds(limiter, clock, 0.010, rounds=50)
    assert limiter.limit == 12
    for _ in range(100):
        permit = limiter.try_acquire()
        assert permit is not None
        permit.release(5.0, dropped=True)
    assert limiter.limit == 5


def test_limit_does_not_grow_when_app_limited() -> None:
    clock = ManualClock(1000.0)
    limiter = AdaptiveLimit(clock, LimitConfig(limit_initial=20))
    for _ in range(200):  # one request at a time: far below half the limit
        permit = limiter.try_acquire()
        assert permit is not None
        clock.now_s += 0.01
        permit.release(0.01)
    assert limiter.limit == 20


def test_baseline_follows_a_lasting_new_normal() -> None:
    clock = ManualClock(1000.0)
    limiter = AdaptiveLimit(clock, LimitConfig(limit_initial=20, baseline_window_s=10))
    run_rounds(limiter, clock, 0.010, rounds=5)
    run_rounds(limiter, clock, 0.100, rounds=5)
    low = limiter.limit
    clock.now_s += 25  # two windows later the 10 ms minimum has aged out
    run_rounds(limiter, clock, 0.100, rounds=20)
    assert limiter.baseline_s == pytest.approx(0.100)
    assert limiter.limit > low


def test_permit_released_twice_is_a_bug() -> None:
    permit = AdaptiveLimit(ManualClock(1000.0)).try_acquire()
    assert permit is not None
    permit.release(0.01)
    with pytest.raises(InvariantViolation):
        permit.release(0.01)


def test_deadline_queue_is_bounded_and_drops_expired() -> None:
    queue = DeadlineQueue(maxsize=3)
    waiters = [Waiter(i, "t", deadline_s=10.0 + i, enqueued_s=0.0) for i in range(5)]
    assert [queue.offer(w) for w in waiters] == [True, True, True, False, False]
    assert len(queue) == 3
    live, expired = queue.pop_live(now_s=11.5)  # deadlines 10 and 11 passed
    assert live == waiters[2]
    assert expired == waiters[:2]
    assert len(queue) == 0


def test_tenant_over_quota_gets_429_and_others_are_unaffected() -> None:
    buckets = TenantBuckets(Quota(rate_per_s=2, burst=4))
    now = 50.0
    assert all(buckets.try_take("noisy", now) is None for _ in range(4))
    # Empty bucket at 2 tokens/s: one token is 0.5 s away.
    assert buckets.try_take("noisy", now) == pytest.approx(0.5)
    assert buckets.try_take("quiet", now) is None
    assert buckets.try_take("noisy", now + 0.5) is None  # refilled exactly one token
    assert buckets.try_take("noisy", now + 0.5) == pytest.approx(0.5)


def test_tenant_buckets_are_bounded_and_overridable() -> None:
    buckets = TenantBuckets(Quota(1, 1), overrides={"big": Quota(100, 100)}, tenants_max=3)
    for tenant in ("a", "b", "c", "d"):
        buckets.try_take(tenant, 0.0)
    assert len(buckets) == 3
    assert all(buckets.try_take("big", 0.0) is None for _ in range(100))
    with pytest.raises(AdmissionConfigError):
        buckets.try_take("a", 0.0, cost=2)  # more than the burst can ever hold


def make_controller(clock: ManualClock, limit: int, queue_max: int) -> AdmissionController:
    limiter = AdaptiveLimit(
        clock, LimitConfig(limit_initial=limit, limit_min=limit, limit_max=limit)
    )
    quotas = TenantBuckets(Quota(rate_per_s=10, burst=10))
    return AdmissionController(clock, limiter, quotas, AdmissionConfig(queue_max=queue_max))


def test_controller_admits_queues_then_sheds_with_503() -> None:
    clock = ManualClock(1000.0)
    controller = make_controller(clock, limit=2, queue_max=2)
    deadline_s = clock.now_s + 1.0
    decisions = [controller.admit(f"t{i}", deadline_s) for i in range(6)]
    kinds = [type(d).__name__ for d in decisions]
    assert kinds == ["Admitted", "Admitted", "Queued", "Queued", "Shed", "Shed"]
    shed = decisions[4]
    assert isinstance(shed, Shed) and shed.status == 503 and shed.code == "overloaded"
    assert shed.retry_after_header == "1"
    assert len(controller.queue) == 2  # never above its bound

    first = decisions[0]
    assert isinstance(first, Admitted)
    first.permit.release(0.01)
    settled = controller.dispatch()
    assert len(settled) == 1
    waiter, outcome = settled[0]
    assert isinstance(decisions[2], Queued) and waiter == decisions[2].waiter
    assert isinstance(outcome, Admitted)


def test_controller_drops_expired_waiters_before_work() -> None:
    clock = ManualClock(1000.0)
    controller = make_controller(clock, limit=1, queue_max=5)
    running = controller.admit("t", clock.now_s + 10)
    short = controller.admit("t", clock.now_s + 0.1)
    long = controller.admit("t", clock.now_s + 10)
    assert isinstance(running, Admitted) and isinstance(short, Queued) and isinstance(long, Queued)
    clock.now_s += 0.5
    running.permit.release(0.5)
    settled = dict(controller.dispatch())
    assert settled[short.waiter] == Shed(503, 0.0, "deadline_exceeded")
    assert isinstance(settled[long.waiter], Admitted)
    late = controller.admit("t", deadline_s=clock.now_s)  # already due: refused before any work
    assert late == Shed(503, 0.0, "deadline_exceeded")


def test_controller_quota_rejection_is_429_with_retry_after() -> None:
    clock = ManualClock(1000.0)
    controller = make_controller(clock, limit=100, queue_max=0)
    for _ in range(10):
        assert isinstance(controller.admit("noisy", clock.now_s + 1), Admitted)
    rejected = controller.admit("noisy", clock.now_s + 1)
    assert isinstance(rejected, Shed) and rejected.status == 429
    assert rejected.code == "quota_exceeded"
    assert rejected.retry_after_s == pytest.approx(0.1)  # 1 token at 10 tokens/s
    assert rejected.retry_after_header == "1"
    assert isinstance(controller.admit("quiet", clock.now_s + 1), Admitted)


def test_cancelled_waiter_leaves_the_queue() -> None:
    clock = ManualClock(1000.0)
    controller = make_controller(clock, limit=1, queue_max=1)
    controller.admit("t", clock.now_s + 1)
    queued = controller.admit("t", clock.now_s + 1)
    assert isinstance(queued, Queued)
    assert controller.cancel(queued.waiter) and len(controller.queue) == 0
    assert isinstance(controller.admit("t", clock.now_s + 1), Queued)


def test_a_tenant_the_cluster_file_does_not_list_gets_the_default_quota() -> None:
    """A key created through ``/v1/admin/keys`` for a new tenant is metered at TenantConfig's
    default quota, the one ``services.api.auth`` gives it, not at one request a second."""
    listed = TenantConfig(tenant_id="demo", api_key_sha256="0" * 64, requests_per_s=7.0, burst=9)
    cluster = ClusterConfig(
        regions=[RegionConfig(name="a", url="http://a", dsn="memory")], tenants=[listed]
    )
    settings = NodeSettings(region="a", cluster=cluster)
    controller = build_admission_controller(settings, cluster, ManualClock())
    default = TenantConfig(tenant_id="new", api_key_sha256="1" * 64)
    assert controller.quotas.quota("new") == Quota(default.requests_per_s, float(default.burst))
    assert controller.quotas.quota("demo") == Quota(7.0, 9.0)
    for _ in range(default.burst):  # a whole burst at one instant, then the next is refused
        assert controller.quotas.try_take("new", 0.0) is None
    assert controller.quotas.try_take("new", 0.0) is not None
