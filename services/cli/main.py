"""Entry point of the ``convplane`` command.

Each command group lives in its own module under ``services.cli`` and exposes
``register(app: typer.Typer) -> None``. Modules are imported when ``main()`` runs, never at import
time of this module, so ``import services.cli.main`` stays cheap and side-effect free.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

# One line per command module; add yours here.
COMMAND_MODULES: tuple[str, ...] = (
    "services.cli.plan",
    "services.cli.fault",
    "services.cli.sim_engine",
    "services.cli.node",
    "services.cli.up",
    "services.cli.sim",
    "services.cli.worker",
    "services.cli.replica",
    "services.cli.drill",
    "services.cli.practice",
    "services.cli.status",
    "services.cli.readiness",
    "services.cli.config_ref",
    "services.cli.keys",
    "services.cli.backup",
)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="convplane",
        help="Multi-region conversation state and failover control plane for LLM chat serving.",
        no_args_is_help=True,
        add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    )
    app.callback()(_global_options)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    return app


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"convplane {version('convplane')}")
        raise typer.Exit(0)


def _global_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Multi-region conversation state and failover control plane for LLM chat serving.

    Exit codes: 0 done; 1 done, outcome negative (a failed drill, an infeasible plan);
    2 usage; 3 the plane refused the request; 4 the plane could not answer."""


def main() -> None:
    from services.deploy.installation import installation_problems

    if problems := installation_problems():
        lines = "\n".join(f"  - {p}" for p in problems)
        sys.exit(f"convplane cannot run with these packages:\n{lines}")
    build_app()()


if __name__ == "__main__":  # ``python -m services.cli.main``: what the local plane spawns
    main()
