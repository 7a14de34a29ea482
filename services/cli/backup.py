"""``convplane backup`` and ``convplane restore``: a region's replica of a local plane
(``services.local.backup``; docs/upgrade-backup-restore.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Region = Annotated[str, typer.Argument(help="The region's name, as cluster.json has it.")]
StateDir = Annotated[Path, typer.Option(help="The plane's state dir.")]


def backup(
    region: Region,
    to: Annotated[Path, typer.Option(help="A new (or empty) directory for the backup.")],
    state_dir: StateDir = Path(".state/plane"),
) -> None:
    """Copy REGION's replica (SQLite file, or PostgreSQL cluster by pg_basebackup),
    consistently, while the plane runs."""
    from services.local.backup import backup_region
    from services.local.plane import PlaneError

    try:
        manifest = backup_region(state_dir, region, to)
    except PlaneError as exc:
        typer.echo(f"could not back up {region}: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(
        f"backed up {region} (store {manifest.store_id}, schema {manifest.schema_revision}) to {to}"
    )


def restore(
    region: Region,
    from_: Annotated[Path, typer.Option("--from", help="A backup made by convplane backup.")],
    state_dir: StateDir = Path(".state/plane"),
) -> None:
    """Put REGION's replica back from a backup (its node stopped). Where the backup is behind
    what the other replicas know it held, REGION is quarantined first; rebuild it after."""
    from services.local.backup import restore_region
    from services.local.plane import PlaneError

    try:
        report = restore_region(state_dir, region, from_)
    except PlaneError as exc:
        typer.echo(f"could not restore {region}: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"restored {region} from {from_}")
    if report.quarantined:
        shard, (held, status) = min(report.behind.items())
        typer.echo(
            f"the backup is behind on {len(report.behind)} shard(s) (shard {shard}: it ends at "
            f"epoch {status.last_epoch} lsn {status.last_lsn}, the others know it held epoch "
            f"{held.epoch} lsn {held.lsn}): {region} is quarantined"
        )
    typer.echo(f"next: convplane restart-region {region} --state-dir {state_dir}")
    if report.quarantined:
        typer.echo(
            f"then: convplane replica rebuild --cluster-file {report.operator_cluster_file} "
            f"--region {region}"
        )


def register(app: typer.Typer) -> None:
    app.command("backup")(backup)
    app.command("restore")(restore)
