"""Two nodes of one region hand a node slot over on real PostgreSQL leases
(``services.control.node_slots``): a node takes its dead sibling's slot, and hands it back once
the sibling runs again and asks; the sibling then leads the slot's shards. A released lease
must end its database session: a pooled session would keep the lock, and the slot would stay
with nobody."""

from __future__ import annotations

from typing import Any

import pytest

from eventlog.memory_replica import MemoryReplica
from eventlog.stores.region_lease import RegionLease, open_region_lease
from tests.unit.test_region_nodes import REGIONS, Replies, _by_slot, _reconciled, controller

TIMEOUT_S = 5.0


async def _leases(dsn: str) -> list[RegionLease]:
    return [await open_region_lease(dsn, "a", slot, timeout_s=TIMEOUT_S) for slot in range(2)]


@pytest.mark.postgres
async def test_a_slot_goes_to_a_sibling_and_back_on_postgres(pg_databases: list[str]) -> None:
    dsn = pg_databases[0]
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    replies: dict[str, dict[str, Any] | None] = {}
    first_leases, second_leases = await _leases(dsn), await _leases(dsn)
    first = controller("a", 0, replicas, first_leases, Replies(replies))
    second = controller("a", 1, replicas, second_leases)
    split = _by_slot(first.placement().shards_of("a"))
    try:
        await _reconciled(first)
        await _reconciled(second)
        assert first.slots.held == {0} and second.slots.held == {1}
        replies["a/1"] = second.health_reply()
        await first._probe_siblings()

        await second.node.close()  # dies: its sessions end
        for lease in second_leases:
            await lease.close()
        await _reconciled(first)
        assert first.slots.held == {0, 1}
        assert first.node.led_shards() == sorted(split[0] + split[1])

        second_leases = await _leases(dsn)
        again = controller("a", 1, replicas, second_leases)
        await _reconciled(again)
        assert again.health_reply()["wants_own_slot"] is True
        replies["a/1"] = again.health_reply()
        await first._probe_siblings()
        await _reconciled(first)
        assert first.slots.held == {0}
        await _reconciled(again)
        assert again.slots.held == {1} and again.node.led_shards() == split[1]
        await again.node.close()
    finally:
        await first.node.close()
        for lease in [*first_leases, *second_leases]:
            await lease.close()
