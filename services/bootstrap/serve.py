"""Running one region node: the app from ``services.api`` under uvicorn, on two listeners.

The client listener (``port``) runs the app's lifespan; the peer listener (``peer_port``, when
given and the cluster has a peer secret) serves the same app to other nodes only, with limits of
its own (``services.listeners``); what each lets through is ``services.bootstrap.listener_gates``'s. A
peer listener without TLS trusts the peer secret alone, so it is bound to loopback only
(``PLAIN_PEER_HOST``), whatever ``host`` says, and the node says so loudly at start. uvicorn handles SIGTERM/SIGINT on the client listener by
finishing in-flight requests and running the lifespan's shutdown (leaders resign, stores close);
the peer listener stops with it. So ``convplane up`` can stop a node with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import ipaddress
import logging
import resource
import signal
from collections.abc import Iterator

import uvicorn

from services.bootstrap.app import create_app
from services.bootstrap.listener_gates import ClientListenerGate, PeerListenerGate
from services.cluster_tls import node_tls, server_ssl_options
from services.config import NodeSettings
from services.listeners import ListenerConfig, guarded_protocol
from services.logs import configure_logging

log = logging.getLogger("convplane.node")

#: seconds uvicorn waits for in-flight requests at shutdown before closing connections
GRACEFUL_SHUTDOWN_S = 10
#: uvloop: the event loop and its transports in C (a node spends most of its time in them)
EVENT_LOOP = "uvloop"
#: file descriptors a node needs beyond its listeners' connections (databases, peers, logs)
FDS_RESERVED = 256
#: allocations between two young-generation collections (CPython's default is 700)
GC_YOUNG_THRESHOLD = 10_000
#: frames of each task's stack that SIGUSR1 logs
TASK_STACK_FRAMES = 16
#: where a peer listener without TLS listens: it trusts the peer secret alone, so only
#: processes of this machine may reach it (docs/security.md)
PLAIN_PEER_HOST = "127.0.0.1"


class _PeerServer(uvicorn.Server):
    """The peer listener's server: signals are the client listener's to handle."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run_node(
    settings: NodeSettings,
    *,
    host: str,
    port: int,
    peer_port: int | None = None,
    log_level: str = "info",
) -> None:
    configure_logging(settings.region, log_level)  # JSON lines, no secrets (services.logs)
    # SIGUSR1 asks for the task stacks (_log_task_stacks, once serving); until then, and on a
    # node without a peer listener, it must not kill the node (its default action)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    cluster = settings.load_cluster()
    _raise_fd_limit(settings.client_connections_max + settings.peer_connections_max)
    app = create_app(settings)
    _settle_heap()
    client = uvicorn.Server(
        uvicorn.Config(
            ClientListenerGate(app),
            host=host,
            port=port,
            log_config=None,  # uvicorn's loggers propagate to the JSON handler
            log_level=log_level,
            access_log=False,
            proxy_headers=False,  # no proxy in front of a node: nothing to rewrite per request
            loop=EVENT_LOOP,
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            timeout_keep_alive=int(settings.header_timeout_s) or 1,
            http=guarded_protocol(
                ListenerConfig(
                    "client",
                    settings.client_connections_max,
                    settings.header_timeout_s,
                    settings.header_bytes_max,
                    settings.send_timeout_s,
                ),
                lane=app.state.fast_lane,
            ),
        )
    )
    if peer_port is None or cluster.peer_secret is None:
        if len(cluster.regions) > 1:  # the client listener serves no peer endpoint
            raise SystemExit("a node of a cluster of several regions needs --peer-port and a "
                             "peer_secret in the cluster file")  # fmt: skip
        client.run()
        return
    tls = node_tls(settings)
    peer_host = peer_listener_host(host, tls=tls is not None)
    if tls is None:
        log.warning(
            "NO TLS FILES: the peer listener trusts the peer secret alone and carries bearer "
            "keys and the secret in clear; it listens on %s:%d only (loopback), so peers on "
            "other machines cannot reach it. Give every node tls_ca_file, tls_cert_file and "
            "tls_key_file for a cluster across machines (docs/security.md).",
            peer_host, peer_port,
        )  # fmt: skip
    gate = PeerListenerGate(
        app,
        peer_secret=cluster.peer_secret,
        regions=[r.name for r in cluster.regions],
        tls=tls is not None,
    )
    peer = _PeerServer(
        uvicorn.Config(
            gate,
            host=peer_host,
            port=peer_port,
            log_config=None,
            log_level=log_level,
            access_log=False,
            proxy_headers=False,
            loop=EVENT_LOOP,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            timeout_keep_alive=int(settings.header_timeout_s) or 1,
            http=guarded_protocol(
                ListenerConfig(
                    "peer",
                    settings.peer_connections_max,
                    settings.header_timeout_s,
                    settings.header_bytes_max,
                )
            ),
            **(server_ssl_options(tls) if tls is not None else {}),
        )
    )
    with asyncio.Runner(loop_factory=client.config.get_loop_factory()) as runner:
        runner.run(_serve_both(client, peer))


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


async def _serve_both(client: uvicorn.Server, peer: uvicorn.Server) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _log_task_stacks)
    peer_task = asyncio.create_task(peer.serve(), name="peer-listener")
    try:
        await client.serve()
    finally:
        peer.should_exit = True
        await peer_task


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
        log.warning("file descriptor limit %d is below the connection bounds (%d + %d)",
                    soft, connections_max, FDS_RESERVED)  # fmt: skip
