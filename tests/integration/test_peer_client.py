"""The nodes' pooled peer client (``services.bootstrap.node.peer_client``) on a loopback
socket: it reuses a kept connection only well inside a peer listener's idle time, so a write is
never sent on a connection the peer is closing (a write lost that way is ``outcome_unknown``)."""

from __future__ import annotations

import asyncio

from services.bootstrap.node import peer_client
from services.config import NodeSettings
from tests.unit.api_fakes import cluster_config

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def test_a_kept_connection_is_not_reused_near_the_peers_idle_close() -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):  # GETs: no body
                writer.write(ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/healthz"
    # the peer listener closes a connection idle for 0.4 s: kept ones are reused within 0.2 s
    settings = NodeSettings(region="a", cluster=cluster_config(), header_timeout_s=0.4)
    try:
        async with peer_client(settings) as client:
            for _ in range(2):
                assert (await client.get(url)).status_code == 200
            assert connections == 1  # back to back: the kept connection
            await asyncio.sleep(0.3)  # idle past half the peer's idle time
            assert (await client.get(url)).status_code == 200
            assert connections == 2
    finally:
        server.close()
        await server.wait_closed()
