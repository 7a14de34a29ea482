"""``convplane replica status | rebuild``: replica identities, quarantine, rebuild and re-admit.

Both read the cluster file for every region's database and talk to the databases directly (an
operator's credentials), so they work while nodes are down. See ``eventlog.identity`` for when a
replica is quarantined and ``eventlog.rebuild`` for what a rebuild copies and from where.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

ClusterFile = Annotated[Path, typer.Option(help="The cluster file (JSON).", exists=True)]


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Replica identities: status, rebuild and re-admission.")
    group.command("status")(status)
    group.command("rebuild")(rebuild)
    app.add_typer(group, name="replica")


def status(cluster_file: ClusterFile) -> None:
    """Sweep every replica's identity and registry; print each region's verdict as JSON
    (admitted, quarantined or unknown). Exits 1 when a replica is quarantined."""
    verdicts = asyncio.run(_status(cluster_file))
    typer.echo(json.dumps(verdicts, indent=2, sort_keys=True))
    if any(v["state"] == "quarantined" for v in verdicts.values()):
        raise typer.Exit(1)


def rebuild(
    cluster_file: ClusterFile,
    region: Annotated[str, typer.Option(help="The quarantined region to rebuild.")],
) -> None:
    """Copy every shard's log into REGION's replica from a quorum of the others, then re-admit
    it (a new registry generation): nodes count its votes and acks again after their next
    sweep. Safe to run again; needs N - W + 1 other replicas reachable."""
    report = asyncio.run(_rebuild(cluster_file, region))
    typer.echo(json.dumps(report, indent=2, sort_keys=True))


async def _status(cluster_file: Path) -> dict[str, Any]:
    from services.bootstrap.operator import open_operator_stores, sweep_identities

    async with open_operator_stores(cluster_file) as opened:
        verdicts = await sweep_identities(opened)
        return {
            region: {
                "state": v.state,
                "expected": v.expected.store_id if v.expected else None,
                "generation": v.expected.generation if v.expected else None,
                "found": v.found,
            }
            for region, v in sorted(verdicts.items())
        }


async def _rebuild(cluster_file: Path, region: str) -> dict[str, Any]:
    from dataclasses import asdict

    from eventlog.rebuild import rebuild_replica
    from services.bootstrap.operator import open_operator_stores

    async with open_operator_stores(cluster_file) as opened:
        shards = range(opened.config.shard_count + 1)  # the control shard too
        report = await rebuild_replica(opened.stores, region, shards, opened.config)
        return asdict(report)
