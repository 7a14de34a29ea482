"""Where a browser reaches each region, and the cross-origin reads and writes the console needs.

The console reads every region directly from the browser (``services.console.routes`` says
why), so a page served by one node calls the others: a cross-origin request with an
``Authorization`` header, which the browser sends only after a CORS preflight the node allows.
Starlette's ``CORSMiddleware`` does the protocol; this module decides the allowed origins:
exactly the origins of the cluster's regions as a browser reaches them (``browser_urls``), no
wildcard. The API takes bearer keys, never cookies, so a foreign page gains nothing it could not
do with curl; the list only keeps other sites from reading the unauthenticated endpoints
(``/healthz``, ``/metrics``) through an operator's browser.

The cluster is known only once the lifespan opened the node's runtime, after the middleware
stack was built, hence ``ConsoleAccess.open`` (the pattern of ``NodeAdmission``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from eventlog.http_headers import DEADLINE_HEADER, SERVED_BY_HEADER
from services.config import ClusterConfig, NodeSettings

#: what the console sends cross-origin
CORS_METHODS = ("GET", "POST", "DELETE")
CORS_HEADERS = ("authorization", "content-type", DEADLINE_HEADER.lower())
CORS_EXPOSED = (SERVED_BY_HEADER.lower(), "retry-after")
#: how long a browser may cache a preflight's answer
CORS_MAX_AGE_S = 600


def browser_urls(cluster: ClusterConfig, settings: NodeSettings) -> dict[str, str]:
    """Each region's client URL as a browser reaches it: ``console_urls`` where given (docker
    compose publishes nodes on host ports), else the cluster file's ``url``."""
    return {r.name: settings.console_urls.get(r.name, r.url).rstrip("/") for r in cluster.regions}


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class ConsoleAccess:
    """The allowed origins, known from ``open`` on."""

    def __init__(self) -> None:
        self.urls: dict[str, str] = {}
        self.origins: tuple[str, ...] = ()
        #: the operators' dashboard, linked from the page when configured
        self.dashboard_url: str | None = None

    def open(self, cluster: ClusterConfig, settings: NodeSettings) -> None:
        self.urls = browser_urls(cluster, settings)
        self.dashboard_url = settings.dashboard_url
        cluster_origins = {origin_of(r.url) for r in cluster.regions}
        self.origins = tuple(sorted(cluster_origins | {origin_of(u) for u in self.urls.values()}))


class ConsoleCorsMiddleware:
    """Starlette's CORS middleware over the origins ``ConsoleAccess`` opened with (before
    ``open``, no request is served cross-origin)."""

    def __init__(self, app: ASGIApp, *, access: ConsoleAccess) -> None:
        self.app = app
        self.access = access
        self._cors: CORSMiddleware | None = None
        self._cors_origins: tuple[str, ...] = ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._cors is None or self._cors_origins != self.access.origins:
            self._cors_origins = self.access.origins
            self._cors = CORSMiddleware(
                self.app,
                allow_origins=self._cors_origins,
                allow_methods=CORS_METHODS,
                allow_headers=CORS_HEADERS,
                expose_headers=CORS_EXPOSED,
                max_age=CORS_MAX_AGE_S,
            )
        await self._cors(scope, receive, send)
