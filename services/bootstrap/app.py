"""The region node's FastAPI app. ``create_app`` builds nothing but the app; the lifespan opens
the node's runtime and the app's state on it (``services.bootstrap``: ``node.open_runtime``, then
``api.open_api``) and closes them on shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider

from services.api.admission import NodeAdmission
from services.api.append_check import AppendCheck
from services.api.append_outcomes import AppendOutcomes
from services.api.context import AppServices
from services.api.control_routes import control_router, peer_router
from services.api.docs_ui import install_docs
from services.api.drill_routes import drill_peer_router, drill_router
from services.api.errors import install_error_handlers
from services.api.fast_lane import FastLane
from services.api.forward_batch import BATCH_BODY_BYTES_MAX, forward_batch_router
from services.api.key_routes import key_router
from services.api.metrics import Metrics
from services.api.middleware import EdgeMiddleware
from services.api.openapi import install_openapi, operation_id
from services.api.practice_routes import practice_router
from services.api.readiness_routes import readiness_router
from services.api.replay_routes import replay_router
from services.api.routes import ops_router, router
from services.bootstrap.api import open_api
from services.bootstrap.node import RuntimeFactory, open_runtime
from services.config import NodeSettings
from services.console.access import ConsoleAccess
from services.console.routes import install_console
from services.tracing import (
    TRACE_EXCLUDED_URLS,
    TRACE_FLUSH_TIMEOUT_MS,
    NodeTracing,
    install_from_env,
)

DESCRIPTION = """\
Public API of one convplane region node. Any region accepts any request and forwards it to the
region leading the conversation's shard (`X-Convplane-Served-By` names who served it).

The document is the contract: what it calls valid the server accepts, what it calls invalid
the server refuses with 400, and every status an operation can answer is listed with its body.

* Auth: `Authorization: Bearer <api key>`; a key's role (`tenant`, `operator`, `viewer`) says
  what it may call. Node-to-node endpoints (`/peer`) are not part of this document: this port
  answers them 404; other nodes reach them on the peer listener.
* Deadline: `X-Convplane-Deadline-Ms` (default 10000). A read past it gets 504; an append whose
  outcome is unknown at the deadline gets 503 `outcome_unknown` — retry with the same
  `Idempotency-Key`, which is always safe.
* An idempotent retry of an append that committed answers **200** with the original body and
  `Idempotent-Replayed: true` (a fresh append answers 201).
* Errors: `{"error": {"code", "message", "retryable"}}`; 429 and 503 carry `Retry-After`.
  Invalid requests (schema, headers, JSON) are **400** `invalid_request`, never 422. A method a
  path does not take is 405 with `Allow`.
* Admission, before any work: a tenant over its quota gets 429 `quota_exceeded`; a region at its
  (adaptive) concurrency limit with a full queue, or a request queued past its deadline, gets
  503 `overloaded`; a deadline that already passed gets 504 `deadline_exceeded`.
"""


class NodeApp(FastAPI):
    """The region node's app, with the fast lane it was built with: the client listener
    (``services.bootstrap.serve``) hands the lane appends and reads straight from the parser,
    so the lane travels with the app, typed, instead of by name on ``app.state``."""

    def __init__(self, *, fast_lane: FastLane, **fastapi: Any) -> None:
        super().__init__(**fastapi)
        self.fast_lane = fast_lane


def create_app(
    settings: NodeSettings,
    *,
    runtime_factory: RuntimeFactory | None = None,
    tracer_provider: TracerProvider | None = None,
) -> NodeApp:
    """``tracer_provider``: trace with it; None: as the ``OTEL_*`` environment says (off by
    default: ``services.tracing``)."""
    factory = runtime_factory or open_runtime
    provider = tracer_provider or install_from_env(settings.region)
    tracing = NodeTracing(provider, settings.region) if provider is not None else None
    metrics = Metrics(settings.region)
    admission = NodeAdmission(metrics)  # opened in the lifespan, with the runtime's clock
    console_access = ConsoleAccess()  # opened in the lifespan, with the runtime's cluster
    append_outcomes = AppendOutcomes()  # opened in the lifespan, with the runtime's clock
    # opened in the lifespan with the app's state; the client listener hands it appends and
    # reads, the forward batch route its items
    fast_lane = FastLane(
        region=settings.region,
        metrics=metrics,
        admission=admission,
        outcomes=append_outcomes,
        max_body_bytes=settings.max_body_bytes,
        retry_after_default_s=settings.retry_after_default_s,
        check=AppendCheck(),
    )

    opened: list[AppServices] = []  # the services the lifespan opened last (the shard count)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with factory(settings) as runtime:
            try:
                async with open_api(
                    app,
                    settings,
                    runtime,
                    metrics=metrics,
                    tracing=tracing,
                    admission=admission,
                    console_access=console_access,
                    append_outcomes=append_outcomes,
                    fast_lane=fast_lane,
                ) as services:
                    opened[:] = [services]
                    yield
            finally:
                if provider is not None:  # spans still queued go out before the process ends
                    provider.force_flush(TRACE_FLUSH_TIMEOUT_MS)

    app = NodeApp(
        fast_lane=fast_lane,
        title=f"convplane region node ({settings.region})",
        description=DESCRIPTION,
        version="0.1.0",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        docs_url=None,  # install_docs: the page's assets from a package, not a CDN
        redoc_url=None,
    )
    install_openapi(app, lambda: opened[0].api.cluster.shard_count if opened else None)
    install_error_handlers(app, settings.retry_after_default_s, metrics.count_error)
    app.include_router(router)
    app.include_router(ops_router)
    app.include_router(control_router)
    app.include_router(peer_router)
    app.include_router(forward_batch_router(fast_lane))
    app.include_router(replay_router)
    app.include_router(drill_router)
    app.include_router(readiness_router)
    app.include_router(practice_router)
    app.include_router(key_router)
    app.include_router(drill_peer_router)
    app.add_middleware(
        EdgeMiddleware,
        region=settings.region,
        metrics=metrics,
        max_body_bytes=settings.max_body_bytes,
        admission=admission,
        retry_after_s=settings.retry_after_default_s,
        body_read_timeout_s=settings.body_read_timeout_s,
        discard_body_max_bytes=settings.discard_body_max_bytes,
        send_timeout_s=settings.send_timeout_s,
        peer_body_bytes_max=BATCH_BODY_BYTES_MAX,
    )
    install_console(app, console_access, append_outcomes)
    install_docs(app)
    if provider is not None:
        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=provider,
            excluded_urls=TRACE_EXCLUDED_URLS,
            exclude_spans=["receive", "send"],  # one span per request, not one per ASGI message
        )
    return app
