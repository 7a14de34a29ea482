"""Capacity planner: hand-worked examples (the arithmetic is in the comments)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from regions.capacity_arithmetic import (
    PlanInputError,
    parse_hosts_range,
    plan_region_loss,
    plan_replay,
    plan_replicas,
)
from services.cli.main import build_app


def test_replicas_with_host_failure_unit() -> None:
    # D = 1000 req/s, R = 120 req/s per replica, K = 4 replicas per host, failure unit host.
    # ceil(1000/120) = ceil(8.33) = 9 replicas for demand; reserve = K = 4 -> 13 replicas;
    # hosts = ceil(13/4) = 4. Max admission = (4-1)*4*120 = 1440.
    plan = plan_replicas(1000, 120, 4, "host")
    assert (plan.replicas_for_demand, plan.reserve_replicas, plan.replicas) == (9, 4, 13)
    assert plan.hosts == 4
    assert plan.max_admission == 1440
    # Default table: hosts 2..6. 3 hosts: healthy 12*120 = 1440, after loss 8*120 = 960 < 1000.
    by_hosts = {row.hosts: row for row in plan.rows}
    assert sorted(by_hosts) == [2, 3, 4, 5, 6]
    assert by_hosts[3].healthy_capacity == 1440
    assert by_hosts[3].after_loss_capacity == 960
    assert not by_hosts[3].serves_demand_after_loss
    assert by_hosts[4].serves_demand_after_loss


def test_replicas_with_replica_failure_unit() -> None:
    # Same fleet, failure unit replica: 9 + 1 = 10 replicas, hosts = ceil(10/4) = 3.
    # Max admission of 3 full hosts = (3*4 - 1)*120 = 1320.
    plan = plan_replicas(1000, 120, 4, "replica", hosts_range=(2, 3))
    assert (plan.replicas, plan.hosts, plan.max_admission) == (10, 3, 1320)
    # 2 hosts: (8 - 1)*120 = 840 < 1000.
    assert [(r.hosts, r.after_loss_capacity) for r in plan.rows] == [(2, 840), (3, 1320)]


def test_replicas_exact_fit_needs_no_extra() -> None:
    # D = 600, R = 100: exactly 6 replicas; K = 2, host unit: 6 + 2 = 8 replicas on 4 hosts,
    # and losing a host leaves 3*2*100 = 600 = D.
    plan = plan_replicas(600, 100, 2, "host")
    assert (plan.replicas, plan.hosts, plan.max_admission) == (8, 4, 600)


def test_region_loss_hand_example() -> None:
    # N = 3, Q = 100 req/s, T = 2000 tokens, H = 0.8, C = 300k tokens/s.
    # before: 100*2000*0.2 = 40k. worst: 100*3/2*2000 = 300k. moved-cold: 40k + 50*2000 = 140k.
    plan = plan_region_loss(3, 100, 2000, 0.8, 300_000)
    assert plan.rate_per_survivor == pytest.approx(150)
    assert plan.demand_before == pytest.approx(40_000)
    assert plan.demand_after_worst == pytest.approx(300_000)
    assert plan.demand_after_moved_cold == pytest.approx(140_000)
    assert plan.demand_after_rewarmed == pytest.approx(60_000)  # 150*2000*0.2
    assert plan.spare_after_moved_cold == pytest.approx(160_000)
    assert plan.spare_after_worst == pytest.approx(0)
    assert plan.feasible_moved_cold and plan.feasible_worst
    assert plan.verdict.startswith("feasible")


def test_region_loss_infeasible_verdict() -> None:
    # N = 2, Q = 100, T = 4000, H = 0.5, C = 500k.
    # before: 100*4000*0.5 = 200k (fits). moved-cold: 200k + 100*4000 = 600k > 500k.
    plan = plan_region_loss(2, 100, 4000, 0.5, 500_000)
    assert plan.demand_after_moved_cold == pytest.approx(600_000)
    assert plan.spare_after_moved_cold == pytest.approx(-100_000)
    assert plan.feasible_before and not plan.feasible_moved_cold
    assert plan.verdict.startswith("infeasible")


def test_region_loss_warm_only_verdict() -> None:
    # N = 4, Q = 90, T = 1000, H = 0.9, C = 100k. moved-cold: 9k + 30k = 39k fits;
    # worst: 90*4/3*1000 = 120k does not.
    plan = plan_region_loss(4, 90, 1000, 0.9, 100_000)
    assert plan.feasible_moved_cold and not plan.feasible_worst
    assert "only while" in plan.verdict


def test_replay_lower_bound() -> None:
    # 20k sessions * 3k tokens = 60M tokens; at 50k tokens/s >= 1200 s.
    plan = plan_replay(20_000, 3000, 50_000)
    assert plan.replay_tokens == 60_000_000
    assert plan.replay_time_min_s == pytest.approx(1200)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: plan_replicas(0, 1, 1, "host"), "demand"),
        (lambda: plan_replicas(1, -1, 1, "host"), "per-replica"),
        (lambda: plan_replicas(1, 1, 0, "host"), "replicas-per-host"),
        (lambda: plan_replicas(1, 1, 1, "rack"), "failure-unit"),  # type: ignore[arg-type]
        (lambda: plan_replicas(1, 1, 1, "host", (5, 2)), "hosts-range"),
        (lambda: plan_region_loss(1, 1, 1, 0.5, 1), "regions"),
        (lambda: plan_region_loss(3, 1, 1, 1.0, 1), "cache-hit"),
        (lambda: plan_region_loss(3, 1, 1, -0.1, 1), "cache-hit"),
        (lambda: plan_region_loss(3, 1, 1, 0.5, math.inf), "prefill-capacity"),
        (lambda: plan_replay(0, 1, 1), "sessions"),
        (lambda: plan_replay(1, 1, 0), "spare-prefill"),
        (lambda: parse_hosts_range("3-8"), "hosts-range"),
    ],
)
def test_invalid_inputs_name_the_field(call: object, field: str) -> None:
    with pytest.raises(PlanInputError) as info:
        call()  # type: ignore[operator]
    assert info.value.field == field


def test_cli_json_numbers() -> None:
    runner = CliRunner()
    args = ["plan", "region-loss", "--regions", "3", "--rate-per-region", "100"]
    args += ["--input-tokens", "2000", "--cache-hit", "0.8", "--prefill-capacity", "300000"]
    result = runner.invoke(build_app(), [*args, "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["demand_after_moved_cold"] == pytest.approx(140_000)
    assert body["feasible_worst"] is True


def test_cli_replicas_table_and_json() -> None:
    runner = CliRunner()
    args = ["plan", "replicas", "--demand", "1000", "--per-replica", "120"]
    args += ["--replicas-per-host", "4", "--failure-unit", "host", "--hosts-range", "3:5"]
    human = runner.invoke(build_app(), args)
    assert human.exit_code == 0, human.output
    assert "replicas: 13" in human.output and "hosts: 4" in human.output
    body = json.loads(runner.invoke(build_app(), [*args, "--json"]).output)
    assert body["max_admission"] == 1440
    assert [row["hosts"] for row in body["rows"]] == [3, 4, 5]


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "replay", "--sessions", "10", "--tokens-per-session", "5", "--spare-prefill", "0"],
        ["plan", "replicas", "--demand", "1", "--per-replica", "1", "--failure-unit", "rack"],
        [
            "plan",
            "region-loss",
            "--regions",
            "1",
            "--rate-per-region",
            "1",
            "--input-tokens",
            "1",
            "--cache-hit",
            "0",
            "--prefill-capacity",
            "1",
        ],
    ],
)
def test_cli_invalid_input_exits_2(args: list[str]) -> None:
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 2
    assert "Invalid value" in result.output
