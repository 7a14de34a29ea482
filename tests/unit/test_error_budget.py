"""``regions.error_budget``: the burn rate of the plane's own availability SLO from samples of
its live appends answered 2xx and 5xx per second."""

from __future__ import annotations

import pytest

from eventlog.errors import InvariantViolation
from regions.error_budget import BurnPolicy, LoadSample, burn, burning

POLICY = BurnPolicy(slo_availability=0.999, window_s=60.0, rate_max=14.4, min_appends=100)


def _steady(succeeded_per_s: float, errors_per_s: float, until_s: float) -> list[LoadSample]:
    return [
        LoadSample(float(t), succeeded_per_s, errors_per_s) for t in range(0, int(until_s) + 1, 5)
    ]


def test_the_burn_is_the_error_ratio_over_the_budget() -> None:
    found = burn(_steady(98.0, 2.0, 60.0), 60.0, POLICY)
    assert found is not None
    assert found.appends == pytest.approx(100.0 * 60.0)
    assert found.error_ratio == pytest.approx(0.02)
    assert found.rate == pytest.approx(20.0)  # 2 % errors against a 0.1 % budget
    assert burning(_steady(98.0, 2.0, 60.0), 60.0, POLICY) == found


def test_a_burn_at_or_under_the_maximum_is_not_burning() -> None:
    found = burn(_steady(99.0, 1.0, 60.0), 60.0, POLICY)
    assert found is not None and found.rate == pytest.approx(10.0)
    assert burning(_steady(99.0, 1.0, 60.0), 60.0, POLICY) is None


def test_each_sample_stands_for_the_time_since_the_one_before_and_only_the_window_counts() -> None:
    samples = [
        LoadSample(0.0, 0.0, 50.0),  # an outage long before the window
        LoadSample(80.0, 10.0, 0.0),  # the window's first sample: only marks its start
        LoadSample(110.0, 10.0, 0.0),  # 300 ok
        LoadSample(130.0, 8.0, 2.0),  # 160 ok, 40 errors
    ]
    found = burn(samples, 130.0, POLICY)
    assert found is not None
    assert found.appends == pytest.approx(500.0)
    assert found.error_ratio == pytest.approx(40.0 / 500.0)


def test_below_the_minimum_count_nothing_is_judged() -> None:
    # every append failed, but 50 of them are too few to say anything about the budget
    assert burn([LoadSample(0.0, 0.0, 1.0), LoadSample(50.0, 0.0, 1.0)], 50.0, POLICY) is None
    assert burn([LoadSample(0.0, 0.0, 9.0)], 0.0, POLICY) is None  # one sample spans no time
    assert burn([], 0.0, POLICY) is None


def test_samples_spanning_less_than_half_the_window_are_not_judged() -> None:
    # a leader that took over 25 s ago saw a failover's errors: too short a span to judge
    assert burn(_steady(50.0, 50.0, 25.0), 25.0, POLICY) is None
    found = burn(_steady(50.0, 50.0, 30.0), 30.0, POLICY)
    assert found is not None and found.rate == pytest.approx(500.0)


def test_the_slo_must_leave_a_budget() -> None:
    with pytest.raises(InvariantViolation):
        BurnPolicy(slo_availability=1.0, window_s=60.0, rate_max=14.4, min_appends=1)
