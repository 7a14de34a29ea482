"""TCP fault proxy for drills and tests: delay, black-hole and cut links between regions.

A ``FaultProxy`` listens on a local port and relays every connection to one target. Its rules
change at run time, per direction: ``up`` is client -> target, ``down`` is target -> client.

``delay_ms``
    Each chunk is stamped with ``read time + delay`` and delivered no earlier than that, in order,
    from a per-connection, per-direction queue: the delay adds latency without serializing
    throughput (throughput becomes buffer / delay, the bandwidth-delay product).
``drop``
    A black hole, like a partition under TCP: the proxy accepts and keeps reading, but delivers
    nothing in that direction; once its buffer is full the sender's own buffers fill and it
    blocks. Callers hit their timeouts. Nothing is discarded, so after heal the stream resumes
    intact for a peer that has not given up.
``cut``
    Every existing connection is reset (RST to both ends) and new ones are accepted and reset at
    once, so a caller fails fast with ``ConnectionResetError``.
heal
    Back to ``pass`` with no delay.

Bounded: each direction of each connection buffers at most ``buffer_bytes_max`` (plus one chunk
of ``chunk_bytes_max``); reading pauses while the buffer is full. At most ``connections_max``
connections per proxy; the connect to the target has a timeout.

``FaultProxySet`` runs many proxies in one process; ``services.cli.fault.create_admin_app`` is
its HTTP API::

    GET  /proxies                 every proxy and its rules
    GET  /proxies/{name}          one proxy
    PUT  /proxies/{name}          {"delay_ms": 50, "up": "pass|drop|cut", "down": ...}
                                  (partial; ``delay_ms`` sets both ``up_delay_ms`` and
                                  ``down_delay_ms``, which may also be set one by one)
    POST /partition               {"region": "eu", "peers": ["us"] | null, "direction": "both"}
    POST /heal                    every proxy back to pass

Proxies between regions are named ``<from>-><to>``: the link ``from`` uses to reach ``to``.
``partition(region, direction="out")`` black-holes the links ``region`` opens to its peers,
``"in"`` the links peers open to ``region``, ``"both"`` all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from eventlog.errors import InvalidRequest, InvariantViolation, NotFound

Mode = Literal["pass", "drop", "cut"]
Direction = Literal["up", "down"]
MODES: tuple[Mode, ...] = ("pass", "drop", "cut")
PARTITION_DIRECTIONS = ("both", "in", "out")
DELAY_MS_MAX = 600_000.0
_RULE_FIELDS = frozenset({"delay_ms", "up_delay_ms", "down_delay_ms", "up", "down"})


class FaultRuleError(InvalidRequest):
    code = "invalid_fault_rule"


@dataclass(frozen=True, slots=True)
class ProxyRules:
    up: Mode = "pass"
    down: Mode = "pass"
    up_delay_ms: float = 0.0
    down_delay_ms: float = 0.0

    def mode(self, direction: Direction) -> Mode:
        return self.up if direction == "up" else self.down

    def delay_s(self, direction: Direction) -> float:
        return (self.up_delay_ms if direction == "up" else self.down_delay_ms) / 1000.0

    @property
    def cut(self) -> bool:
        return "cut" in (self.up, self.down)

    def to_json(self) -> dict[str, Any]:
        same = self.up_delay_ms == self.down_delay_ms
        return {
            "delay_ms": self.up_delay_ms if same else None,
            "up_delay_ms": self.up_delay_ms,
            "down_delay_ms": self.down_delay_ms,
            "up": self.up,
            "down": self.down,
        }


HEALED = ProxyRules()


def _parse_delay(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultRuleError(f"{field} must be a number")
    if not 0 <= value <= DELAY_MS_MAX:
        raise FaultRuleError(f"{field} must be in [0, {DELAY_MS_MAX:g}]")
    return float(value)


def _parse_mode(field: str, value: object) -> Mode:
    for mode in MODES:
        if value == mode:
            return mode
    raise FaultRuleError(f"{field} must be one of {MODES}, got {value!r}")


def rules_from_json(current: ProxyRules, body: Mapping[str, object]) -> ProxyRules:
    """``current`` with the fields of a PUT body applied (absent fields keep their value)."""
    unknown = set(body) - _RULE_FIELDS
    if unknown:
        raise FaultRuleError(f"unknown fields {sorted(unknown)}; known: {sorted(_RULE_FIELDS)}")
    rules = current
    if "delay_ms" in body:
        delay_ms = _parse_delay("delay_ms", body["delay_ms"])
        rules = dataclasses.replace(rules, up_delay_ms=delay_ms, down_delay_ms=delay_ms)
    if "up_delay_ms" in body:
        rules = dataclasses.replace(
            rules, up_delay_ms=_parse_delay("up_delay_ms", body["up_delay_ms"])
        )
    if "down_delay_ms" in body:
        delay_ms = _parse_delay("down_delay_ms", body["down_delay_ms"])
        rules = dataclasses.replace(rules, down_delay_ms=delay_ms)
    if "up" in body:
        rules = dataclasses.replace(rules, up=_parse_mode("up", body["up"]))
    if "down" in body:
        rules = dataclasses.replace(rules, down=_parse_mode("down", body["down"]))
    return rules


def partition_links(
    region: str,
    link_names: Iterable[str],
    peers: Sequence[str] | None = None,
    direction: str = "both",
) -> list[str]:
    """Names of the ``<from>-><to>`` links that cut ``region`` off from ``peers`` (default: all)."""
    if direction not in PARTITION_DIRECTIONS:
        raise FaultRuleError(f"direction must be one of {PARTITION_DIRECTIONS}, got {direction!r}")
    chosen: list[str] = []
    for name in sorted(link_names):
        source, sep, target = name.partition("->")
        if not sep:
            continue
        outbound = source == region and (peers is None or target in peers)
        inbound = target == region and (peers is None or source in peers)
        if (outbound and direction != "in") or (inbound and direction != "out"):
            chosen.append(name)
    return chosen


@dataclass(frozen=True, slots=True)
class ProxySpec:
    name: str
    listen_port: int  # 0 picks a free port (see FaultProxy.port)
    target_host: str
    target_port: int
    listen_host: str = "127.0.0.1"

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> ProxySpec:
        """``{"name": "eu->us", "listen_port": 7001, "target": "127.0.0.1:5432"}``."""
        try:
            host, _, port = str(item["target"]).rpartition(":")
            return cls(
                name=str(item["name"]),
                listen_port=int(item["listen_port"]),
                target_host=host or "127.0.0.1",
                target_port=int(port),
                listen_host=str(item.get("listen_host", "127.0.0.1")),
            )
        except (KeyError, ValueError) as exc:
            raise FaultRuleError(f"bad proxy spec {dict(item)!r}: {exc}") from exc


@dataclass(slots=True)
class ProxyStats:
    connections_total: int = 0
    connections_refused: int = 0
    queued_bytes_peak: int = 0  # largest buffer of one direction of one connection


class _DelayLine:
    """FIFO of (deliver_at, chunk) holding at most ``bytes_max`` bytes (+ one chunk)."""

    def __init__(self, bytes_max: int, stats: ProxyStats) -> None:
        self._items: deque[tuple[float, bytes]] = deque()
        self._bytes = 0
        self._bytes_max = bytes_max
        self._stats = stats
        self._changed = asyncio.Condition()

    async def put(self, deliver_at: float, chunk: bytes) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._bytes < self._bytes_max)
            self._items.append((deliver_at, chunk))
            self._bytes += len(chunk)
            self._stats.queued_bytes_peak = max(self._stats.queued_bytes_peak, self._bytes)
            self._changed.notify_all()

    async def peek(self) -> tuple[float, bytes]:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            return self._items[0]

    async def pop(self) -> None:
        async with self._changed:
            _, chunk = self._items.popleft()
            self._bytes -= len(chunk)
            self._changed.notify_all()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN: the peer sees ConnectionResetError."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One relayed connection: two directions, each a reader pump and a writer pump."""

    def __init__(
        self,
        proxy: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self._proxy = proxy
        self._client = client
        self._target = target
        self._tasks: list[asyncio.Task[None]] = []
        self._reset_done = False

    async def run(self) -> None:
        proxy = self._proxy
        up = _DelayLine(proxy.buffer_bytes_max, proxy.stats)
        down = _DelayLine(proxy.buffer_bytes_max, proxy.stats)
        self._tasks = [
            asyncio.create_task(self._read(self._client[0], up, "up")),
            asyncio.create_task(self._write(up, self._target[1], "up")),
            asyncio.create_task(self._read(self._target[0], down, "down")),
            asyncio.create_task(self._write(down, self._client[1], "down")),
        ]
        try:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            if not self._reset_done:
                for task in self._tasks:
                    task.cancel()
                for _, writer in (self._client, self._target):
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()

    def reset(self) -> None:
        if self._reset_done:
            return
        self._reset_done = True
        _reset(self._client[1])
        _reset(self._target[1])
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def _read(self, reader: asyncio.StreamReader, line: _DelayLine, d: Direction) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                chunk = await reader.read(self._proxy.chunk_bytes_max)
                await line.put(loop.time() + self._proxy.rules.delay_s(d), chunk)
                if not chunk:  # EOF travels through the line like data, in order
                    return
        except OSError:
            self.reset()

    async def _write(self, line: _DelayLine, writer: asyncio.StreamWriter, d: Direction) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                deliver_at, chunk = await line.peek()
                if (wait_s := deliver_at - loop.time()) > 0:
                    await asyncio.sleep(wait_s)
                await self._proxy.wait_until_passing(d)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
                await line.pop()
        except OSError:
            self.reset()


class FaultProxy:
    def __init__(
        self,
        spec: ProxySpec,
        *,
        buffer_bytes_max: int = 1 << 20,
        chunk_bytes_max: int = 64 << 10,
        connections_max: int = 1024,
        connect_timeout_s: float = 5.0,
    ) -> None:
        if buffer_bytes_max <= 0 or chunk_bytes_max <= 0 or connections_max <= 0:
            raise InvariantViolation("fault proxy limits must be positive")
        self.spec = spec
        self.buffer_bytes_max = buffer_bytes_max
        self.chunk_bytes_max = chunk_bytes_max
        self.connections_max = connections_max
        self.connect_timeout_s = connect_timeout_s
        self.stats = ProxyStats()
        self._rules = HEALED
        self._changed = asyncio.Event()
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    @property
    def rules(self) -> ProxyRules:
        return self._rules

    @property
    def port(self) -> int:
        if self._server is None:
            raise InvariantViolation(f"proxy {self.spec.name} is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections_active(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.spec.listen_host, self.spec.listen_port
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.reset()
        if self._server is not None:
            await self._server.wait_closed()

    def set_rules(self, rules: ProxyRules) -> None:
        self._rules = rules
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()  # wake every writer waiting out a drop
        if rules.cut:
            for conn in list(self._connections):
                conn.reset()

    async def wait_until_passing(self, direction: Direction) -> None:
        while True:
            changed = self._changed
            if self._rules.mode(direction) != "drop":
                return
            await changed.wait()

    def describe(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "name": spec.name,
            "listen_port": self.port if self._server is not None else spec.listen_port,
            "target": f"{spec.target_host}:{spec.target_port}",
            **self._rules.to_json(),
            "connections_active": self.connections_active,
            **dataclasses.asdict(self.stats),
        }

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._rules.cut or len(self._connections) >= self.connections_max:
            self.stats.connections_refused += 1
            _reset(writer)
            return
        try:
            target = await asyncio.wait_for(
                asyncio.open_connection(self.spec.target_host, self.spec.target_port),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError):
            self.stats.connections_refused += 1
            _reset(writer)
            return
        conn = _Connection(self, (reader, writer), target)
        self.stats.connections_total += 1
        self._connections.add(conn)
        try:
            if self._rules.cut:  # cut while we were connecting
                conn.reset()
                return
            await conn.run()
        finally:
            self._connections.discard(conn)


class FaultProxySet:
    """Many named proxies in one process, changed together by name."""

    def __init__(self, proxies: Iterable[FaultProxy]) -> None:
        self._proxies = {p.spec.name: p for p in proxies}

    def __getitem__(self, name: str) -> FaultProxy:
        try:
            return self._proxies[name]
        except KeyError:
            raise NotFound(f"no proxy named {name!r}") from None

    @property
    def names(self) -> list[str]:
        return sorted(self._proxies)

    async def start(self) -> None:
        for proxy in self._proxies.values():
            await proxy.start()

    async def close(self) -> None:
        for proxy in self._proxies.values():
            await proxy.close()

    def partition(
        self, region: str, peers: Sequence[str] | None = None, direction: str = "both"
    ) -> list[str]:
        """Black-hole both byte directions of the links that cut ``region`` off from ``peers``."""
        names = partition_links(region, self._proxies, peers, direction)
        for name in names:
            proxy = self._proxies[name]
            proxy.set_rules(dataclasses.replace(proxy.rules, up="drop", down="drop"))
        return names

    def heal(self) -> list[str]:
        for proxy in self._proxies.values():
            proxy.set_rules(HEALED)
        return self.names
