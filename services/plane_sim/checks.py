"""The whole-plane checker: the log's invariants, linearizable reads, and what control promises.

On top of the log simulator's checks (``eventlog.sim.checker``: no acknowledged event lost,
committed histories never diverge, gapless seqs, at most one effect per attempt, one committing
region per (shard, epoch)), this checks every read a client saw:

* a transcript read contains every event acknowledged before the read began, and every event it
  showed is in the final log (nothing uncommitted, nothing lost);
* a ``last_seq`` read is at least the highest acknowledged seq before it began, and the event
  at that seq exists in the final log;
* a tool attempt whose effect was acknowledged before the read began is not ``pending``;

and of control: poison inputs got ``InvalidRequest`` and nothing else, no leader crashed, and
failback after healing took a bounded number of placement changes (no flapping).
"""

from __future__ import annotations

import json

from eventlog.model import LogEntry
from eventlog.sim.checker import check_acknowledged, check_final_log, check_replica_prefix
from services.plane_sim.plane import SimPlane
from services.plane_sim.workload import Observed, ReadSeen


async def check_plane(plane: SimPlane, observed: Observed) -> list[str]:
    violations: list[str] = []
    logs: dict[int, list[LogEntry]] = {}
    placement = plane.controllers()[0].placement()
    for shard in range(plane.cluster.shard_count):
        node = plane.node(placement.assignment[shard])
        leader = node.leader(shard) if node is not None else None
        if leader is None or not leader.serving:
            violations.append(f"shard {shard}: no serving leader to read the final log from")
            continue
        source = plane.replicas[leader.read_source()]
        log = await source.read_log(shard, 0, leader.commit_lsn)
        logs[shard] = log
        plane.counts["committed_entries"] += len(log)
        violations += check_final_log(shard, log, plane.history)
        for region, replica in plane.replicas.items():
            status = await replica.status(shard)
            replica_log = await replica.read_log(shard, 0, status.last_lsn)
            violations += check_replica_prefix(region, shard, replica_log, status.commit_lsn, log)
    violations += check_acknowledged(logs, plane.history)
    violations += check_reads(observed.reads, logs)
    plane.counts["reads_checked"] += len(observed.reads)
    violations += [f"poison input answered {a}" for a in observed.poison_answers]
    for controller in plane.controllers():
        for shard in range(plane.cluster.shard_count + 1):
            leader = controller.node.leader(shard)
            if leader is not None and leader.crash is not None:
                violations.append(f"{controller.region} shard {shard}: {leader.crash!r}")
    return violations


def check_reads(reads: list[ReadSeen], logs: dict[int, list[LogEntry]]) -> list[str]:
    final: dict[tuple[str, int], str] = {}
    for log in logs.values():
        for entry in log:
            if entry.conversation_id:
                final[(entry.conversation_id, entry.seq)] = json.loads(entry.body)["event_id"]
    problems: list[str] = []
    for read in reads:
        conv = read.conversation_id
        if read.kind == "events":
            got = dict(read.events)
            stale = [s for s, eid in read.acked_before.items() if got.get(s) != eid]
            if stale:
                problems.append(f"stale read: {conv} transcript misses acked seqs {stale[:5]}")
            unknown = [s for s, eid in read.events if final.get((conv, s)) != eid]
            if unknown:
                problems.append(f"read of uncommitted or lost events: {conv} seqs {unknown[:5]}")
        elif read.kind == "last_seq":
            if read.acked_before and read.last_seq < max(read.acked_before):
                problems.append(
                    f"stale read: {conv} last_seq {read.last_seq} < acked {max(read.acked_before)}"
                )
            if read.last_seq > 0 and (conv, read.last_seq) not in final:
                problems.append(f"last_seq read never committed: {conv} seq {read.last_seq}")
        elif read.kind == "attempt":
            if read.attempt_id in read.effects_before and read.attempt_state == "pending":
                problems.append(
                    f"stale read: {conv} attempt {read.attempt_id} pending after its effect "
                    "was acknowledged"
                )
    return problems


def failback_moves_problem(
    version_at_heal: int, final_version: int, shard_count: int, per_step: int, regions: int
) -> list[str]:
    """After healing, each region may come back (one record) and have its shards moved back in
    bounded steps, and an evacuation may be lifted: at most ``regions x (steps + 2)`` changes.
    More is flapping."""
    bound = regions * (-(-shard_count // per_step) + 2)
    moves = final_version - version_at_heal
    if moves > bound:
        return [f"failback flapped: {moves} placement changes after healing (bound {bound})"]
    return []
