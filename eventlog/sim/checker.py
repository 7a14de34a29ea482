"""Invariant checks of a simulated run. Each returns a list of violations (empty: all hold).

``History`` checks as the run goes: one committing region per (shard, epoch), no lsn committed
twice with different entries, and at every commit that each replica counted toward it
acknowledged it in the store it was counted as (``WitnessedReplica`` reports what each store
incarnation accepted). The last one catches a wiped store counted under its old name when it
happens, not only when a later fault turns it into a lost ack (issue 32, bug 1). The functions
below check the final logs: no holes, nothing committed lost or changed, gapless seqs, one
effect per attempt, no acknowledged event lost, replicas' committed prefixes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eventlog.model import LogEntry


def identity(entry: LogEntry) -> tuple[int, str, int, str]:
    """What makes two copies of an entry the same entry (the stamp may not be compared)."""
    return (entry.lsn, entry.conversation_id, entry.seq, entry.body)


@dataclass
class History:
    """What the clients and leaders saw while the simulation ran."""

    #: (conversation_id, seq) -> event_id, for every append a client saw acknowledged
    acked: dict[tuple[str, int], str] = field(default_factory=dict)
    #: (conversation_id, idempotency_key) -> seqs acknowledged under that key
    acked_keys: dict[tuple[str, str], set[int]] = field(default_factory=lambda: defaultdict(set))
    #: (shard, lsn) -> identity of the entry committed there
    committed: dict[tuple[int, int], tuple[int, str, int, str]] = field(default_factory=dict)
    #: (shard, epoch) -> region that committed in that epoch
    committers: dict[tuple[int, int], str] = field(default_factory=dict)
    #: (store_id, shard, epoch) -> the highest lsn that store accepted an append at that epoch
    #: through (``WitnessedReplica``): what each store *incarnation* acknowledged
    accepted: dict[tuple[str, int, int], int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def on_accept(self, store_id: str, shard: int, epoch: int, match_lsn: int) -> None:
        key = (store_id, shard, epoch)
        self.accepted[key] = max(self.accepted.get(key, 0), match_lsn)

    def on_commit(
        self,
        region: str,
        shard: int,
        epoch: int,
        entries: Sequence[LogEntry],
        counted: Mapping[str, str | None],
    ) -> None:
        if entries:
            self._check_counted_acks(
                f"{region}'s leader of shard {shard}", shard, epoch, entries[-1].lsn, counted
            )
        owner = self.committers.setdefault((shard, epoch), region)
        if owner != region:
            self.violations.append(
                f"split brain: shard {shard} epoch {epoch} committed by {owner} and {region}"
            )
        for entry in entries:
            seen = self.committed.setdefault((shard, entry.lsn), identity(entry))
            if seen != identity(entry):
                self.violations.append(
                    f"divergence: shard {shard} lsn {entry.lsn} committed twice with "
                    f"different entries ({seen[1]}#{seen[2]} vs "
                    f"{entry.conversation_id}#{entry.seq})"
                )

    def _check_counted_acks(
        self, leader: str, shard: int, epoch: int, lsn: int, counted: Mapping[str, str | None]
    ) -> None:
        """Every replica a leader counts toward a commit acknowledged it in the store it was
        counted as: the incarnation of the store its node vouched for accepted, at the
        leader's epoch, an append through the committed lsn. A store wiped (or replaced)
        since is another incarnation: acks it makes under the old name would let a quorum
        miss every store that holds what an earlier quorum acknowledged (issue 32, bug 1).
        A replica counted under no identity (its node never named one) is not checked."""
        for replica, store_id in sorted(counted.items()):
            if store_id is None:
                continue
            through = self.accepted.get((store_id, shard, epoch), 0)
            if through < lsn:
                self.violations.append(
                    f"ack from another store: {leader} at epoch {epoch} counted {replica} as "
                    f"store {store_id} toward lsn {lsn}, which that store accepted only "
                    f"through {through}"
                )


def check_final_log(shard: int, log: list[LogEntry], history: History) -> list[str]:
    problems: list[str] = []
    if [e.lsn for e in log] != list(range(1, len(log) + 1)):
        problems.append(f"shard {shard}: final log has holes")
    for entry in log:
        seen = history.committed.get((shard, entry.lsn))
        if seen is not None and seen != identity(entry):
            problems.append(f"shard {shard}: lsn {entry.lsn} differs from what was committed")
    for s, lsn in history.committed:
        if s == shard and lsn > len(log):
            problems.append(f"shard {shard}: committed lsn {lsn} missing from the final log")
    seqs: dict[str, list[int]] = defaultdict(list)
    attempts: dict[tuple[str, str], int] = {}
    effects: dict[tuple[str, str], int] = defaultdict(int)
    for entry in log:
        if not entry.conversation_id:
            continue
        seqs[entry.conversation_id].append(entry.seq)
        if entry.event_type == "tool.attempt" and entry.attempt_id:
            attempts.setdefault((entry.conversation_id, entry.attempt_id), entry.seq)
        if entry.event_type == "tool.effect" and entry.attempt_id:
            key = (entry.conversation_id, entry.attempt_id)
            effects[key] += 1
            if key not in attempts:
                problems.append(f"{key}: effect committed without an earlier attempt")
    for conversation_id, found in seqs.items():
        if found != list(range(len(found))):
            problems.append(f"{conversation_id}: seqs not gapless in log order: {found[:12]}")
    for key, count in effects.items():
        if count > 1:
            problems.append(f"{key}: {count} committed effects for one attempt")
    return problems


def check_acknowledged(logs: dict[int, list[LogEntry]], history: History) -> list[str]:
    present: dict[tuple[str, int], str] = {}
    for log in logs.values():
        for entry in log:
            if entry.conversation_id and entry.seq > 0:
                present[(entry.conversation_id, entry.seq)] = json.loads(entry.body)["event_id"]
    problems = [
        f"acknowledged event lost: {conv}#{seq} ({event_id})"
        for (conv, seq), event_id in history.acked.items()
        if present.get((conv, seq)) != event_id
    ]
    problems += [
        f"idempotency key {key} acknowledged at several seqs {sorted(seqs)}"
        for key, seqs in history.acked_keys.items()
        if len(seqs) > 1
    ]
    return problems


def check_replica_prefix(
    region: str, shard: int, replica_log: list[LogEntry], commit_lsn: int, final: list[LogEntry]
) -> list[str]:
    """A replica's log up to its commit hint must be the final log's prefix."""
    for entry in replica_log[:commit_lsn]:
        if entry.lsn > len(final) or identity(final[entry.lsn - 1]) != identity(entry):
            return [f"{region}: shard {shard} committed prefix diverges at lsn {entry.lsn}"]
    return []
