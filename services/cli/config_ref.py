"""``convplane config-reference``: print (or ``--write``) the configuration reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def config_reference(
    write: Annotated[
        Path | None, typer.Option(help="Write it to this file instead of printing it.")
    ] = None,
) -> None:
    """Every setting of the cluster file and of a node, with its type, default and meaning."""
    from services.deploy.config_reference import render

    text = render()
    if write is None:
        typer.echo(text, nl=False)
        return
    write.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {write}")


def register(app: typer.Typer) -> None:
    app.command("config-reference")(config_reference)
