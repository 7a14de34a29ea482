"""Running one region node: the app from ``services.api`` under uvicorn.

uvicorn handles SIGTERM/SIGINT by finishing in-flight requests and running the lifespan's
shutdown (leaders resign, stores close), so ``convplane up`` can stop a node with SIGTERM.
"""

from __future__ import annotations

import logging

import uvicorn

from services.api import create_app
from services.config import NodeSettings

#: seconds uvicorn waits for in-flight requests at shutdown before closing connections
GRACEFUL_SHUTDOWN_S = 10


def run_node(settings: NodeSettings, *, host: str, port: int, log_level: str = "info") -> None:
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s {settings.region} %(name)s %(levelname)s %(message)s",
    )
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # above admission's own bound (limit + queue + peer cap), so admission, not uvicorn's
        # plain-text 503, decides what to shed
        limit_concurrency=settings.max_in_flight
        + settings.admission_queue_max
        + settings.peer_in_flight_max
        + 16,
    )
    uvicorn.Server(config).run()
