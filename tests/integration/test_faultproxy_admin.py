"""Fault proxy rules, partitions, the admin API and the `convplane fault` commands."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from typer.testing import CliRunner

from services.cli.fault import build_admin_server, create_admin_app, load_config
from services.cli.main import build_app
from services.local.faultproxy import (
    FaultProxy,
    FaultProxySet,
    FaultRuleError,
    ProxyRules,
    ProxySpec,
    partition_links,
    rules_from_json,
)

LINKS = ["eu->us", "eu->ap", "us->eu", "us->ap", "ap->eu", "ap->us"]


def test_partition_links_by_direction() -> None:
    assert partition_links("eu", LINKS, direction="out") == ["eu->ap", "eu->us"]
    assert partition_links("eu", LINKS, direction="in") == ["ap->eu", "us->eu"]
    assert partition_links("eu", LINKS) == ["ap->eu", "eu->ap", "eu->us", "us->eu"]
    assert partition_links("eu", LINKS, peers=["us"]) == ["eu->us", "us->eu"]
    assert partition_links("eu", [*LINKS, "admin"]) == partition_links("eu", LINKS)
    with pytest.raises(FaultRuleError):
        partition_links("eu", LINKS, direction="sideways")


def test_rules_from_json_is_partial_and_validated() -> None:
    rules = rules_from_json(ProxyRules(), {"delay_ms": 40, "up": "drop"})
    assert rules == ProxyRules(up="drop", up_delay_ms=40, down_delay_ms=40)
    rules = rules_from_json(rules, {"down_delay_ms": 5})
    assert (rules.up, rules.up_delay_ms, rules.down_delay_ms) == ("drop", 40, 5)
    assert rules.to_json()["delay_ms"] is None  # the two directions differ
    for bad in ({"up": "maybe"}, {"delay_ms": -1}, {"delay_ms": "5"}, {"jitter_ms": 1}):
        with pytest.raises(FaultRuleError):
            rules_from_json(ProxyRules(), bad)


def test_load_config_both_shapes() -> None:
    item = {"name": "eu->us", "listen_port": 7101, "target": "127.0.0.1:8002"}
    specs, admin_port = load_config(json.dumps({"admin_port": 7070, "proxies": [item]}))
    assert specs == [ProxySpec("eu->us", 7101, "127.0.0.1", 8002)] and admin_port == 7070
    assert load_config(json.dumps([item])) == (specs, None)
    with pytest.raises(FaultRuleError):
        load_config(json.dumps([item, item]))
    with pytest.raises(FaultRuleError):
        load_config(json.dumps([{"name": "x"}]))


def _proxy_set() -> FaultProxySet:
    return FaultProxySet(FaultProxy(ProxySpec(name, 0, "127.0.0.1", 9)) for name in LINKS)


async def test_admin_api_set_partition_heal() -> None:
    proxies = _proxy_set()
    transport = httpx.ASGITransport(app=create_admin_app(proxies))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        reply = await client.put("/proxies/eu->us", json={"delay_ms": 25, "down": "drop"})
        assert reply.status_code == 200
        assert reply.json()["delay_ms"] == 25 and reply.json()["down"] == "drop"
        assert proxies["eu->us"].rules == ProxyRules(down="drop", up_delay_ms=25, down_delay_ms=25)

        bad = await client.put("/proxies/eu->us", json={"up": "sideways"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_fault_rule"
        missing = await client.get("/proxies/mars->eu")
        assert missing.status_code == 404

        reply = await client.post("/partition", json={"region": "ap", "direction": "out"})
        assert reply.json() == {"partitioned": ["ap->eu", "ap->us"]}
        assert proxies["ap->us"].rules.up == "drop" and proxies["us->ap"].rules.up == "pass"

        reply = await client.post("/heal")
        assert sorted(reply.json()["healed"]) == sorted(LINKS)
        listing = (await client.get("/proxies")).json()["proxies"]
        assert all(p["up"] == p["down"] == "pass" and p["delay_ms"] == 0 for p in listing)


@asynccontextmanager
async def running_admin(proxies: FaultProxySet) -> AsyncIterator[str]:
    sock = socket.create_server(("127.0.0.1", 0))
    server = build_admin_server(proxies)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        # The socket already listens: requests queue in its backlog until uvicorn accepts.
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_cli_commands_against_a_running_admin_api() -> None:
    proxies = _proxy_set()
    runner = CliRunner()

    async def cli(*args: str) -> str:
        result = await asyncio.to_thread(runner.invoke, build_app(), ["fault", *args])
        assert result.exit_code == 0, result.output
        return result.output

    async with running_admin(proxies) as url:
        out = await cli("set", "us->eu", "--delay-ms", "80", "--up", "cut", "--admin", url)
        assert json.loads(out)["up"] == "cut"
        out = await cli("partition", "eu", "--peer", "us", "--admin", url)
        assert json.loads(out) == {"partitioned": ["eu->us", "us->eu"]}
        assert proxies["eu->us"].rules.down == "drop"
        assert proxies["us->eu"].rules.up_delay_ms == 80  # partition keeps the delay
        await cli("heal", "--admin", url)
        assert all(proxies[name].rules == ProxyRules() for name in LINKS)
        failed = await asyncio.to_thread(
            runner.invoke, build_app(), ["fault", "set", "nope", "--up", "drop", "--admin", url]
        )
        assert failed.exit_code == 1
