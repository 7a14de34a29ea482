"""The whole-plane checker: the log's invariants, linearizable reads, and what control promises.

On top of the log simulator's checks (``eventlog.sim.checker``: no acknowledged event lost,
committed histories never diverge, gapless seqs, at most one effect per attempt, one committing
region per (shard, epoch), and, at every commit, each replica counted toward it acknowledged it
in the store it was counted as), this checks every read a client saw:

* a transcript read contains every event acknowledged before the read began, and every event it
  showed is in the final log (nothing uncommitted, nothing lost);
* a ``last_seq`` read is at least the highest acknowledged seq before it began, and the event
  at that seq exists in the final log;
* a tool attempt whose effect was acknowledged before the read began is not ``pending``;

and of control: poison inputs got ``InvalidRequest`` and nothing else, no leader crashed, and
failback after healing took a bounded number of placement changes (no flapping).

Liveness of the control shard and of drills (the run states each bound, ``plane_sim.run``):

* ``control_problems``: after healing, exactly one serving region leads the control shard and
  every serving node names it as the control leader;
* ``drill_problems``: every drill any node knows has reached a terminal state;
* ``StandoffWatch``: no two serving nodes name each other as the control leader, neither of
  them leading it, for longer than a bound (the standoff that leaves nobody to commit the
  record that would end it).
"""

from __future__ import annotations

import json

from eventlog.model import LogEntry
from eventlog.sim.checker import check_acknowledged, check_final_log, check_replica_prefix
from regions.placement import place_shards
from services.control.region_nodes import node_target, target_region
from services.plane_sim.plane import SimPlane
from services.plane_sim.workload import Observed, ReadSeen


async def check_plane(plane: SimPlane, observed: Observed) -> list[str]:
    violations: list[str] = []
    logs: dict[int, list[LogEntry]] = {}
    placement = plane.controllers()[0].placement()
    for shard in range(plane.cluster.shard_count):
        node = plane.node(placement.assignment[shard], shard)
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


def control_problems(plane: SimPlane) -> list[str]:
    shard = plane.cluster.shard_count
    leaders = plane.leaders_of(shard)
    if len(leaders) != 1:
        return [f"control shard led by {leaders}"]
    views = {p.name: p.controller.control_leader() for p in plane.serving() if p.controller}
    if set(views.values()) != set(leaders):
        return [f"control shard led by {leaders[0]}, nodes name {views}"]
    return []


def drill_problems(plane: SimPlane) -> list[str]:
    problems = []
    for process in plane.serving():
        for drill in process.ops.active_drills() if process.ops is not None else ():
            problems.append(
                f"{process.name}: drill {drill.drill_id} ({drill.spec.kind} of "
                f"{drill.spec.region}) still {drill.phase}"
            )
    return problems


def regions_led_once(plane: SimPlane) -> list[str]:
    """Regions of several nodes: exactly one running node of each holds each of its node
    slots, and once all its nodes run, each holds its own (a slot taken over is handed back)."""
    problems = []
    for region in plane.names:
        count = plane.cluster.region(region).node_count
        if count == 1:
            continue
        running = {
            p.name: p.controller.slots.held
            for p in plane.serving()
            if p.region == region and p.controller is not None
        }
        for slot in range(count):
            holders = [name for name, held in running.items() if slot in held]
            if len(holders) != 1:
                problems.append(f"region {region}: slot {slot} held by {holders}, not by one")
            elif len(running) == count and holders[0] != node_target(region, slot):
                problems.append(f"region {region}: slot {slot} still held by {holders[0]}")
    return problems


def node_fault_problems(plane: SimPlane, now_s: float) -> list[str]:
    """While only single nodes crash (never a region's last), no shard may be placed on another
    region: every running node's placement is the static one, nothing down or evacuated."""
    static = place_shards(plane.cluster.shard_count, plane.cluster.weights())
    problems = []
    for process in plane.serving():
        placement = process.controller.placement() if process.controller is not None else None
        if placement is None:
            continue
        if dict(placement.assignment) != static or placement.down or placement.evacuated:
            problems.append(
                f"t={now_s:.1f}s {process.name}: placement v{placement.version} moved shards "
                f"after node crashes ({placement.reason})"
            )
    return problems


class StandoffWatch:
    """Looks, every few hundred ms of the run, for two serving nodes that name each other as the
    control leader while neither leads it; a pair that stays so longer than ``bound_s`` is a
    violation (once per pair and episode)."""

    def __init__(self, bound_s: float, control_shard: int) -> None:
        self._bound_s = bound_s
        self._shard = control_shard
        self._since: dict[tuple[str, str], float] = {}
        self._reported: set[tuple[str, str]] = set()
        self.violations: list[str] = []

    def look(self, now_s: float, plane: SimPlane) -> None:
        serving = [p for p in plane.serving() if p.controller is not None and p.node is not None]
        views = {p.name: p.controller.control_leader() for p in serving if p.controller}
        leading = {p.region for p in serving if p.node is not None and p.node.leads(self._shard)}
        pairs = {
            (x, y)
            for x, y in views.items()
            if x < y and views.get(y) == x and not {target_region(x), target_region(y)} & leading
        }
        for pair in list(self._since):
            if pair not in pairs:
                del self._since[pair]
                self._reported.discard(pair)
        for pair in pairs:
            since_s = self._since.setdefault(pair, now_s)
            if now_s - since_s > self._bound_s and pair not in self._reported:
                self._reported.add(pair)
                self.violations.append(
                    f"control standoff: {pair[0]} and {pair[1]} named each other, neither "
                    f"leading, for over {self._bound_s:.0f}s (since t={since_s:.1f}s)"
                )
