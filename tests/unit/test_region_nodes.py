"""Several nodes in one region (``services.control.region_nodes``, ``node_slots``): a region's
shards are split over its nodes by node slot, each led by the node holding the slot's lease; a
node takes a dead sibling's slot and hands it back once the sibling asks; a holder that loses a
lease resigns that slot's shards; peers send each shard's traffic to the node that says it
holds the shard's slot, and count the region up while any of its nodes answers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Sequence
from typing import Any

import pytest

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from eventlog.stores.region_lease import RegionLease
from regions.placement import SlotMap
from services.config import ClusterConfig, NodeAddress, NodeSettings, RegionConfig
from services.control.controller import Controller
from services.control.node_slots import HELD_CONFIRM_EVERY_S, LEASE_FREED_S, reply_slots
from services.control.region_nodes import RegionNodes, node_target, target_region
from services.plane_sim.plane import SimLease, SimRegionLock

REGIONS = ("a", "b", "c")
SHARDS = 24
SLOTS = SlotMap(SHARDS, dict.fromkeys(REGIONS, 1.0))


def cluster(more_nodes: int = 1) -> ClusterConfig:
    return ClusterConfig(
        shard_count=SHARDS,
        regions=[
            RegionConfig(
                name=r,
                url=f"http://{r}.invalid",
                peer_url=f"https://{r}.invalid:1",
                dsn=f"memory://{r}",
                more_nodes=[
                    NodeAddress(url=f"http://{r}{i}.invalid", peer_url=f"https://{r}{i}.invalid:1")
                    for i in range(1, more_nodes + 1)
                ],
            )
            for r in REGIONS
        ],
    )


class Replies:
    """A prober answering each probe target from a table (None: no answer)."""

    def __init__(self, replies: dict[str, dict[str, Any] | None]) -> None:
        self.replies = replies

    async def health(self, target: str) -> dict[str, Any] | None:
        return self.replies.get(target)


def controller(
    region: str,
    index: int,
    replicas: dict[str, MemoryReplica],
    leases: Sequence[RegionLease],
    prober: Any = None,
) -> Controller:
    plane = cluster()
    clock = LoopClock()
    node = LogNode(region=region, replicas=replicas, config=LogConfig(shard_count=SHARDS),
                   clock=clock, rng=random.Random(index))  # fmt: skip
    settings = NodeSettings(region=region, node_index=index, cluster=plane)
    return Controller(settings=settings, cluster=plane, node=node, replicas=replicas,
                      prober=prober or Replies({}), clock=clock, rng=random.Random(index + 7),
                      leases=leases)  # fmt: skip


def leases_on(locks: list[SimRegionLock]) -> list[SimLease]:
    return [SimLease(lock) for lock in locks]


async def _reconciled(control: Controller) -> None:
    await control._keep_slots()
    await control._reconcile()
    await asyncio.gather(*control._leading.values())


def _two_nodes() -> tuple[Controller, Controller, dict[str, dict[str, Any] | None]]:
    """Region a's two nodes on one database; the first probes its sibling from ``replies``."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    locks = [SimRegionLock(), SimRegionLock()]
    replies: dict[str, dict[str, Any] | None] = {}
    first = controller("a", 0, replicas, leases_on(locks), Replies(replies))
    return first, controller("a", 1, replicas, leases_on(locks)), replies


async def _dies(control: Controller) -> None:
    """A node's process is gone, and so are its locks."""
    await control.node.close()
    await control.close()
    for lease in control.slots._leases:
        await lease.close()


def _by_slot(shards: list[int]) -> dict[int, list[int]]:
    """``shards`` by their node slot in a region of two nodes."""
    split: dict[int, list[int]] = {0: [], 1: []}
    for shard in shards:
        split[SLOTS.slot(shard, 2)].append(shard)
    return split


async def test_two_nodes_split_their_regions_shards_by_slot() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    locks = [SimRegionLock(), SimRegionLock()]
    first = controller("a", 0, replicas, leases_on(locks))
    second = controller("a", 1, replicas, leases_on(locks))
    placed = first.placement().shards_of("a")
    split = _by_slot(placed)
    assert split[0] and split[1]  # the static placement gives each of a's slots shards

    await _reconciled(first)
    await _reconciled(second)
    # each took its own slot only: a sibling's is not taken while it may still be starting
    assert first.slots.held == {0} and second.slots.held == {1}
    assert first.node.led_shards() == split[0]
    assert second.node.led_shards() == split[1]
    assert first.readiness() == (len(split[0]), len(split[0]))
    assert second.health_reply()["slots"] == [1] and second.health_reply()["node"] == 1
    await first.node.close()
    await second.node.close()


async def test_a_node_takes_a_dead_siblings_slot_and_hands_it_back_when_asked() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    locks = [SimRegionLock(), SimRegionLock()]
    replies: dict[str, dict[str, Any] | None] = {}
    first = controller("a", 0, replicas, leases_on(locks), Replies(replies))
    second = controller("a", 1, replicas, leases_on(locks))
    placed = first.placement().shards_of("a")
    split = _by_slot(placed)
    await _reconciled(first)
    await _reconciled(second)
    replies["a/1"] = second.health_reply()
    await first._probe_siblings()

    # the second node dies
    await _dies(second)
    replies["a/1"] = None
    await _reconciled(first)
    assert first.slots.held == {0, 1}
    assert first.node.led_shards() == placed
    assert first.placement().version == 0  # nothing moved to another region

    # it runs again and asks for its slot back
    again = controller("a", 1, replicas, leases_on(locks))
    await _reconciled(again)
    assert again.slots.held == set() and again.node.led_shards() == []
    assert again.health_reply()["wants_own_slot"] is True
    replies["a/1"] = again.health_reply()
    await first._probe_siblings()
    await _reconciled(first)  # hands it back: resigns its shards, then releases its lease
    assert first.slots.held == {0} and first.node.led_shards() == split[0]
    await _reconciled(first)  # and does not take it again while the sibling asks
    assert first.slots.held == {0}
    await _reconciled(again)
    assert again.slots.held == {1} and again.node.led_shards() == split[1]
    await first.node.close()
    await again.node.close()


async def test_a_holder_that_loses_a_lease_resigns_that_slots_shards() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    locks = [SimRegionLock(), SimRegionLock()]
    locks[1].holder = SimLease(locks[1])  # its sibling holds its own slot throughout
    holder = controller("a", 0, replicas, leases_on(locks))
    split = _by_slot(holder.placement().shards_of("a"))
    await _reconciled(holder)
    assert holder.node.led_shards() == split[0]
    locks[0].holder = SimLease(locks[0])  # its session ended and another node took the lock
    await holder._keep_slots()
    assert holder.leads_region  # confirmed a moment ago: not asked again yet
    await asyncio.sleep(HELD_CONFIRM_EVERY_S)
    await holder._keep_slots()
    assert not holder.leads_region
    assert holder.node.led_shards() == []
    await holder._reconcile()
    assert holder._leading == {}  # and it does not lead them again
    await holder.node.close()


async def test_a_region_of_one_node_has_no_lease_and_always_leads() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    only = controller("a", 0, replicas, [])
    assert only.leads_region and only.slots.held == {0}
    await only._reconcile()
    await asyncio.gather(*only._leading.values())
    assert only.node.led_shards() == only.placement().shards_of("a")
    await only.node.close()


def _reply(region: str, index: int, *, slots: list[int], led: list[int]) -> dict[str, Any]:
    return {"region": region, "node": index, "leads_region": bool(slots), "slots": slots,
            "suspects": [], "led_shards": led}  # fmt: skip


async def test_peers_send_each_shard_to_the_node_holding_its_slot() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    replies: dict[str, dict[str, Any] | None] = {
        "b": _reply("b", 0, slots=[1], led=[1]),
        "b/1": _reply("b", 1, slots=[0], led=[4]),
    }
    observer = controller("a", 0, replicas, [], Replies(replies))
    split = _by_slot(list(range(SHARDS)))
    one, other = split[0][0], split[1][0]
    assert observer.nodes.peer_url("b", one) == "https://b.invalid:1"  # slot i: node i, at first
    await observer._probe("b")
    assert observer.nodes.peer_url("b", one) == "https://b1.invalid:1"  # as each node said
    assert observer.nodes.peer_url("b", other) == "https://b.invalid:1"
    assert observer.nodes.peer_url_of()("b", other) == "https://b.invalid:1"
    assert observer.nodes.peer_url_of()("nowhere", other) is None
    now_s = observer._clock.monotonic()
    assert observer.membership.status("b", now_s) == "up"
    assert observer.membership.led_shards_of("b") == {1, 4}

    # one node is gone, the other still answers: the region stays up; it then takes both slots
    replies["b/1"] = None
    await observer._probe("b")
    assert observer.membership.status("b", observer._clock.monotonic()) == "up"
    replies["b"] = _reply("b", 0, slots=[0, 1], led=[1, 4])
    await observer._probe("b")
    assert observer.nodes.peer_url("b", one) == observer.nodes.peer_url("b", other)
    await observer.node.close()


async def test_a_shard_of_a_silent_node_goes_to_a_sibling_that_answers() -> None:
    """A node that stopped answering (or refused a forward) is passed over for a sibling of
    its region until it answers again: the sibling takes the dead node's slot, and leads it."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    replies: dict[str, dict[str, Any] | None] = {
        "b": _reply("b", 0, slots=[0], led=[]),
        "b/1": _reply("b", 1, slots=[1], led=[]),
    }
    observer = controller("a", 0, replicas, [], Replies(replies))
    nodes = observer.nodes
    shard = _by_slot(list(range(SHARDS)))[1][0]
    await observer._probe("b")
    assert nodes.peer_url("b", shard) == "https://b1.invalid:1"
    replies["b/1"] = None
    await observer._probe("b")
    assert nodes.leading_node("b", shard) == 1  # still its slot's holder, as last heard
    assert nodes.peer_url("b", shard) == "https://b.invalid:1"
    replies["b/1"] = _reply("b", 1, slots=[1], led=[])
    await observer._probe("b")
    assert nodes.peer_url("b", shard) == "https://b1.invalid:1"  # answers again

    nodes.refused("b", "https://b1.invalid:1/")  # a forward found it gone before a probe did
    assert nodes.peer_url("b", shard) == "https://b.invalid:1"
    nodes.refused("b", "https://b.invalid:1")
    assert nodes.peer_url("b", shard) == "https://b1.invalid:1"  # none answers: the holder
    own = controller("b", 0, replicas, [], Replies(replies)).nodes
    own.answering("b", 1, False)
    assert own.peer_url("b", shard) == "https://b1.invalid:1"  # its own region: never rerouted
    await observer.node.close()


async def test_a_reply_places_the_slots_of_its_siblings_that_did_not_answer() -> None:
    """A node's reply says which node holds each of its region's slots as it knows them: a
    sibling whose reply was lost is still placed, and the region's led shards are all there."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    replies: dict[str, dict[str, Any] | None] = {
        "b": {**_reply("b", 0, slots=[1], led=[1]), "region_slots": [1, 0],
              "region_led_shards": [1, 4]},
        "b/1": None,  # its reply was lost
    }  # fmt: skip
    observer = controller("a", 0, replicas, [], Replies(replies))
    await observer._probe("b")
    assert observer.membership.led_shards_of("b") == {1, 4}
    split = _by_slot(list(range(SHARDS)))
    assert observer.nodes.leading_node("b", split[0][0]) == 1
    assert observer.nodes.leading_node("b", split[1][0]) == 0
    await observer.node.close()


def test_a_reply_of_an_earlier_release_says_its_node_leads_every_slot() -> None:
    assert reply_slots({"leads_region": True}, 3) == [0, 1, 2]
    assert reply_slots({"leads_region": False}, 3) == []
    assert reply_slots({"slots": [2, 7, "x"]}, 3) == [2]


async def test_a_node_answers_probes_only_while_every_slot_is_held() -> None:
    """A sibling that hangs keeps its lease, so nobody can lead its slot: the node that still
    runs stops answering other regions' probes, and the region fails over as a region of one
    hung node would; not before the database would have freed the lease of a sibling whose
    host died, and it taken that (``LEASE_FREED_S`` past the detection time)."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    locks = [SimRegionLock(), SimRegionLock()]
    locks[1].holder = SimLease(locks[1])  # the sibling holds its slot
    replies: dict[str, dict[str, Any] | None] = {"a/1": _reply("a", 1, slots=[1], led=[])}
    node = controller("a", 0, replicas, leases_on(locks), Replies(replies))
    await node._keep_slots()
    assert node.slots.held == {0}
    assert not node.answers_probes()  # it has not heard who holds slot 1 yet
    await node._probe_siblings()
    assert node.answers_probes()
    replies["a/1"] = None  # hung: no answer, lease kept

    def silent_for(seconds: float) -> None:
        heard_s = node.slots._siblings[1].heard_s - seconds
        node.slots._siblings[1] = dataclasses.replace(node.slots._siblings[1], heard_s=heard_s)

    silent_for(node.settings.detection_s)
    await node._probe_siblings()
    await node._keep_slots()  # the lease is not free: nothing to take
    assert node.slots.held == {0}
    assert node.answers_probes()  # the lease of a dead host's node may yet be freed
    silent_for(LEASE_FREED_S)
    await node._keep_slots()
    assert node.slots.held == {0}
    assert not node.answers_probes()
    await node.node.close()


def test_a_node_silent_for_the_detection_time_is_lost_until_it_answers() -> None:
    """``lost``: silent (a missed probe, a refused forward) for ``lost_after_s`` since it
    first went silent; another miss does not restart that time, an answer ends it."""
    now = [100.0]
    nodes = RegionNodes(cluster(more_nodes=1), "a", lost_after_s=1.0, now_s=lambda: now[0])
    url = "https://b1.invalid:1"
    nodes.answering("b", 1, False)
    now[0] += 0.6
    nodes.refused("b", url + "/")
    assert not nodes.lost("b", url)
    now[0] += 0.4
    assert nodes.lost("b", url) and not nodes.lost("b", "https://b.invalid:1")
    nodes.answering("b", 1, True)
    assert not nodes.lost("b", url)
    assert not nodes.lost("b", "https://elsewhere.invalid:1")  # not a node of b


def test_probe_targets_name_a_region_and_its_node() -> None:
    nodes = RegionNodes(cluster(more_nodes=2), "a")
    assert nodes.targets("b") == ["b", "b/1", "b/2"]
    assert [target_region(t) for t in nodes.targets("b")] == ["b", "b", "b"]
    assert node_target("c", 0) == "c"
    assert nodes.target_urls()["c/2"] == "https://c2.invalid:1"


def test_a_node_index_the_region_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="node_index 2"):
        NodeSettings(region="a", node_index=2, cluster=cluster(more_nodes=1)).load_cluster()


def test_a_cluster_file_of_one_node_regions_is_written_as_before_more_nodes() -> None:
    """An earlier release forbids unknown fields: during a rolling upgrade (or after a
    rollback) its nodes must still read a cluster file this release wrote (``convplane keys``
    rewrites it), as long as no region has further nodes."""
    one_node = cluster(more_nodes=0)
    written = json.loads(one_node.model_dump_json())
    assert all("more_nodes" not in region for region in written["regions"])
    two_nodes = cluster(more_nodes=1)
    read_back = ClusterConfig.model_validate_json(two_nodes.model_dump_json())
    assert read_back == two_nodes and read_back.regions[0].node_count == 2


async def test_a_request_waits_for_the_lead_of_a_slot_just_taken() -> None:
    first, second, replies = _two_nodes()
    await _reconciled(first)
    await _reconciled(second)
    replies["a/1"] = second.health_reply()
    await first._probe_siblings()
    shard = _by_slot(first.placement().shards_of("a"))[1][0]
    assert await first.await_lead_here(shard, 5.0) is False  # its sibling's: nothing to wait

    replies["a/1"] = None
    await _dies(second)
    await first._keep_slots()  # takes the dead sibling's slot, starts leading its shards
    assert first.slots.held == {0, 1} and not first.node.leads(shard)
    assert await first.await_lead_here(shard, 0.0) is False  # under way, not waited for
    assert await first.await_lead_here(shard, 5.0) is True
    assert first.node.leads(shard)
    await asyncio.gather(*first._leading.values())
    await first.node.close()
