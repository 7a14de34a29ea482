"""Fault proxy with real sockets on 127.0.0.1: pass, delay, drop, cut, heal, large transfers."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from services.local.faultproxy import FaultProxy, ProxyRules, ProxySpec

# A read that must NOT complete gets this long; a timeout is the expected outcome.
BLACK_HOLE_WAIT_S = 0.3
# A read that must complete gets a generous bound so a slow CI box never flakes.
MUST_ARRIVE_S = 10.0


@asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
            writer.write_eof()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def proxy_to(port: int, **limits: int) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(ProxySpec("a->b", 0, "127.0.0.1", port), **limits)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def roundtrip(port: int, payload: bytes) -> bytes:
    async with connect(port) as (reader, writer):
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), MUST_ARRIVE_S)


async def test_bytes_pass_unchanged_both_ways() -> None:
    async with echo_server() as target, proxy_to(target) as proxy:
        payload = bytes(range(256)) * 100
        assert await roundtrip(proxy.port, payload) == payload
        async with connect(proxy.port) as (reader, writer):
            writer.write(b"half-close")
            writer.write_eof()
            # The EOF reaches the echo server through the proxy and its EOF comes back.
            assert await asyncio.wait_for(reader.read(), MUST_ARRIVE_S) == b"half-close"


async def test_delay_adds_latency_each_way() -> None:
    async with echo_server() as target, proxy_to(target) as proxy:
        proxy.set_rules(ProxyRules(up_delay_ms=100, down_delay_ms=50))
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await roundtrip(proxy.port, b"ping") == b"ping"
        assert loop.time() - started >= 0.150


async def test_delay_keeps_order_when_lowered_midstream() -> None:
    async with echo_server() as target, proxy_to(target) as proxy:
        proxy.set_rules(ProxyRules(up_delay_ms=200))
        async with connect(proxy.port) as (reader, writer):
            writer.write(b"first-")
            await writer.drain()
            await asyncio.sleep(0.05)
            proxy.set_rules(ProxyRules())  # "second" would be due before "first"
            writer.write(b"second")
            await writer.drain()
            got = await asyncio.wait_for(reader.readexactly(12), MUST_ARRIVE_S)
            assert got == b"first-second"


@pytest.mark.parametrize("direction", ["up", "down"])
async def test_drop_black_holes_then_heal_delivers(direction: str) -> None:
    async with echo_server() as target, proxy_to(target) as proxy:
        proxy.set_rules(ProxyRules(**{direction: "drop"}))  # type: ignore[arg-type]
        async with connect(proxy.port) as (reader, writer):
            writer.write(b"hello")
            await writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(5), BLACK_HOLE_WAIT_S)
            proxy.set_rules(ProxyRules())
            # Nothing was discarded: the stream resumes intact.
            assert await asyncio.wait_for(reader.readexactly(5), MUST_ARRIVE_S) == b"hello"


async def test_cut_resets_existing_and_new_connections_and_heal_restores() -> None:
    async with echo_server() as target, proxy_to(target) as proxy:
        async with connect(proxy.port) as (reader, writer):
            writer.write(b"x")
            assert await asyncio.wait_for(reader.readexactly(1), MUST_ARRIVE_S) == b"x"
            proxy.set_rules(ProxyRules(up="cut"))
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(reader.read(1), MUST_ARRIVE_S)
        assert proxy.connections_active == 0
        async with connect(proxy.port) as (reader, writer):
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(reader.read(1), MUST_ARRIVE_S)
        assert proxy.stats.connections_refused >= 1
        proxy.set_rules(ProxyRules())
        assert await roundtrip(proxy.port, b"back") == b"back"


async def test_large_transfer_is_intact_and_buffers_stay_bounded() -> None:
    buffer_bytes_max, chunk_bytes_max = 128 << 10, 16 << 10
    payload = os.urandom(8 << 20)
    async with (
        echo_server() as target,
        proxy_to(
            target, buffer_bytes_max=buffer_bytes_max, chunk_bytes_max=chunk_bytes_max
        ) as proxy,
    ):
        # A delay makes chunks pile up: the bound, not the delay, must limit the buffer.
        proxy.set_rules(ProxyRules(up_delay_ms=20, down_delay_ms=20))
        async with connect(proxy.port) as (reader, writer):

            async def send() -> None:
                writer.write(payload)
                await writer.drain()
                writer.write_eof()

            sender = asyncio.create_task(send())
            received = await asyncio.wait_for(reader.read(-1), 60)
            await sender
        assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
        assert 0 < proxy.stats.queued_bytes_peak <= buffer_bytes_max + chunk_bytes_max


async def test_unreachable_target_resets_caller() -> None:
    async with echo_server() as target:
        pass  # closed again: nothing listens on `target` now
    async with proxy_to(target) as proxy, connect(proxy.port) as (reader, _):
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), MUST_ARRIVE_S)
