"""Entry point of the ``convplane`` command.

Each command group lives in its own module under ``services.cli`` and exposes
``register(app: typer.Typer) -> None``. Modules are imported when ``main()`` runs, never at import
time of this module, so ``import services.cli.main`` stays cheap and side-effect free.
"""

from __future__ import annotations

import importlib

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
    "services.cli.keys",
)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="convplane",
        help="Multi-region conversation state and failover control plane for LLM chat serving.",
        no_args_is_help=True,
        add_completion=False,
    )
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    return app


def main() -> None:
    build_app()()
