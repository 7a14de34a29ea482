"""``convplane fault ...``: run fault proxies (``services.local.faultproxy``) and change their rules.

``fault serve --config F`` runs a proxy set and its admin API in one process. F is JSON: either a
list of ``{"name": "eu->us", "listen_port": 7101, "target": "127.0.0.1:8002"}`` or an object
``{"admin_port": 7070, "proxies": [...]}``. The other commands talk to a running admin API (routes
in ``services.local.faultproxy``'s docstring). starlette, uvicorn and httpx are imported inside the
functions that need them, so other ``convplane`` commands do not pay for them at start-up.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eventlog.errors import ConvplaneError
from services.local.faultproxy import (
    FaultProxy,
    FaultProxySet,
    FaultRuleError,
    ProxySpec,
    rules_from_json,
)

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse

ADMIN_URL_DEFAULT = "http://127.0.0.1:7070"
ADMIN_PORT_DEFAULT = 7070
ADMIN_TIMEOUT_S = 5.0

fault_app = typer.Typer(
    name="fault",
    help="Fault proxies for drills: delay, black-hole, cut links.",
    no_args_is_help=True,
)
AdminUrl = Annotated[
    str,
    typer.Option("--admin", envvar="CONVPLANE_FAULT_ADMIN", help="Admin API URL of `fault serve`."),
]


def register(app: typer.Typer) -> None:
    app.add_typer(fault_app)


# --- admin HTTP API ----------------------------------------------------------------------------


def _error(exc: ConvplaneError) -> JSONResponse:
    from starlette.responses import JSONResponse

    return JSONResponse(exc.to_body(), status_code=exc.http_status)


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise FaultRuleError("body must be JSON") from exc
    if not isinstance(body, dict):
        raise FaultRuleError("body must be a JSON object")
    return body


def _partition_args(body: dict[str, Any]) -> tuple[str, list[str] | None, str]:
    region, peers, direction = body.get("region"), body.get("peers"), body.get("direction", "both")
    if not isinstance(region, str):
        raise FaultRuleError("region must be a string")
    if peers is not None and not (
        isinstance(peers, list) and all(isinstance(p, str) for p in peers)
    ):
        raise FaultRuleError("peers must be a list of region names or null")
    if not isinstance(direction, str):
        raise FaultRuleError("direction must be a string")
    return region, peers, direction


def create_admin_app(proxies: FaultProxySet) -> Starlette:
    """The admin API over ``proxies``; every error is the project's JSON error body."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def list_proxies(_: Request) -> JSONResponse:
        return JSONResponse({"proxies": [proxies[n].describe() for n in proxies.names]})

    async def one_proxy(request: Request) -> JSONResponse:
        try:
            proxy = proxies[request.path_params["name"]]
            if request.method == "PUT":
                proxy.set_rules(rules_from_json(proxy.rules, await _json_object(request)))
            return JSONResponse(proxy.describe())
        except ConvplaneError as exc:
            return _error(exc)

    async def partition(request: Request) -> JSONResponse:
        try:
            region, peers, direction = _partition_args(await _json_object(request))
            return JSONResponse({"partitioned": proxies.partition(region, peers, direction)})
        except ConvplaneError as exc:
            return _error(exc)

    async def heal(_: Request) -> JSONResponse:
        return JSONResponse({"healed": proxies.heal()})

    return Starlette(
        routes=[
            Route("/proxies", list_proxies, methods=["GET"]),
            Route("/proxies/{name}", one_proxy, methods=["GET", "PUT"]),
            Route("/partition", partition, methods=["POST"]),
            Route("/heal", heal, methods=["POST"]),
        ]
    )


def build_admin_server(proxies: FaultProxySet) -> uvicorn.Server:
    import uvicorn

    config = uvicorn.Config(create_admin_app(proxies), log_level="warning", lifespan="off")
    return uvicorn.Server(config)


def load_config(text: str) -> tuple[list[ProxySpec], int | None]:
    """Proxy specs and the admin port (if the file names one) from the config JSON."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FaultRuleError(f"config is not JSON: {exc}") from exc
    admin_port = None
    if isinstance(data, dict):
        admin_port = data.get("admin_port")
        data = data.get("proxies")
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise FaultRuleError("config must be a list of proxies or {'proxies': [...]}")
    specs = [ProxySpec.from_json(item) for item in data]
    if len({s.name for s in specs}) != len(specs):
        raise FaultRuleError("proxy names must be unique")
    return specs, int(admin_port) if admin_port is not None else None


async def run_fault_proxies(specs: list[ProxySpec], admin_host: str, admin_port: int) -> None:
    """Run the proxies and the admin API until interrupted."""
    proxies = FaultProxySet(FaultProxy(spec) for spec in specs)
    await proxies.start()
    admin_socket = socket.create_server((admin_host, admin_port), reuse_port=False)
    try:
        await build_admin_server(proxies).serve(sockets=[admin_socket])
    finally:
        admin_socket.close()
        await proxies.close()


# --- commands ----------------------------------------------------------------------------------


@fault_app.command("serve")
def serve_command(
    config: Annotated[Path, typer.Option(help="JSON file of proxies (see `convplane fault`).")],
    admin_host: Annotated[str, typer.Option(help="Address of the admin API.")] = "127.0.0.1",
    admin_port: Annotated[int | None, typer.Option(help="Port of the admin API.")] = None,
) -> None:
    """Run the proxies of CONFIG and the admin API that changes their rules."""
    try:
        specs, file_admin_port = load_config(config.read_text())
    except (OSError, FaultRuleError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc
    port = admin_port if admin_port is not None else file_admin_port or ADMIN_PORT_DEFAULT
    typer.echo(f"{len(specs)} proxies; admin API on http://{admin_host}:{port}")
    asyncio.run(run_fault_proxies(specs, admin_host, port))


def _call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    import httpx

    try:
        response = httpx.request(method, url, json=body, timeout=ADMIN_TIMEOUT_S)
    except httpx.HTTPError as exc:
        typer.echo(f"cannot reach the fault admin API at {url}: {exc}", err=True)
        raise typer.Exit(1) from exc
    if response.status_code >= 400:
        typer.echo(f"{response.status_code}: {response.text}", err=True)
        raise typer.Exit(1)
    return response.json()


@fault_app.command("set")
def set_command(
    name: Annotated[str, typer.Argument(help="Proxy name, e.g. eu->us.")],
    admin: AdminUrl = ADMIN_URL_DEFAULT,
    delay_ms: Annotated[float | None, typer.Option(help="Added latency, each direction.")] = None,
    up: Annotated[str | None, typer.Option(help="Client->target: pass, drop or cut.")] = None,
    down: Annotated[str | None, typer.Option(help="Target->client: pass, drop or cut.")] = None,
) -> None:
    """Change one proxy's rules (options not given keep their value)."""
    fields = {"delay_ms": delay_ms, "up": up, "down": down}
    body = {key: value for key, value in fields.items() if value is not None}
    typer.echo(json.dumps(_call("PUT", f"{admin.rstrip('/')}/proxies/{name}", body), indent=2))


@fault_app.command("partition")
def partition_command(
    region: Annotated[str, typer.Argument(help="Region to cut off.")],
    admin: AdminUrl = ADMIN_URL_DEFAULT,
    peer: Annotated[
        list[str] | None, typer.Option(help="Peer to cut off from (repeat); default all.")
    ] = None,
    direction: Annotated[str, typer.Option(help="One of both, in, out.")] = "both",
) -> None:
    """Black-hole the links between REGION and its peers (links named <from>-><to>)."""
    body = {"region": region, "peers": peer or None, "direction": direction}
    typer.echo(json.dumps(_call("POST", f"{admin.rstrip('/')}/partition", body)))


@fault_app.command("heal")
def heal_command(admin: AdminUrl = ADMIN_URL_DEFAULT) -> None:
    """Every proxy back to pass with no delay."""
    typer.echo(json.dumps(_call("POST", f"{admin.rstrip('/')}/heal")))


@fault_app.command("status")
def status_command(admin: AdminUrl = ADMIN_URL_DEFAULT) -> None:
    """Every proxy, its rules and its counters."""
    typer.echo(json.dumps(_call("GET", f"{admin.rstrip('/')}/proxies"), indent=2))
