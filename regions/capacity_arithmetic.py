"""Capacity arithmetic (`convplane plan ...`): the arithmetic behind "can we lose X and still serve the load". Pure.

Every function takes rates in whatever unit the caller uses (requests/s, tokens/s, ...) and
returns them in that same unit; only ratios and counts are unit-free.

Replicas (``plan_replicas``)
    D  demand, R  planning throughput of one replica (what it sustains within its latency SLO,
    not its peak), K  replicas per host.

    replicas_for_demand = ceil(D / R)
    reserve_replicas    = 1 when the failure unit is a replica, K when it is a host (replicas
                          sharing a host fail together)
    replicas            = replicas_for_demand + reserve_replicas
    hosts               = ceil(replicas / K)

    For a fleet of h hosts (h*K replicas):
        healthy capacity    = h * K * R
        after-loss capacity = (h*K - 1) * R      failure unit = replica
                            = (h - 1) * K * R    failure unit = host
        max admission       = after-loss capacity: the most load one may accept and still
                              serve all of it after losing one failure unit (reported for the
                              planned ``hosts`` filled with K replicas each).
    Assumes load spreads evenly over replicas and a lost unit's load moves to the rest.

Region loss (``plan_region_loss``)
    N  regions of equal size, Q  request rate per region, T  input (prompt) tokens per request,
    H  prefix-cache hit ratio in steady state, C  prefill capacity of one region (tokens/s).

    before, per region             = Q * T * (1 - H)
    after, per survivor, worst     = Q * N/(N-1) * T
        every request on the survivor is cold (caches of survivors flushed too)
    after, per survivor, moved-cold = Q * T * (1 - H) + Q/(N-1) * T
        the survivor's own sessions stay warm; the Q/(N-1) moved sessions arrive cold
    spare = C - demand for each case. A survivor whose live prefill demand exceeds C cannot
    serve it: the plan is infeasible (admission must shed load; replay gets nothing).
    The steady state after replay rebuilt the caches is Q * N/(N-1) * T * (1 - H).

Replay (``plan_replay``)
    S  sessions to rebuild, T  tokens per session, P  spare prefill rate (tokens/s).
    replay tokens = S * T;  replay time >= S * T / P (a lower bound: it assumes every spare
    token goes to replay and no replayed prefix is cached already).

Invalid inputs raise ``PlanInputError`` (an ``InvalidRequest``) naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from eventlog.errors import InvalidRequest

FailureUnit = Literal["replica", "host"]
FAILURE_UNITS: tuple[FailureUnit, ...] = ("replica", "host")
HOST_ROWS_MAX = 1000  # bound on a capacity table


class PlanInputError(InvalidRequest):
    """A planner input is out of range; ``field`` names it (as the CLI option, minus dashes)."""

    code = "invalid_plan_input"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _require_positive(field: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise PlanInputError(field, f"{field} must be a positive finite number, got {value}")


# --- replicas ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostRow:
    """Capacity of a fleet of ``hosts`` hosts."""

    hosts: int
    replicas: int
    healthy_capacity: float
    after_loss_capacity: float
    serves_demand_after_loss: bool


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    demand: float
    per_replica: float
    replicas_per_host: int
    failure_unit: FailureUnit
    replicas_for_demand: int
    reserve_replicas: int
    replicas: int
    hosts: int
    max_admission: float  # after-loss capacity of ``hosts`` full hosts (hosts * K replicas)
    rows: tuple[HostRow, ...]


def after_loss_capacity(
    hosts: int, replicas_per_host: int, per_replica: float, failure_unit: FailureUnit
) -> float:
    """Capacity left after losing one failure unit from ``hosts`` full hosts."""
    lost_replicas = 1 if failure_unit == "replica" else replicas_per_host
    return max(0, hosts * replicas_per_host - lost_replicas) * per_replica


def host_row(
    hosts: int, demand: float, per_replica: float, replicas_per_host: int, unit: FailureUnit
) -> HostRow:
    after = after_loss_capacity(hosts, replicas_per_host, per_replica, unit)
    return HostRow(
        hosts=hosts,
        replicas=hosts * replicas_per_host,
        healthy_capacity=hosts * replicas_per_host * per_replica,
        after_loss_capacity=after,
        serves_demand_after_loss=after >= demand,
    )


def plan_replicas(
    demand: float,
    per_replica: float,
    replicas_per_host: int,
    failure_unit: FailureUnit,
    hosts_range: tuple[int, int] | None = None,
) -> ReplicaPlan:
    """Replicas and hosts for ``demand`` with one failure unit in reserve (see module doc).

    ``hosts_range`` (inclusive) picks the rows of the capacity table; by default the planned
    host count and two on either side.
    """
    _require_positive("demand", demand)
    _require_positive("per-replica", per_replica)
    if replicas_per_host < 1:
        raise PlanInputError("replicas-per-host", "replicas-per-host must be at least 1")
    if failure_unit not in FAILURE_UNITS:
        raise PlanInputError("failure-unit", f"failure-unit must be one of {FAILURE_UNITS}")
    replicas_for_demand = math.ceil(demand / per_replica)
    reserve = 1 if failure_unit == "replica" else replicas_per_host
    replicas = replicas_for_demand + reserve
    hosts = math.ceil(replicas / replicas_per_host)
    low, high = hosts_range if hosts_range is not None else (max(1, hosts - 2), hosts + 2)
    if not 1 <= low <= high:
        raise PlanInputError(
            "hosts-range", f"hosts-range must be A:B with 1 <= A <= B, got {low}:{high}"
        )
    if high - low + 1 > HOST_ROWS_MAX:
        raise PlanInputError("hosts-range", f"hosts-range spans more than {HOST_ROWS_MAX} rows")
    rows = tuple(
        host_row(h, demand, per_replica, replicas_per_host, failure_unit)
        for h in range(low, high + 1)
    )
    return ReplicaPlan(
        demand=demand,
        per_replica=per_replica,
        replicas_per_host=replicas_per_host,
        failure_unit=failure_unit,
        replicas_for_demand=replicas_for_demand,
        reserve_replicas=reserve,
        replicas=replicas,
        hosts=hosts,
        max_admission=after_loss_capacity(hosts, replicas_per_host, per_replica, failure_unit),
        rows=rows,
    )


def parse_failure_unit(text: str) -> FailureUnit:
    for unit in FAILURE_UNITS:
        if text == unit:
            return unit
    raise PlanInputError(
        "failure-unit", f"failure-unit must be one of {FAILURE_UNITS}, got {text!r}"
    )


def parse_hosts_range(text: str) -> tuple[int, int]:
    """``"A:B"`` -> ``(A, B)``."""
    parts = text.split(":")
    try:
        low, high = (int(p) for p in parts)
    except ValueError:
        raise PlanInputError(
            "hosts-range", f"hosts-range must look like 3:8, got {text!r}"
        ) from None
    return low, high


# --- region loss -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegionLossPlan:
    regions: int
    rate_per_region: float
    input_tokens: float
    cache_hit: float
    prefill_capacity: float
    rate_per_survivor: float  # Q * N/(N-1)
    demand_before: float  # per region
    demand_after_worst: float  # per survivor, every request cold
    demand_after_moved_cold: float  # per survivor, only moved sessions cold
    demand_after_rewarmed: float  # per survivor once replay rebuilt the caches
    spare_before: float
    spare_after_worst: float
    spare_after_moved_cold: float
    feasible_before: bool
    feasible_moved_cold: bool
    feasible_worst: bool
    verdict: str


def _verdict(feasible_before: bool, feasible_moved_cold: bool, feasible_worst: bool) -> str:
    if not feasible_before:
        return "infeasible: a region cannot serve its own prefill demand even before the loss"
    if not feasible_moved_cold:
        return (
            "infeasible: after the loss a survivor's prefill demand exceeds its capacity even "
            "with its own sessions warm; admission must shed load and replay gets no capacity"
        )
    if not feasible_worst:
        return (
            "feasible only while survivors keep their own caches warm; a survivor whose caches "
            "are flushed cannot serve its demand"
        )
    return "feasible: survivors serve the load even with every request cold"


def plan_region_loss(
    regions: int,
    rate_per_region: float,
    input_tokens: float,
    cache_hit: float,
    prefill_capacity: float,
) -> RegionLossPlan:
    """Prefill demand per survivor after losing one of ``regions`` equal regions (module doc)."""
    if regions < 2:
        raise PlanInputError(
            "regions", f"regions must be at least 2 to survive a loss, got {regions}"
        )
    _require_positive("rate-per-region", rate_per_region)
    _require_positive("input-tokens", input_tokens)
    _require_positive("prefill-capacity", prefill_capacity)
    if not 0 <= cache_hit < 1:
        raise PlanInputError("cache-hit", f"cache-hit must be in [0, 1), got {cache_hit}")
    q, t, h, n, c = rate_per_region, input_tokens, cache_hit, regions, prefill_capacity
    before = q * t * (1 - h)
    worst = q * n / (n - 1) * t
    moved_cold = q * t * (1 - h) + q / (n - 1) * t
    feasible = (before <= c, moved_cold <= c, worst <= c)
    return RegionLossPlan(
        regions=n,
        rate_per_region=q,
        input_tokens=t,
        cache_hit=h,
        prefill_capacity=c,
        rate_per_survivor=q * n / (n - 1),
        demand_before=before,
        demand_after_worst=worst,
        demand_after_moved_cold=moved_cold,
        demand_after_rewarmed=q * n / (n - 1) * t * (1 - h),
        spare_before=c - before,
        spare_after_worst=c - worst,
        spare_after_moved_cold=c - moved_cold,
        feasible_before=feasible[0],
        feasible_moved_cold=feasible[1],
        feasible_worst=feasible[2],
        verdict=_verdict(*feasible),
    )


# --- replay ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    sessions: int
    tokens_per_session: float
    spare_prefill: float
    replay_tokens: float  # S * T
    replay_time_min_s: float  # S * T / P, in seconds when P is per second


def plan_replay(sessions: int, tokens_per_session: float, spare_prefill: float) -> ReplayPlan:
    """Total replay tokens and the lower bound on replay time (module doc)."""
    if sessions < 1:
        raise PlanInputError("sessions", f"sessions must be at least 1, got {sessions}")
    _require_positive("tokens-per-session", tokens_per_session)
    _require_positive("spare-prefill", spare_prefill)
    total = sessions * tokens_per_session
    return ReplayPlan(
        sessions=sessions,
        tokens_per_session=tokens_per_session,
        spare_prefill=spare_prefill,
        replay_tokens=total,
        replay_time_min_s=total / spare_prefill,
    )
