"""The drill driver's operator actions against fakes of the controller and the log node: what
gets committed to the control shard, and what never does (a refused or dry-run drill)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from eventlog.errors import NotFound, NotLeader, Unavailable
from eventlog.sharding import shard_of
from regions.control import Placement
from regions.drills import (
    RESTORE_GRACE_S,
    Drill,
    DrillSpec,
    Observation,
    ReplayTally,
    advance,
)
from regions.membership import Membership, MembershipConfig
from regions.ops_state import AUDIT_KEY, AUDIT_RECORD, DRILL_RECORD, HALT_RECORD, OpsState
from regions.placement import place_shards
from services.config import ClusterConfig, NodeAddress, NodeSettings, RegionConfig
from services.control.drills.driver import DrillDriver, PreflightFailed
from services.control.drills.load import LoadMeter
from services.control.region_nodes import fixed_peer_urls
from tests.unit.clocks import WALL_ORIGIN_MS, ManualClock

REGIONS = ("ap-south", "eu-west", "us-east")
SHARDS = 6
CONTROL_SHARD = SHARDS


@dataclass
class FakeNode:
    """Leads every shard; control records apply to ``ops`` as the controller's learn would."""

    ops: OpsState
    leads_control: bool = True
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    canaries: list[str] = field(default_factory=list)

    def leads(self, shard: int) -> bool:
        return shard != CONTROL_SHARD or self.leads_control

    def led_shards(self) -> list[int]:
        return []

    def shard_of(self, conversation_id: str) -> int:
        return shard_of(conversation_id, SHARDS)

    async def append_record(self, shard: int, record_type: str, body: dict[str, Any]) -> int:
        assert shard == CONTROL_SHARD
        self.records.append((record_type, body))
        lsn = self.ops.applied_lsn + 1
        self.ops.apply(lsn, record_type, json.dumps(body))
        return lsn

    async def append_event(self, tenant: str, cid: str, *args: Any, **kw: Any) -> None:
        self.canaries.append(cid)

    async def create_conversation(self, *args: Any) -> None:
        return None

    async def list_events(self, *args: Any) -> list[Any]:
        raise Unavailable("no quorum for the read")


@dataclass
class FakeController:
    region: str
    cluster: ClusterConfig
    membership: Membership
    node: FakeNode
    control_shard: int = CONTROL_SHARD
    settings: NodeSettings = field(default_factory=lambda: NodeSettings(region="ap-south"))
    #: (region, node index) of the nodes that do not answer a probe now
    silent_nodes: set[tuple[str, int]] = field(default_factory=set)

    async def node_answers(self, region: str, index: int) -> bool:
        return (region, index) not in self.silent_nodes

    async def read_barrier(self) -> None:
        """``Controller.read_barrier``: ``ops`` is applied on append here, so only leadership
        is left to check."""
        if not self.node.leads(self.control_shard):
            raise NotLeader("not the control leader", shard=self.control_shard,
                            leader_region=self.control_leader())  # fmt: skip

    def placement(self) -> Placement:
        weights = self.cluster.weights()
        return Placement(1, place_shards(SHARDS, weights), frozenset(), frozenset(), "t")

    def control_leader(self) -> str:
        return "ap-south"


def cluster() -> ClusterConfig:
    """Three regions; us-east runs two nodes, and a supervisor restarts killed ones."""
    more = {"us-east": [NodeAddress(url="http://us-east-1.test")]}
    return ClusterConfig(
        regions=[RegionConfig(name=r, url=f"http://{r}.test", dsn=f"memory://{r}",
                              more_nodes=more.get(r, [])) for r in REGIONS],
        shard_count=SHARDS,
        local_supervisor=True,
    )  # fmt: skip


@dataclass
class World:
    driver: DrillDriver
    controller: FakeController
    node: FakeNode
    ops: OpsState
    clock: ManualClock
    #: what eu-west's replay shows a drill (its engines); a test may change it
    replay_view: dict[str, Any]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    clock = ManualClock(wall_base_ms=WALL_ORIGIN_MS)
    membership = Membership(self_region="ap-south", regions=REGIONS,
                            config=MembershipConfig(1.0, 5.0), started_s=0.0)  # fmt: skip
    for region in REGIONS[1:]:
        membership.probe_ok(region, 0.0, suspects=())
    ops = OpsState()
    node = FakeNode(ops)

    replay = {"live_tokens_per_s": 100.0, "spare_tokens_per_s": 900.0,
              "conversations_planned": 2, "conversations_replayed": 1,
              "tokens_replayed": 500, "last_replayed_at_ms": WALL_ORIGIN_MS - 1}  # fmt: skip

    def load(request: httpx.Request) -> httpx.Response:
        with_engines = request.url.host == "eu-west.test"
        return httpx.Response(
            200, json={"append_rate_per_s": 5.0, "replay": replay if with_engines else None}
        )

    controller = FakeController("ap-south", cluster(), membership, node)
    async with httpx.AsyncClient(transport=httpx.MockTransport(load)) as peers:
        driver = DrillDriver(
            controller=controller,  # type: ignore[arg-type]
            node=node,  # type: ignore[arg-type]
            ops=ops,
            replicas={},
            peers=peers,
            peer_url=fixed_peer_urls({r: f"http://{r}.test" for r in REGIONS}),
            peer_secret=None,
            load=LoadMeter(clock),
            clock=clock,
            region_append_capacity_per_s=2000.0,
        )
        yield World(driver, controller, node, ops, clock, replay)


def spec(**kw: Any) -> DrillSpec:
    fields: dict[str, Any] = {"kind": "region-loss", "region": "us-east", "hold_s": 5.0,
                              "reason": "unit"}  # fmt: skip
    fields.update(kw)
    return DrillSpec(**fields)


async def test_a_started_drill_commits_an_audit_entry_and_its_first_record(world: World) -> None:
    drill, plan = await world.driver.create(spec(), by="sre", role="operator")
    assert plan.ok and plan.capacity["append_rate_per_s"] == 10.0  # two peers at 5/s each
    # one record: the drill and its audit entry commit together or not at all
    [(kind, body)] = world.node.records
    assert kind == DRILL_RECORD and body[AUDIT_KEY]["action"] == "drill.start"
    assert [(e.lsn, e.action, e.target) for e in world.ops.audit] == [(1, "drill.start", "us-east")]
    assert world.ops.drills[drill.drill_id].phase == "injecting"
    # preflight wrote one canary to every shard, and the record starts from those counts
    assert dict(drill.measurements.canary_acked) == dict.fromkeys(range(SHARDS), 1)
    assert world.ops.black_holed(WALL_ORIGIN_MS + 1) == frozenset({"us-east"})


async def test_a_dry_run_or_a_refused_drill_commits_nothing(world: World) -> None:
    plan = await world.driver.plan(spec())
    assert plan.ok and plan.to_body()["shards_moved"] == len(world.driver.controller.placement().shards_of("us-east"))  # fmt: skip
    await world.driver.set_halt(True, by="sre", role="operator", reason="incident")
    committed = len(world.node.records)
    with pytest.raises(PreflightFailed, match="halt switch is on"):
        await world.driver.create(spec(), by="sre", role="operator")
    assert len(world.node.records) == committed and not world.ops.drills
    assert [kind for kind, _ in world.node.records] == [HALT_RECORD]


async def test_halt_aborts_active_drills_and_an_abort_is_audited(world: World) -> None:
    first, _ = await world.driver.create(spec(), by="sre", role="operator")
    await world.driver.set_halt(True, by="sre", role="operator", reason="incident")
    assert world.ops.drills[first.drill_id].phase == "restoring"
    assert world.ops.drills[first.drill_id].abort_reason == "halt switch on: incident"
    with pytest.raises(NotFound):
        await world.driver.abort("nope", by="sre", role="operator", reason="x")
    actions = [e.action for e in world.ops.audit]
    assert actions == ["drill.start", "halt.on"]


async def test_an_abort_is_audited_in_the_record_that_aborts_or_alone_when_nothing_changes(
    world: World,
) -> None:
    drill, _ = await world.driver.create(spec(), by="sre", role="operator")
    await world.driver.abort(drill.drill_id, by="sre", role="operator", reason="enough")
    # the drill is restoring now: a second abort changes nothing and is audited on its own
    await world.driver.abort(drill.drill_id, by="sre", role="operator", reason="again")
    kinds = [kind for kind, _ in world.node.records]
    assert kinds == [DRILL_RECORD, DRILL_RECORD, AUDIT_RECORD]
    assert world.node.records[1][1][AUDIT_KEY]["reason"] == "enough"
    assert world.ops.drills[drill.drill_id].phase == "restoring"
    assert [(e.action, e.reason) for e in world.ops.audit] == [
        ("drill.start", "unit"),
        ("drill.abort", "enough"),
        ("drill.abort", "again"),
    ]


async def test_only_the_control_leader_writes(world: World) -> None:
    world.node.leads_control = False
    for call in (
        world.driver.create(spec(), by="sre", role="operator"),
        world.driver.set_halt(True, by="sre", role="operator", reason="x"),
        world.driver.audit("sre", "operator", "key.create", "t", "r", {}),
    ):
        with pytest.raises(NotLeader) as raised:
            await call
        assert raised.value.leader_region == "ap-south"
    assert world.node.records == []


async def _restoring(world: World, drill_spec: DrillSpec) -> Drill:
    """A drill of ``drill_spec`` (hold 5 s) created, then moved through holding to restoring
    and committed so; the drill's first record."""
    drill, _ = await world.driver.create(drill_spec, by="sre", role="operator")
    holding = advance(drill, Observation(now_ms=world.clock.wall_ms(), injected=True))
    assert holding is not None
    world.clock.now_s += 5.0
    restoring = advance(holding, Observation(now_ms=world.clock.wall_ms()))
    assert restoring is not None and restoring.phase == "restoring"
    for record in (holding, restoring):
        await world.driver.commit_drill(record)
    return drill


async def test_a_target_that_never_answers_again_ends_the_drill_at_its_deadline(
    world: World,
) -> None:
    """The region-loss target stays silent after the hold (membership: down) and the
    read-back cannot finish: at hold_s + grace the drill ends, failed, instead of staying in
    restoring (and blocking the next drill) for good."""
    drill = await _restoring(world, spec(hold_s=5.0))
    assert world.ops.drills[drill.drill_id].phase == "restoring"
    created_s = (drill.created_at_ms - WALL_ORIGIN_MS) / 1000
    world.clock.now_s = created_s + 5.0 + RESTORE_GRACE_S  # us-east answered last at 0 s: down
    await world.driver.step()
    ended = world.ops.drills[drill.drill_id]
    assert (ended.phase, ended.verdict) == ("failed", "failed")
    assert ended.verdict_reason.startswith("us-east was not back by the deadline")
    assert not world.ops.active_drills()


async def test_preflight_and_the_first_record_take_replay_numbers_from_the_regions_with_engines(
    world: World,
) -> None:
    """eu-west has engines (its load reply carries replay numbers), us-east has none: a loss of
    us-east is checked against eu-west's prefill, and the drill starts from its counts."""
    plan = await world.driver.plan(spec())
    prefill = plan.capacity["prefill"]
    assert prefill["live_prefill_tokens_per_s"] == 100.0
    assert prefill["survivor_prefill_capacity_tokens_per_s"] == 1000.0
    drill, _ = await world.driver.create(spec(), by="sre", role="operator")
    assert drill.measurements.replay_before == ReplayTally(2, 1, 500, WALL_ORIGIN_MS - 1)


async def test_the_fault_end_records_the_survivors_engines_and_the_cache_recovery_curve(
    world: World,
) -> None:
    """The drill's start and the fault's end snapshot eu-west's engine histogram and replay's
    own; as the fault ends, the moved conversations eu-west warmed since injection become the
    curve (those warmed before injection do not count)."""
    histogram = {"le": [0.1, 0.5], "cumulative": [1.0, 2.0, 2.0]}
    world.replay_view.update(engine_ttft=histogram, replay_ttft=histogram, warmed=[])
    drill, _ = await world.driver.create(spec(hold_s=5.0), by="sre", role="operator")
    start = drill.measurements.engine_snapshots["start"]["eu-west"]
    assert start.engine_ttft is not None and start.engine_ttft.count == 2
    assert drill.measurements.replay_spare_tokens_per_s == 900.0
    holding = advance(drill, Observation(now_ms=world.clock.wall_ms(), injected=True))
    assert holding is not None and holding.injected_at_ms is not None
    await world.driver.commit_drill(holding)
    injected_ms = holding.injected_at_ms
    world.replay_view.update(
        conversations_planned=6,
        moved_here_ms=[injected_ms - 9_000, injected_ms + 700, injected_ms + 900],
        engine_ttft={"le": [0.1, 0.5], "cumulative": [3.0, 9.0, 9.0]},
        warmed=[[injected_ms - 500, 7], [injected_ms + 1_000, 2], [injected_ms + 2_000, 1]],
    )
    world.clock.now_s += 5.0
    await world.driver.step()
    restoring = world.ops.drills[drill.drill_id]
    assert restoring.phase == "restoring"
    measured = restoring.measurements
    assert measured.warm_points == ((1.0, 2), (2.0, 3))
    assert measured.takeover_s == 0.7  # the first shard eu-west led after the injection
    end_of_fault = measured.engine_snapshots["restore"]["eu-west"]
    assert end_of_fault.engine_ttft is not None and end_of_fault.engine_ttft.count == 9
    assert "us-east" not in measured.engine_snapshots["restore"]  # no engines there


# --- a kill of one node of a region of several ---------------------------------------------------

#: us-east's shards in node 1's slot (``SlotMap``), of 0, 1, 4, 5 ``place_shards`` puts on us-east
NODE_1_SHARDS = (0, 5)


def node_kill(**kw: Any) -> DrillSpec:
    """A kill of us-east's node 1, held long enough that the canaries' virtual time never
    reaches its deadline."""
    return spec(**{"kind": "kill", "node": 1, "hold_s": 3600.0, **kw})


async def test_a_node_kill_measures_the_nodes_slot_and_keeps_it_in_its_region(
    world: World,
) -> None:
    plan = await world.driver.plan(node_kill())
    assert plan.ok and plan.moves == dict.fromkeys(NODE_1_SHARDS, "us-east")
    drill, _ = await world.driver.create(node_kill(), by="sre", role="operator")
    assert drill.spec.node == 1 and drill.measurements.shards_moved == NODE_1_SHARDS
    [entry] = world.ops.audit
    assert (entry.action, entry.target, entry.detail["node"]) == ("drill.start", "us-east", 1)
    assert world.ops.black_holed(WALL_ORIGIN_MS + 1) == frozenset()  # a kill holes nobody


async def test_a_node_kill_is_in_place_once_that_node_stops_answering_not_its_region(
    world: World,
) -> None:
    drill, _ = await world.driver.create(node_kill(), by="sre", role="operator")
    try:
        world.controller.membership.probe_ok("us-east", world.clock.now_s, suspects=())
        await world.driver.step()
        assert world.ops.drills[drill.drill_id].phase == "injecting"  # node 1 still answers
        world.controller.silent_nodes.add(("us-east", 1))
        # its region still answers (through node 0): a region's kill would still be injecting
        world.controller.membership.probe_ok("us-east", world.clock.now_s, suspects=())
        await world.driver.step()
        holding = world.ops.drills[drill.drill_id]
        assert holding.phase == "holding" and holding.injected_at_ms == drill.created_at_ms
    finally:
        await world.driver.close()


async def test_a_killed_node_that_never_answers_again_fails_the_drill_at_its_deadline(
    world: World,
) -> None:
    """us-east answers (its node 0 does) and its placement is whole, but node 1 stays silent:
    the target is not back, so the drill ends failed at hold_s + grace."""
    drill = await _restoring(world, node_kill(hold_s=5.0))
    world.controller.silent_nodes.add(("us-east", 1))
    created_s = (drill.created_at_ms - WALL_ORIGIN_MS) / 1000
    world.clock.now_s = created_s + 5.0 + RESTORE_GRACE_S
    world.controller.membership.probe_ok("us-east", world.clock.now_s, suspects=())
    await world.driver.step()
    ended = world.ops.drills[drill.drill_id]
    assert (ended.phase, ended.verdict) == ("failed", "failed")
    assert ended.verdict_reason.startswith("us-east node 1 was not back by the deadline")
