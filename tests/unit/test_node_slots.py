"""A node's share of its region's node slots (``services.control.node_slots``), on a manual
clock: when a sibling's free slot may be taken, when it is handed back, and what becomes of a
handback the sibling never took up."""

from __future__ import annotations

from typing import Any

from regions.placement import SlotMap
from services.control.node_slots import NodeSlots
from services.plane_sim.plane import SimLease, SimRegionLock
from tests.unit.clocks import ManualClock

DETECTION_S = 1.0
HANDBACK_WAIT_S = 0.5


def slots(locks: list[SimRegionLock], index: int, clock: ManualClock) -> NodeSlots:
    return NodeSlots(
        region="a",
        node_index=index,
        leases=[SimLease(lock) for lock in locks],
        slot_map=SlotMap(8, {"a": 1.0}),
        detection_s=DETECTION_S,
        handback_wait_s=HANDBACK_WAIT_S,
        clock=clock,
    )


def reply(node: NodeSlots) -> dict[str, Any]:
    return {"slots": sorted(node.held), "wants_own_slot": node.wants_own_slot()}


async def no_resign(_slot: int) -> None:
    return None


async def test_a_sibling_never_heard_gets_a_moment_to_start() -> None:
    clock = ManualClock()
    locks = [SimRegionLock(), SimRegionLock()]
    first = slots(locks, 0, clock)
    await first.keep(no_resign)
    assert first.held == {0}  # slot 1's node may be starting too
    clock.now_s += DETECTION_S / 2
    await first.keep(no_resign)
    assert first.held == {0, 1}  # it did not come: its slot is led by this node


async def test_a_handback_left_free_is_taken_again_and_not_handed_back_on_the_same_ask() -> None:
    """The sibling asked, was handed its slot, and died before it took it: after
    ``handback_wait_s`` the slot is led again, and the sibling's old ask does not hand it back
    a second time; a reply heard after that does."""
    clock = ManualClock()
    locks = [SimRegionLock(), SimRegionLock()]
    first = slots(locks, 0, clock)
    clock.now_s += DETECTION_S
    await first.keep(no_resign)
    assert first.held == {0, 1}  # its sibling is not running
    second = slots(locks, 1, clock)
    resigned: list[int] = []

    async def resign(slot: int) -> None:
        resigned.append(slot)

    await second.keep(no_resign)
    assert second.held == set() and second.wants_own_slot()
    first.heard_sibling(1, reply(second))
    await first.keep(resign)
    assert first.held == {0} and resigned == [1] and locks[1].holder is None

    # the sibling dies before it takes the slot: still asked, not taken, until the wait is over
    clock.now_s += HANDBACK_WAIT_S / 2
    await first.keep(resign)
    assert first.held == {0}
    clock.now_s += HANDBACK_WAIT_S
    await first.keep(resign)
    assert first.held == {0, 1}
    await first.keep(resign)
    assert first.held == {0, 1} and resigned == [1]  # the old ask hands nothing back

    clock.now_s += 0.1
    first.heard_sibling(1, {"slots": [], "wants_own_slot": True})  # alive after all, asks anew
    await first.keep(resign)
    assert first.held == {0} and resigned == [1, 1]


async def test_a_node_that_cannot_reach_its_lease_store_does_not_ask() -> None:
    clock = ManualClock()
    locks = [SimRegionLock(), SimRegionLock()]
    node = slots(locks, 1, clock)
    locks[1].holder = SimLease(locks[1])
    await node.keep(no_resign)
    assert node.wants_own_slot()
    unreachable = SimLease(locks[1])
    unreachable.reachable = False
    node._leases[1] = unreachable
    assert not node.wants_own_slot()
