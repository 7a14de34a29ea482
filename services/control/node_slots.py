"""This node's share of its region's node slots: which slot leases it holds, takes and hands back.

A region of N nodes splits the shards placed on it into N slots (``regions.placement.SlotMap``),
each with a lease in the region's database (``eventlog.stores.region_lease``). Node ``i`` leads
the shards of the slots whose leases it holds:

* it always asks for its own slot ``i``;
* it takes a sibling's slot whose lease is free (the sibling died: its database session or file
  lock went with it), unless that sibling asks for it back (below) or has not been heard since
  this node started and the start is recent (``detection_s / 2``: the sibling may just be
  starting too);
* a sibling that runs again and reaches the lease's store asks for its slot back in its health
  reply (``wants_own_slot``); the holder resigns the slot's shards, then releases the lease, and
  does not take it again while the sibling keeps asking. A sibling that was handed its slot and
  left it free for ``handback_wait_s`` (it died meanwhile) asked in vain: the slot is taken
  again, and only a reply heard after that asks for it anew.

A node answers its peers' probes only while every slot is held by itself or by a sibling heard
holding it within ``detection_s`` + ``lease_freed_s`` (``answers_probes``). A holder whose host
died or drops every packet closes nothing: the database ends its session, and frees its leases,
only once it has not heard it for ``DEAD_HOLDER_S`` (``eventlog.stores.region_lease``), so its
siblings keep the region up that long, and a margin (``LEASE_FREED_S``), while they wait to take
its slots. A holder that hangs
keeps its leases for good (the kernel still answers for it), so no sibling could lead its slots;
past that time its siblings fall silent too, and the region fails over as a region of one hung
node does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eventlog.clock import Clock
from eventlog.stores.region_lease import DEAD_HOLDER_S, RegionLease
from regions.placement import SlotMap

#: how often a held lease is confirmed with its database (a free sibling slot is tried every
#: poll: that is how a dead sibling's slot is taken at once). Losing a held lease (the
#: database ended the session) is rare, and safety never rests on noticing it: two nodes
#: that both lead a slot's shards fence each other's epochs. Each confirmation is a query on
#: the region's database, which a region of several nodes under load has no CPU to spare for
HELD_CONFIRM_EVERY_S = 1.0
#: how long past the detection time a silent holder's lease may take to be free and taken:
#: the database gives it up within DEAD_HOLDER_S, and a sibling takes it at its next lease
#: poll, which a loaded host may run late (the margin)
LEASE_FREED_S = DEAD_HOLDER_S + 2.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SiblingView:
    """What a sibling's last health reply said, and when it was heard."""

    heard_s: float
    slots: frozenset[int]
    wants_own_slot: bool
    led_shards: tuple[int, ...] = ()


def reply_slots(body: Mapping[str, Any], node_count: int) -> list[int]:
    """The slots a node's health reply says it holds; a node of an earlier release says only
    whether it leads the region (all of it)."""
    slots = body.get("slots")
    if isinstance(slots, list):
        return [s for s in slots if isinstance(s, int) and 0 <= s < node_count]
    return list(range(node_count)) if body.get("leads_region", True) is True else []


class NodeSlots:
    def __init__(
        self,
        *,
        region: str,
        node_index: int,
        leases: Sequence[RegionLease],
        slot_map: SlotMap,
        detection_s: float,
        handback_wait_s: float,
        clock: Clock,
        lease_freed_s: float = LEASE_FREED_S,
    ) -> None:
        self.region = region
        self.own = node_index
        self._leases = list(leases)
        self.count = max(1, len(self._leases))
        self._slot_map = slot_map
        #: the slots this node leads; a region of one node has one slot, always its node's
        self.held: set[int] = set() if self._leases else {0}
        self._detection_s = detection_s
        #: how long after a holder fell silent the database frees its leases at the latest
        self._lease_freed_s = lease_freed_s
        self._handback_wait_s = handback_wait_s
        self._clock = clock
        self._started_s = clock.monotonic()
        self._siblings: dict[int, SiblingView] = {}
        #: slot -> when this node handed it back to its sibling
        self._handed_back_s: dict[int, float] = {}
        #: slot -> when the sibling's ask this node no longer honours was heard
        self._void_ask_heard_s: dict[int, float] = {}
        #: slot -> when this node last confirmed its held lease (``HELD_CONFIRM_EVERY_S``)
        self._confirmed_s: dict[int, float] = {}

    @property
    def shared(self) -> bool:
        """Whether the region has several nodes (so slots and leases at all)."""
        return bool(self._leases)

    def slot_of(self, shard: int) -> int:
        return self._slot_map.slot(shard, self.count)

    def leads(self, shard: int) -> bool:
        """Whether this node leads ``shard`` whenever its region does."""
        return self.slot_of(shard) in self.held

    def wants_own_slot(self) -> bool:
        """Whether this node asks for its own slot back: it does not hold it and reaches the
        lease's store (a node that cannot could not lead it)."""
        return self.shared and self.own not in self.held and self._leases[self.own].reachable

    def heard_sibling(self, index: int, body: Mapping[str, Any]) -> list[int]:
        """Note sibling ``index``'s health reply; the slots it says it holds."""
        slots = reply_slots(body, self.count)
        led = body.get("led_shards")
        self._siblings[index] = SiblingView(
            heard_s=self._clock.monotonic(),
            slots=frozenset(slots),
            wants_own_slot=body.get("wants_own_slot") is True,
            led_shards=tuple(s for s in led if isinstance(s, int)) if isinstance(led, list) else (),
        )
        return slots

    def region_view(self, own_led: list[int]) -> tuple[list[int | None], list[int]]:
        """What this node knows of its whole region, for peers that ask one node instead of
        each: per slot, the node holding it (None: none heard within ``detection_s``), and
        the shards the region's nodes lead (its own, ``own_led``, and its siblings' as last
        heard within ``detection_s``)."""
        now_s = self._clock.monotonic()
        fresh = {i: v for i, v in self._siblings.items() if now_s - v.heard_s < self._detection_s}
        holders: list[int | None] = []
        for slot in range(self.count):
            if slot in self.held:
                holders.append(self.own)
            else:
                holders.append(next((i for i, v in fresh.items() if slot in v.slots), None))
        led = set(own_led)
        for view in fresh.values():
            led.update(view.led_shards)
        return holders, sorted(led)

    def answers_probes(self) -> bool:
        """Whether every slot is held by this node or by a sibling heard holding it within
        ``detection_s`` + ``lease_freed_s``: only then may peers count the region up on this
        node's word (past it a silent holder's lease should be free, and it is not)."""
        now_s = self._clock.monotonic()
        window_s = self._detection_s + self._lease_freed_s
        fresh = [v for v in self._siblings.values() if now_s - v.heard_s < window_s]
        return all(
            slot in self.held or any(slot in v.slots for v in fresh) for slot in range(self.count)
        )

    async def keep(self, resign: Callable[[int], Awaitable[None]]) -> bool:
        """One round over every slot's lease: confirm the held ones (resigning a lost one's
        shards through ``resign``), hand back those asked for, take the free ones this node
        may take. Whether it took any (their shards are then to be led)."""
        if not self.shared:
            return False
        taken = await asyncio.gather(*(self._keep(slot, resign) for slot in range(self.count)))
        return any(taken)

    async def _keep(self, slot: int, resign: Callable[[int], Awaitable[None]]) -> bool:
        lease = self._leases[slot]
        if slot in self.held:
            if self._confirm_due(slot) and not await lease.still_held():
                self.held.discard(slot)
                log.error("node %d lost %s's slot %d: resigning it", self.own, self.region, slot)
                await resign(slot)
            elif self._asked_back(slot):
                self.held.discard(slot)
                log.warning("node %d hands %s's slot %d back", self.own, self.region, slot)
                await resign(slot)  # its leaders stop (and push their commits) first
                await lease.release()
                self._handed_back_s[slot] = self._clock.monotonic()
            return False
        if slot != self.own and not self._may_take(slot):
            return False
        if not await lease.try_acquire():
            return False
        self.held.add(slot)
        self._confirmed_s[slot] = self._clock.monotonic()
        self._handed_back_s.pop(slot, None)
        log.warning("node %d holds %s's slot %d: leading its shards", self.own, self.region, slot)
        return True

    def _confirm_due(self, slot: int) -> bool:
        now_s = self._clock.monotonic()
        if now_s - self._confirmed_s.get(slot, float("-inf")) < HELD_CONFIRM_EVERY_S:
            return False
        self._confirmed_s[slot] = now_s
        return True

    def _fresh(self, index: int) -> SiblingView | None:
        view = self._siblings.get(index)
        if view is None or self._clock.monotonic() - view.heard_s >= self._detection_s:
            return None
        return view

    def _asked_back(self, slot: int) -> bool:
        view = self._fresh(slot)
        return (
            slot != self.own
            and view is not None
            and view.wants_own_slot
            and view.heard_s > self._void_ask_heard_s.get(slot, float("-inf"))
        )

    def _may_take(self, slot: int) -> bool:
        """A sibling's free slot: not while it asks for it back (unless it was handed the slot
        ``handback_wait_s`` ago and left it free), nor while it may still be starting."""
        now_s = self._clock.monotonic()
        if self._asked_back(slot):
            handed_s = self._handed_back_s.get(slot)
            if handed_s is None or now_s - handed_s < self._handback_wait_s:
                return False
            self._void_ask_heard_s[slot] = self._siblings[slot].heard_s
        never_heard = slot not in self._siblings
        return not (never_heard and now_s - self._started_s < self._detection_s / 2)
