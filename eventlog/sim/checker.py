"""Invariant checks of a simulated run. Each returns a list of violations (empty: all hold)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
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
    violations: list[str] = field(default_factory=list)

    def on_commit(self, region: str, shard: int, epoch: int, entries: Sequence[LogEntry]) -> None:
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
