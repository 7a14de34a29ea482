"""Running one region node: the app from ``services.api`` on two listeners, on uvloop.

The client listener (``port``) serves the app to anyone; the peer listener (``peer_port``, when
given and the cluster has a peer secret) serves the same app to other nodes only, with limits of
its own; both are the node's own HTTP/1.1 server (``services.listeners``, which says why), and
what each lets through is ``services.bootstrap.listener_gates``'s. A peer listener without TLS
trusts the peer secret alone, so it is bound to loopback only (``PLAIN_PEER_HOST``), whatever
``host`` says, and the node says so loudly at start. The app's lifespan
(``services.asgi_lifespan``) opens before the listeners and closes after them: SIGTERM or SIGINT
stops accepting, lets in-flight requests finish and then runs the lifespan's shutdown (leaders
resign, stores close). So ``convplane up`` can stop a node with SIGTERM.
"""

from __future__ import annotations

import asyncio
import gc
import io
import ipaddress
import logging
import resource
import signal
import ssl
from dataclasses import dataclass

import uvloop  # the event loop and its transports in C (a node spends most of its time there)
from fastapi import FastAPI

from services.asgi_lifespan import Lifespan
from services.bootstrap.app import create_app
from services.bootstrap.listener_gates import ClientListenerGate, PeerListenerGate
from services.cluster_tls import node_tls, server_ssl_context
from services.config import NodeSettings
from services.listeners import Listener, ListenerConfig
from services.logs import configure_logging

log = logging.getLogger("convplane.node")

#: seconds a stopping node waits for in-flight requests before closing their connections
GRACEFUL_SHUTDOWN_S = 10
#: file descriptors a node needs beyond its listeners' connections (databases, peers, logs)
FDS_RESERVED = 256
#: allocations between two young-generation collections (CPython's default is 700)
GC_YOUNG_THRESHOLD = 10_000
#: frames of each task's stack that SIGUSR1 logs
TASK_STACK_FRAMES = 16
#: where a peer listener without TLS listens: it trusts the peer secret alone, so only
#: processes of this machine may reach it (docs/security.md)
PLAIN_PEER_HOST = "127.0.0.1"


def run_node(
    settings: NodeSettings,
    *,
    host: str,
    port: int,
    peer_port: int | None = None,
    log_level: str = "info",
) -> None:
    configure_logging(settings.region, log_level)  # JSON lines, no secrets (services.logs)
    # SIGUSR1 asks for the task stacks (_log_task_stacks, once serving); until then it must not
    # kill the node (its default action)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    cluster = settings.load_cluster()
    _raise_fd_limit(settings.client_connections_max + settings.peer_connections_max)
    app = create_app(settings)
    _settle_heap()
    client_limits = ListenerConfig(
        "client",
        settings.client_connections_max,
        settings.header_timeout_s,
        settings.header_bytes_max,
        settings.send_timeout_s,
    )
    client = Listener(ClientListenerGate(app), client_limits, lane=app.fast_lane)
    binds = [_Bind(client, host, port, None)]
    if peer_port is None or cluster.peer_secret is None:
        if len(cluster.regions) > 1:  # the client listener serves no peer endpoint
            raise SystemExit(
                "a node of a cluster of several regions needs --peer-port and a "
                "peer_secret in the cluster file"
            )
    else:
        tls = node_tls(settings)
        peer_host = peer_listener_host(host, tls=tls is not None)
        if tls is None:
            log.warning(
                "NO TLS FILES: the peer listener trusts the peer secret alone and carries "
                "bearer keys and the secret in clear; it listens on %s:%d only (loopback), so "
                "peers on other machines cannot reach it. Give every node tls_ca_file, "
                "tls_cert_file and tls_key_file for a cluster across machines "
                "(docs/security.md).",
                peer_host,
                peer_port,
            )
        gate = PeerListenerGate(
            app,
            peer_secret=cluster.peer_secret,
            regions=[r.name for r in cluster.regions],
            tls=tls is not None,
        )
        peer_limits = ListenerConfig(
            "peer",
            settings.peer_connections_max,
            settings.header_timeout_s,
            settings.header_bytes_max,
        )
        ssl_context = server_ssl_context(tls) if tls is not None else None
        binds.append(_Bind(Listener(gate, peer_limits), peer_host, peer_port, ssl_context))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(app, binds))


@dataclass(frozen=True)
class _Bind:
    listener: Listener
    host: str
    port: int
    ssl_context: ssl.SSLContext | None


async def _serve(app: FastAPI, binds: list[_Bind]) -> None:
    """The app's lifespan around its listeners, until SIGTERM or SIGINT: then no new
    connection, the requests under way finish (``GRACEFUL_SHUTDOWN_S`` at most) and the
    lifespan's shutdown runs (leaders resign, stores close)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    lifespan = Lifespan(app)
    await lifespan.startup()
    try:
        for bind in binds:
            bind.listener.state = lifespan.state
            await bind.listener.start(bind.host, bind.port, bind.ssl_context)
        loop.add_signal_handler(signal.SIGUSR1, _log_task_stacks)
        await stop.wait()
        log.info("stopping: no new connections, answering those under way")
    finally:
        listeners = [bind.listener for bind in binds]
        for listener in listeners:
            listener.stop_accepting()
        try:
            async with asyncio.timeout(GRACEFUL_SHUTDOWN_S):
                await asyncio.gather(*(listener.drained() for listener in listeners))
        except TimeoutError:
            log.error("requests still under way after %d s: cancelled", GRACEFUL_SHUTDOWN_S)
            for listener in listeners:
                listener.abort()
        await lifespan.shutdown()


def peer_listener_host(host: str, *, tls: bool) -> str:
    """Where the peer listener listens: ``host``, except that without TLS (the secret alone is
    trusted) anything but a loopback address becomes ``PLAIN_PEER_HOST``."""
    if tls:
        return host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return host if loopback else PLAIN_PEER_HOST


def _log_task_stacks() -> None:
    """On SIGUSR1: log what every task of the node is waiting on (its coroutine stack), the
    first thing to look at in a node that answers but no longer makes progress somewhere."""
    for task in asyncio.all_tasks():
        stack = io.StringIO()
        task.print_stack(limit=TASK_STACK_FRAMES, file=stack)
        log.warning("task %s: %s", task.get_name(), stack.getvalue())


def _settle_heap() -> None:
    """Keep the garbage collector off the hot path.

    Everything imported and built so far (FastAPI, pydantic, SQLAlchemy, the app) lives as long
    as the node, yet every full collection walked all of it again; and at CPython's default a
    young collection ran every 700 allocations, a few times per request. Together they cost
    about a tenth of a node's CPU under load (``python -m bench.rest --py-spy``). ``freeze``
    moves the startup heap out of the collector's sight; the larger young threshold lets short
    lived request objects die by reference count before a collection looks at them. Garbage
    cycles are still collected, later.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def _raise_fd_limit(connections_max: int) -> None:
    """Each connection is a file descriptor: past the soft limit ``accept`` fails for every
    listener at once (the peer listener too), so raise it as far as the node's bounds need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections_max + FDS_RESERVED
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < connections_max + FDS_RESERVED:
        log.warning(
            "file descriptor limit %d is below the connection bounds (%d + %d)",
            soft,
            connections_max,
            FDS_RESERVED,
        )
