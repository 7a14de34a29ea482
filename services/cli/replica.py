"""``convplane replica status | rebuild``: replica identities, quarantine, rebuild and re-admit.

Both read the cluster file for every region's database and talk to the databases directly (an
operator's credentials), so they work while nodes are down. See ``eventlog.identity`` for when a
replica is quarantined and ``eventlog.rebuild`` for what a rebuild copies and from where.
"""

from __future__ import annotations

import asyncio
import json
import random
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import typer

ClusterFile = Annotated[Path, typer.Option(help="the cluster file (JSON)", exists=True)]


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
    region: Annotated[str, typer.Option(help="the quarantined region to rebuild")],
) -> None:
    """Copy every shard's log into REGION's replica from a quorum of the others, then re-admit
    it (a new registry generation): nodes count its votes and acks again after their next
    sweep. Safe to run again; needs N - W + 1 other replicas reachable."""
    report = asyncio.run(_rebuild(cluster_file, region))
    typer.echo(json.dumps(report, indent=2, sort_keys=True))


async def _status(cluster_file: Path) -> dict[str, Any]:
    from eventlog.node import LogNode

    async with _stores(cluster_file) as (stores, config):
        node = LogNode(
            region=next(iter(stores)),
            replicas=stores,
            config=config,
            clock=_clock(),
            rng=random.Random(),
        )
        await node.verify_replicas()
        return {
            region: {
                "state": v.state,
                "expected": v.expected.store_id if v.expected else None,
                "generation": v.expected.generation if v.expected else None,
                "found": v.found,
            }
            for region, v in sorted(node.identity.verdicts.items())
        }


async def _rebuild(cluster_file: Path, region: str) -> dict[str, Any]:
    from dataclasses import asdict

    from eventlog.rebuild import rebuild_replica

    async with _stores(cluster_file) as (stores, config):
        report = await rebuild_replica(stores, region, range(config.shard_count + 1), config)
        return asdict(report)


def _clock() -> Any:
    from eventlog.clock import SystemClock

    return SystemClock()


class _stores:
    """Every region's replica store from the cluster file, closed on exit."""

    def __init__(self, cluster_file: Path) -> None:
        self._cluster_file = cluster_file
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> tuple[dict[str, Any], Any]:
        from eventlog.config import LogConfig
        from services.bootstrap import open_replica_stores
        from services.config import load_cluster

        cluster = load_cluster(self._cluster_file)
        stores = await open_replica_stores(cluster, _clock(), self._stack)
        config = LogConfig(shard_count=cluster.shard_count, write_quorum=cluster.write_quorum)
        return stores, config

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
