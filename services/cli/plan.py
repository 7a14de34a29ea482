"""``convplane plan ...``: the capacity planner (``regions.capacity_arithmetic``) on the command line.

Rates come back in the unit the caller used; ``--json`` prints plain JSON numbers.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from regions import capacity_arithmetic
from regions.capacity_arithmetic import PlanInputError

plan_app = typer.Typer(
    name="plan",
    help="Capacity planning: replicas and hosts, region loss, replay time.",
    no_args_is_help=True,
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")]


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app)


def _bad_input(exc: PlanInputError) -> typer.BadParameter:
    # BadParameter makes click print a usage error and exit with status 2.
    return typer.BadParameter(exc.message, param_hint=f"--{exc.field}")


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(dataclasses.asdict(value), indent=2))


def _num(value: float) -> str:
    return (
        f"{value:,.6g}" if isinstance(value, float) and not value.is_integer() else f"{value:,.0f}"
    )


@plan_app.command("replicas")
def replicas_command(
    demand: Annotated[float, typer.Option(help="Demand D (any rate unit, e.g. req/s).")],
    per_replica: Annotated[
        float, typer.Option(help="Planning throughput R of one replica, same unit as D.")
    ],
    replicas_per_host: Annotated[int, typer.Option(help="Replicas K sharing one host.")] = 1,
    failure_unit: Annotated[
        str, typer.Option(help="What fails together: replica or host.")
    ] = "host",
    hosts_range: Annotated[
        str | None, typer.Option(help="Host counts A:B for the capacity table.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Replicas and hosts to serve D and still serve it after losing one failure unit.

    \b
    replicas_for_demand = ceil(D / R)
    reserve             = 1 (failure unit replica) or K (failure unit host)
    replicas            = replicas_for_demand + reserve;  hosts = ceil(replicas / K)
    healthy capacity    = h*K*R for h hosts
    after-loss capacity = (h*K - 1)*R (replica) or (h - 1)*K*R (host)
    max admission       = after-loss capacity of the planned fleet
    Assumes even load spread and R measured within the latency SLO.
    """
    try:
        rng = (
            capacity_arithmetic.parse_hosts_range(hosts_range) if hosts_range is not None else None
        )
        unit = capacity_arithmetic.parse_failure_unit(failure_unit)
        plan = capacity_arithmetic.plan_replicas(demand, per_replica, replicas_per_host, unit, rng)
    except PlanInputError as exc:
        raise _bad_input(exc) from exc
    if as_json:
        _print_json(plan)
        return
    console = Console()
    console.print(
        f"replicas: {plan.replicas} ({plan.replicas_for_demand} for demand + "
        f"{plan.reserve_replicas} reserve for one {plan.failure_unit})\n"
        f"hosts: {plan.hosts} ({plan.replicas_per_host} replicas per host)\n"
        f"max admission honouring the {plan.failure_unit} reserve, {plan.hosts} full hosts "
        f"({plan.hosts * plan.replicas_per_host} replicas): {_num(plan.max_admission)}"
    )
    table = Table("hosts", "replicas", "healthy", f"after losing a {plan.failure_unit}", "serves D")
    for row in plan.rows:
        table.add_row(
            str(row.hosts),
            str(row.replicas),
            _num(row.healthy_capacity),
            _num(row.after_loss_capacity),
            "yes" if row.serves_demand_after_loss else "NO",
        )
    console.print(table)


@plan_app.command("region-loss")
def region_loss_command(
    regions: Annotated[int, typer.Option(help="Regions N of equal size (N >= 2).")],
    rate_per_region: Annotated[float, typer.Option(help="Request rate Q per region.")],
    input_tokens: Annotated[float, typer.Option(help="Prompt tokens T per request.")],
    cache_hit: Annotated[float, typer.Option(help="Prefix-cache hit ratio H in [0, 1).")],
    prefill_capacity: Annotated[
        float, typer.Option(help="Prefill capacity C of one region (tokens per Q's time unit).")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Prefill demand per survivor after losing one of N regions.

    \b
    before, per region               = Q*T*(1-H)
    after, worst (all requests cold) = Q*N/(N-1)*T
    after, only moved sessions cold  = Q*T*(1-H) + Q/(N-1)*T
    spare                            = C - demand
    Infeasible when a survivor's live demand exceeds C.
    """
    try:
        plan = capacity_arithmetic.plan_region_loss(
            regions, rate_per_region, input_tokens, cache_hit, prefill_capacity
        )
    except PlanInputError as exc:
        raise _bad_input(exc) from exc
    if as_json:
        _print_json(plan)
        return
    table = Table("per region", "prefill demand", "spare prefill", "fits C")
    cases = (
        ("before the loss", plan.demand_before, plan.spare_before, plan.feasible_before),
        (
            "after, moved sessions cold",
            plan.demand_after_moved_cold,
            plan.spare_after_moved_cold,
            plan.feasible_moved_cold,
        ),
        (
            "after, worst (all cold)",
            plan.demand_after_worst,
            plan.spare_after_worst,
            plan.feasible_worst,
        ),
    )
    for name, demand, spare, fits in cases:
        table.add_row(name, _num(demand), _num(spare), "yes" if fits else "NO")
    console = Console()
    console.print(f"request rate per survivor: {_num(plan.rate_per_survivor)}")
    console.print(table)
    console.print(f"verdict: {plan.verdict}")


@plan_app.command("replay")
def replay_command(
    sessions: Annotated[int, typer.Option(help="Sessions S to rebuild.")],
    tokens_per_session: Annotated[float, typer.Option(help="Prompt tokens T per session.")],
    spare_prefill: Annotated[float, typer.Option(help="Spare prefill rate P (tokens/s).")],
    as_json: JsonFlag = False,
) -> None:
    """Replay tokens and the lower bound on replay time.

    \b
    replay tokens = S*T
    replay time  >= S*T/P  (all spare capacity goes to replay, nothing cached already)
    """
    try:
        plan = capacity_arithmetic.plan_replay(sessions, tokens_per_session, spare_prefill)
    except PlanInputError as exc:
        raise _bad_input(exc) from exc
    if as_json:
        _print_json(plan)
        return
    typer.echo(
        f"replay tokens: {_num(plan.replay_tokens)}\n"
        f"replay time >= {_num(plan.replay_time_min_s)} s ({plan.replay_time_min_s / 60:.1f} min)"
    )
