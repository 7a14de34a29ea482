"""Several nodes in one region (``services.control.region_nodes``): only the node holding the
region's lease leads the region's shards, another takes them over when the lease comes free,
a holder that loses the lease resigns; peers send a region's traffic to the node that says it
leads the region, and count the region up while any of its nodes answers."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from services.config import ClusterConfig, NodeAddress, NodeSettings, RegionConfig
from services.control.controller import Controller
from services.control.region_nodes import RegionNodes, node_target, target_region
from services.plane_sim.plane import SimLease, SimRegionLock

REGIONS = ("a", "b", "c")
SHARDS = 6


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
    lease: SimLease | None,
    prober: Any = None,
) -> Controller:
    plane = cluster()
    clock = LoopClock()
    node = LogNode(region=region, replicas=replicas, config=LogConfig(shard_count=SHARDS),
                   clock=clock, rng=random.Random(index))  # fmt: skip
    settings = NodeSettings(region=region, node_index=index, cluster=plane)
    return Controller(settings=settings, cluster=plane, node=node, replicas=replicas,
                      prober=prober or Replies({}), clock=clock, rng=random.Random(index + 7),
                      lease=lease)  # fmt: skip


async def _reconciled(control: Controller) -> None:
    await control._keep_lease()
    await control._reconcile()
    await asyncio.gather(*control._leading.values())


async def test_only_the_lease_holder_leads_and_a_standby_takes_over_when_it_dies() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    lock = SimRegionLock()
    first = controller("a", 0, replicas, SimLease(lock))
    second = controller("a", 1, replicas, SimLease(lock))
    placed = first.placement().shards_of("a")
    assert placed  # the static placement gives region a shards

    await _reconciled(first)
    await _reconciled(second)
    assert first.leads_region and first.node.led_shards() == placed
    assert not second.leads_region and second.node.led_shards() == []
    assert second.readiness() == (0, 0)  # a standby is ready leading nothing
    assert second.health_reply()["leads_region"] is False
    assert second.health_reply()["node"] == 1

    # the holder dies: its process is gone, so is its lock
    await first.node.close()
    assert first.lease is not None
    await first.lease.close()
    await _reconciled(second)
    assert second.leads_region and second.node.led_shards() == placed
    assert second.placement().version == 0  # nothing moved to another region
    await second.node.close()


async def test_a_holder_that_loses_the_lease_resigns_every_shard() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    lock = SimRegionLock()
    holder = controller("a", 0, replicas, SimLease(lock))
    await _reconciled(holder)
    assert holder.node.led_shards()
    lock.holder = SimLease(lock)  # its session ended and another node took the lock
    await holder._keep_lease()
    assert not holder.leads_region
    assert holder.node.led_shards() == []
    await holder._reconcile()
    assert holder._leading == {}  # and it does not lead them again
    await holder.node.close()


async def test_a_region_of_one_node_has_no_lease_and_always_leads() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    only = controller("a", 0, replicas, None)
    assert only.leads_region
    await only._reconcile()
    await asyncio.gather(*only._leading.values())
    assert only.node.led_shards() == only.placement().shards_of("a")
    await only.node.close()


def _reply(region: str, index: int, *, leads: bool, led: list[int]) -> dict[str, Any]:
    return {"region": region, "node": index, "leads_region": leads, "suspects": [],
            "led_shards": led}  # fmt: skip


async def test_peers_follow_the_node_that_leads_a_region() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    replies: dict[str, dict[str, Any] | None] = {
        "b": _reply("b", 0, leads=False, led=[]),
        "b/1": _reply("b", 1, leads=True, led=[1, 4]),
    }
    observer = controller("a", 0, replicas, None, Replies(replies))
    assert observer.nodes.peer_url("b") == "https://b.invalid:1"  # the first node, until heard
    await observer._probe("b")
    assert observer.nodes.leading_node("b") == 1
    assert observer.nodes.peer_urls()["b"] == "https://b1.invalid:1"
    now_s = observer._clock.monotonic()
    assert observer.membership.status("b", now_s) == "up"
    assert observer.membership.led_shards_of("b") == {1, 4}

    # the leading node is gone, the standby still answers: the region stays up
    replies["b/1"] = None
    await observer._probe("b")
    assert observer.membership.status("b", observer._clock.monotonic()) == "up"
    assert observer.nodes.leading_node("b") == 1  # nobody said otherwise yet
    # the standby took over
    replies["b"] = _reply("b", 0, leads=True, led=[1, 4])
    await observer._probe("b")
    assert observer.nodes.leading_node("b") == 0
    await observer.node.close()


async def test_a_standby_learns_which_sibling_leads_its_region() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    replies: dict[str, dict[str, Any] | None] = {"a/1": _reply("a", 1, leads=True, led=[0])}
    lock = SimRegionLock()
    lock.holder = SimLease(lock)  # a sibling holds the lease
    standby = controller("a", 0, replicas, SimLease(lock), Replies(replies))
    await standby._keep_lease()
    assert not standby.answers_probes()  # it has not heard the region led yet
    await standby._probe_siblings()
    assert standby.nodes.leading_node("a") == 1
    assert standby.answers_probes()
    await standby.node.close()


async def test_a_standby_falls_silent_when_the_node_leading_its_region_hangs() -> None:
    """The leader keeps the lease while it hangs, so no standby can take over: the standby
    stops answering probes, and the region fails over as a region of one hung node would."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    replies: dict[str, dict[str, Any] | None] = {"a/1": _reply("a", 1, leads=True, led=[0])}
    lock = SimRegionLock()
    lock.holder = SimLease(lock)
    standby = controller("a", 0, replicas, SimLease(lock), Replies(replies))
    await standby._probe_siblings()
    assert standby.answers_probes()
    replies["a/1"] = None  # hung: no answer, lease kept
    detection_s = standby.settings.detection_s
    assert standby._sibling_leading_heard_s is not None
    standby._sibling_leading_heard_s -= detection_s  # as long ago as that
    await standby._probe_siblings()
    assert not standby.answers_probes()
    await standby.node.close()


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
