"""``convplane node``: run one region node."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def node(
    cluster_file: Annotated[Path, typer.Option(help="The cluster file (JSON).", exists=True)],
    region: Annotated[str, typer.Option(help="This node's region, as named in the file.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the client listener.")] = 8700,
    peer_port: Annotated[
        int | None, typer.Option(help="Port of the peer listener (other nodes only).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="One of debug, info, warning, error.")] = "info",
    node_index: Annotated[
        int | None,
        typer.Option(
            help="Which of the region's nodes this is: 0 at its url, 1.. its more_nodes "
            "(default: CONVPLANE_NODE_INDEX, else 0).",
            min=0,
        ),
    ] = None,
) -> None:
    """Run one region node: public API, forwarding, leadership of its shards."""
    from services.bootstrap.serve import run_node
    from services.config import NodeSettings
    from services.deploy.compose_secrets import refuse_demo_secrets

    try:
        settings = NodeSettings(region=region, cluster_file=cluster_file)
        if node_index is not None:
            settings = NodeSettings.model_validate(
                {**settings.model_dump(exclude_unset=True), "node_index": node_index}
            )
        cluster = settings.load_cluster()
        if not settings.allow_demo_secrets:
            refuse_demo_secrets(cluster)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cluster-file/--region") from exc
    run_node(settings, host=host, port=port, peer_port=peer_port, log_level=log_level)


def register(app: typer.Typer) -> None:
    app.command("node")(node)


if __name__ == "__main__":  # ``python -m services.cli.node``: what ``convplane up`` spawns
    typer.run(node)
