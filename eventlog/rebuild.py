"""Rebuild a quarantined replica from a quorum, then re-admit it (``eventlog.identity``).

An operator runs this (``convplane replica rebuild --region R``) after a region's database was
lost, re-provisioned or restored. For every shard it copies into the target the most up-to-date
log among ``N - W + 1`` of the *other* replicas: an entry acknowledged with the target's help
before the loss is on ``W - 1`` other replicas, and any ``N - W + 1`` of the ``N - 1`` others
include one of them (Raft's up-to-date rule then picks a log that holds every committed entry).
The copy is written with the protocol's own ``append`` at the highest epoch promised among them,
so a live leader replicating to the target meanwhile is neither fenced nor contradicted. Only
when every shard is copied does the target's identity go into every reachable registry with a
higher generation: from the next sweep on, nodes count its votes and acks again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eventlog.aio import bounded
from eventlog.config import LogConfig
from eventlog.errors import ConvplaneError, InvalidRequest, NoQuorum
from eventlog.identity import IdentityRecord
from eventlog.model import Accepted, ShardStatus
from eventlog.replica import ReplicaStore

#: entries copied per append call
REBUILD_PAGE_ENTRIES = 512
#: attempts per shard when a live leader's newer epoch overtakes the copy
REBUILD_SHARD_ATTEMPTS_MAX = 5


@dataclass(frozen=True, slots=True)
class RebuildReport:
    region: str
    store_id: str
    generation: int
    shards: int
    entries_copied: int


async def rebuild_replica(
    replicas: Mapping[str, ReplicaStore],
    target: str,
    shards: Iterable[int],
    config: LogConfig,
) -> RebuildReport:
    if target not in replicas:
        raise InvalidRequest(f"no region {target!r}")
    others = {r: s for r, s in replicas.items() if r != target}
    needed = len(replicas) - config.quorum(len(replicas)) + 1
    copied = 0
    shard_list = list(shards)
    for shard in shard_list:
        copied += await _rebuild_shard(others, replicas[target], shard, needed, config)
    return await _readmit(replicas, target, config, len(shard_list), copied)


async def _rebuild_shard(
    others: Mapping[str, ReplicaStore],
    target: ReplicaStore,
    shard: int,
    needed: int,
    config: LogConfig,
) -> int:
    timeout_s = config.replica_call_timeout_s
    for _attempt in range(REBUILD_SHARD_ATTEMPTS_MAX):
        replies = await asyncio.gather(
            *(bounded(store.status(shard), timeout_s) for store in others.values()),
            return_exceptions=True,
        )
        statuses: dict[str, ShardStatus] = {
            region: reply
            for region, reply in zip(others, replies, strict=True)
            if isinstance(reply, ShardStatus)
        }
        if len(statuses) < needed:
            raise NoQuorum(
                f"shard {shard}: {len(statuses)} other replicas answered, {needed} needed to "
                "rebuild from a quorum",
                retry_after_s=1.0,
            )
        source = max(statuses, key=lambda r: (statuses[r].last_epoch, statuses[r].last_lsn, r))
        # at or above the target's own promise too: a new leader's prepare may have reached
        # the quarantined store (its vote did not count) and been refused elsewhere, and an
        # append below that promise would be rejected on every attempt
        target_promise = await bounded(target.status(shard), timeout_s)
        epoch = max(target_promise.promised_epoch, *(s.promised_epoch for s in statuses.values()))
        commit_lsn = max(s.commit_lsn for s in statuses.values())
        copied = await _copy_log(others[source], target, shard, epoch, commit_lsn, config)
        if copied is not None:
            return copied
    raise NoQuorum(f"shard {shard}: newer epochs kept overtaking the rebuild", retry_after_s=1.0)


async def _copy_log(
    source: ReplicaStore,
    target: ReplicaStore,
    shard: int,
    epoch: int,
    commit_lsn: int,
    config: LogConfig,
) -> int | None:
    """Copy ``source``'s whole log of ``shard``; None when a newer epoch rejected the copy or
    overtook it on the source."""
    timeout_s = config.replica_call_timeout_s
    prev_lsn, prev_epoch, copied = 0, 0, 0
    while True:
        page = await bounded(source.read_log(shard, prev_lsn, REBUILD_PAGE_ENTRIES), timeout_s)
        if not page:
            return copied
        if page[-1].epoch > epoch:
            # A newer leader wrote to the source after its status was read: its entries
            # cannot be appended at this epoch (``append``'s contract). Start again from
            # fresh statuses, at the newer epoch.
            return None
        reply = await bounded(
            target.append(shard, epoch, prev_lsn, prev_epoch, page, min(commit_lsn, page[-1].lsn)),
            timeout_s,
        )
        if not isinstance(reply, Accepted):
            return None  # Rejected: a newer leader; Mismatch cannot happen copying from lsn 1
        prev_lsn, prev_epoch = page[-1].lsn, page[-1].epoch
        copied += len(page)


async def _readmit(
    replicas: Mapping[str, ReplicaStore],
    target: str,
    config: LogConfig,
    shards: int,
    copied: int,
) -> RebuildReport:
    timeout_s = config.replica_call_timeout_s
    store_id = await bounded(replicas[target].identity(), timeout_s)
    registries = await asyncio.gather(
        *(bounded(store.registry(), timeout_s) for store in replicas.values()),
        return_exceptions=True,
    )
    known = [r[target].generation for r in registries if isinstance(r, dict) and target in r]
    record = IdentityRecord(store_id, max(known, default=0) + 1)
    written = 0
    for store in replicas.values():
        try:
            await bounded(store.record_identity(target, record), timeout_s)
            written += 1
        except (ConvplaneError, TimeoutError, OSError):
            continue  # it learns the record from the others' registries at the next sweep
    if written < config.prepare_quorum(len(replicas)):
        raise NoQuorum(
            f"re-admission of {target} written to {written} registries; run it again",
            retry_after_s=1.0,
        )
    return RebuildReport(target, store_id, record.generation, shards, copied)
