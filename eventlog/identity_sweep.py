"""One identity sweep over the replica ports: the I/O half of ``eventlog.identity``.

``eventlog.identity`` decides (``plan_sweep``, ``IdentityGuard.apply``) from what the stores
hold; this module reads each store's identity and registry, writes the records the plan says
every store must hold, and applies the plan to the node's guard. ``LogNode.verify_replicas``
runs it, one sweep at a time, and tells its leaders afterwards.

A store that fails to answer within a replica call's timeout (or answers ``ConvplaneError`` or
``OSError``) is observed as unknown, and a record write that fails so is left to the next sweep:
one store does not fail the sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from eventlog.aio import bounded
from eventlog.errors import ConvplaneError
from eventlog.identity import IdentityGuard, Observation, plan_sweep
from eventlog.replica import ReplicaStore


async def sweep_identities(
    replicas: Mapping[str, ReplicaStore], identity: IdentityGuard, timeout_s: float
) -> list[str]:
    """Sweep every store's identity and registry, record what a new cluster trusts on first
    use, and apply the plan to ``identity``. Returns the regions found quarantined by this
    sweep that were not before."""
    regions = list(replicas)
    observed = await asyncio.gather(*(_observe_identity(replicas[r], timeout_s) for r in regions))
    plan = plan_sweep(dict(zip(regions, observed, strict=True)))
    for store_region, records in plan.writes.items():
        for region, record in records.items():
            with contextlib.suppress(ConvplaneError, TimeoutError, OSError):
                await bounded(replicas[store_region].record_identity(region, record), timeout_s)
    return identity.apply(plan)


async def _observe_identity(store: ReplicaStore, timeout_s: float) -> Observation:
    try:
        store_id = await bounded(store.identity(), timeout_s)
        registry = await bounded(store.registry(), timeout_s)
    except (ConvplaneError, TimeoutError, OSError):
        return Observation(None, None)
    return Observation(store_id, registry)
