"""``convplane sim``: run seeds of the deterministic log simulation."""

from __future__ import annotations

import time

import typer


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)


def sim(
    seeds: int = typer.Option(100, help="how many seeds to run"),
    start: int = typer.Option(0, help="first seed"),
    clients: int = typer.Option(4, help="concurrent clients per seed"),
    ops: int = typer.Option(20, help="operations per client"),
) -> None:
    """Run the seeded multi-region simulation (faults, leader changes) and check the log's
    invariants: no acknowledged event lost, no divergent committed history, gapless
    per-conversation seqs, at most one committed effect per tool attempt. Exits 1 on the first
    failing seed, printing it (rerun it alone with --start SEED --seeds 1)."""
    from eventlog.sim import run_seed

    started = time.monotonic()
    acked = committed = faults = changes = 0
    for seed in range(start, start + seeds):
        result = run_seed(seed, clients=clients, ops_per_client=ops)
        if not result.ok:
            typer.echo(f"FAILED seed {seed}:")
            for violation in result.violations[:20]:
                typer.echo(f"  {violation}")
            raise typer.Exit(1)
        acked += result.acked_events
        committed += result.committed_entries
        faults += result.faults
        changes += result.leader_changes
    elapsed_s = time.monotonic() - started
    typer.echo(
        f"sim: {seeds} seeds ({start}..{start + seeds - 1}) passed: {acked} acked events, "
        f"{committed} committed entries, {faults} faults, {changes} leader changes, "
        f"{elapsed_s:.1f}s"
    )
