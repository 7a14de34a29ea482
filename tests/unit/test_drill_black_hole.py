"""The software black-hole of a region-loss drill (services.control.drills.faults): who drops what."""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest

from eventlog.errors import ReplicaUnavailable
from eventlog.memory_replica import MemoryReplica
from regions.drills import DrillSpec, request_abort, start
from regions.ops_state import DRILL_RECORD, OpsState
from services.control.drills.faults import (
    BlackHole,
    BlackHoleReplica,
    BlackHoleTransport,
    region_by_address,
)
from services.control.peer_probe import HttpPeerProber
from tests.unit.clocks import WALL_ORIGIN_MS, ManualClock

URLS = {"us-east": "http://127.0.0.1:8700", "eu-west": "http://127.0.0.1:8701"}


def ops_with_drill(kind: str = "region-loss") -> OpsState:
    ops = OpsState()
    spec = DrillSpec(kind=kind, region="us-east", hold_s=10.0, reason="t")  # type: ignore[arg-type]
    ops.apply(1, DRILL_RECORD, json.dumps(start("d1", spec, WALL_ORIGIN_MS).to_body()))
    return ops


def hole(region: str, ops: OpsState, clock: ManualClock) -> BlackHole:
    return BlackHole(region=region, ops=ops, clock=clock)


def test_survivors_drop_everything_to_the_target_and_the_target_keeps_only_reads() -> None:
    clock = ManualClock(wall_base_ms=WALL_ORIGIN_MS)
    ops = ops_with_drill()
    survivor, target = hole("eu-west", ops, clock), hole("us-east", ops, clock)
    assert survivor.blocks("us-east", read_only=True) and survivor.blocks(
        "us-east", read_only=False
    )
    assert not survivor.blocks("ap-south", read_only=False)
    assert target.blocks("eu-west", read_only=False) and not target.blocks(
        "eu-west", read_only=True
    )
    assert not target.blocks("us-east", read_only=False)  # its own database
    clock.now_s = 40.0  # past hold_s + the restore grace: the black-hole ends by itself
    assert not survivor.blocks("us-east", read_only=False)


def test_the_black_hole_lifts_with_the_phase_and_never_covers_evacuate() -> None:
    clock = ManualClock(wall_base_ms=WALL_ORIGIN_MS)
    ops = ops_with_drill()
    restoring = request_abort(ops.drills["d1"], "stop", WALL_ORIGIN_MS + 1)
    assert restoring is not None
    ops.apply(2, DRILL_RECORD, json.dumps(restoring.to_body()))
    assert not hole("eu-west", ops, clock).blocks("us-east", read_only=False)
    assert not hole("eu-west", ops_with_drill("evacuate"), clock).blocks("us-east", read_only=False)


async def test_a_black_holed_replica_fails_as_unavailable_and_passes_reads_for_the_target() -> None:
    clock = ManualClock(wall_base_ms=WALL_ORIGIN_MS)
    ops = ops_with_drill()
    from_survivor = BlackHoleReplica(MemoryReplica("us-east"), hole("eu-west", ops, clock))
    with pytest.raises(ReplicaUnavailable):
        await from_survivor.prepare(0, 1, 10)
    with pytest.raises(ReplicaUnavailable):
        await from_survivor.status(0)
    from_target = BlackHoleReplica(MemoryReplica("eu-west"), hole("us-east", ops, clock))
    assert (await from_target.status(0)).commit_lsn == 0
    with pytest.raises(ReplicaUnavailable):
        await from_target.append(0, 1, 0, 0, [], 0)


async def test_the_transport_refuses_requests_to_black_holed_regions() -> None:
    clock = ManualClock(wall_base_ms=WALL_ORIGIN_MS)
    ops = ops_with_drill()
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={})

    inner = httpx.MockTransport(answer)
    survivor = BlackHoleTransport(inner, hole("eu-west", ops, clock), region_by_address(URLS))
    async with httpx.AsyncClient(transport=survivor) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(URLS["us-east"] + "/v1/conversations/c/events")
        assert (await client.get("http://127.0.0.1:9999/x")).status_code == 200  # not a region
    target = BlackHoleTransport(inner, hole("us-east", ops, clock), region_by_address(URLS))
    async with httpx.AsyncClient(transport=target) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(URLS["eu-west"] + "/v1/conversations/c/events")
    assert seen == ["http://127.0.0.1:9999/x"]


async def test_probes_keep_the_targets_channel_and_drop_the_survivors() -> None:
    """Probes ask the black-hole themselves (``services.control.peer_probe``): a survivor's probe of
    the target is dropped without a connection, the target still probes everyone."""
    clock = ManualClock(wall_base_ms=WALL_ORIGIN_MS)
    ops = ops_with_drill()
    survivor = hole("eu-west", ops, clock)
    prober = HttpPeerProber(
        {"us-east": "http://127.0.0.1:9/"},
        timeout_s=1.0,
        peer_secret=None,
        ssl_context=None,
        source_region="eu-west",
        blocked=partial(survivor.blocks, read_only=True),
    )
    assert await prober.health("us-east") is None  # dropped: no socket was opened (pure tier)
    target = hole("us-east", ops, clock)
    assert not target.blocks("eu-west", read_only=True)  # the target's probes still go out
