"""``convplane sim``: run seeds of the deterministic simulation (whole plane, or the log alone)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)


def sim(
    seeds: Annotated[int, typer.Option(help="How many seeds to run.")] = 100,
    start: Annotated[int, typer.Option(help="First seed.")] = 0,
    regions: Annotated[int, typer.Option(help="Regions: 3 or 5.", min=3, max=5)] = 3,
    clients: Annotated[int, typer.Option(help="Concurrent clients per seed.")] = 3,
    ops: Annotated[int, typer.Option(help="Operations per client.")] = 25,
    log_only: Annotated[
        bool, typer.Option("--log-only", help="The log core alone (no controllers), 3 regions.")
    ] = False,
    nodes_per_region: Annotated[
        int,
        typer.Option(
            help="Nodes per region (1..3); above 1 the faults hit single nodes (crashes, "
            "restarts, pauses) and odd seeds check that node crashes move no shard to "
            "another region.",
            min=1,
            max=3,
        ),
    ] = 1,
) -> None:
    """Run seeded simulations on virtual time and check every invariant.

    By default the whole plane runs: each region's real log node, controller (failure
    detection, control shard, placement, failback, evacuate/restore, replica identity) and drill
    driver under partitions (also one-way), loss, delay, duplication, database crashes, stalls
    and disk loss, node crashes, restarts, pauses and network blips, clock skew, operator
    actions, drills (region-loss, evacuate, kill) and poison inputs; the checker asserts no
    acked event lost, no divergent history, gapless seqs, one effect per attempt, one committer
    per (shard, epoch), linearizable reads, no control-shard standoff, and liveness after
    healing (the control shard led, every drill ended, every shard led and writable).
    Prints what the seeds exercised; exits 1 on the first failing seed (rerun it alone with
    --start SEED --seeds 1)."""
    logging.disable(logging.CRITICAL)  # a seed logs every fault it survives
    if regions not in (3, 5):
        raise typer.BadParameter("3 or 5", param_hint="--regions")
    started = time.monotonic()
    faults: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for seed in range(start, start + seeds):
        violations = _run(seed, regions, clients, ops, log_only, faults, counts, nodes_per_region)
        if violations:
            typer.echo(f"FAILED seed {seed} ({regions} regions):")
            for violation in violations[:20]:
                typer.echo(f"  {violation}")
            raise typer.Exit(1)
    elapsed_s = time.monotonic() - started
    kind = "log-only" if log_only else f"whole-plane, {regions} regions"
    if nodes_per_region > 1 and not log_only:
        kind += f" of {nodes_per_region} nodes"
    typer.echo(
        f"sim ({kind}): {seeds} seeds ({start}..{start + seeds - 1}) passed in {elapsed_s:.1f}s"
    )
    typer.echo("  exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    typer.echo("  faults: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))


def _run(
    seed: int,
    regions: int,
    clients: int,
    ops: int,
    log_only: bool,
    faults: Counter[str],
    counts: Counter[str],
    nodes_per_region: int = 1,
) -> list[str]:
    if log_only:
        from eventlog.sim import run_seed

        result = run_seed(seed, clients=clients, ops_per_client=ops)
        counts.update(
            acked_events=result.acked_events,
            committed_entries=result.committed_entries,
            leader_changes=result.leader_changes,
        )
        faults["faults"] += result.faults
        return result.violations
    from services.plane_sim import run_plane_seed

    plane = run_plane_seed(
        seed, regions=regions, clients=clients, ops=ops, nodes_per_region=nodes_per_region
    )
    faults.update(plane.faults)
    per_seed_times = ("recovered_in_ms", "control_led_in_ms")
    counts.update({k: v for k, v in plane.counts.items() if k not in per_seed_times})
    return plane.violations
