"""Limits and timeouts of the log core. Every queue, batch, retry and wait has a named maximum."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogConfig:
    shard_count: int = 64
    #: W: replicas that must durably hold an entry before it is acknowledged (None: majority)
    write_quorum: int | None = None

    #: most entries in one append call to one replica
    batch_events_max: int = 256
    #: most entries a shard leader holds that are not yet committed; proposals beyond are shed
    inflight_entries_max: int = 4096
    #: committed entries a leader keeps in memory for lagging replicas (older ones are re-read)
    buffer_entries_max: int = 8192
    #: most entries a prepare returns in its tail (the rest is read with read_log)
    prepare_tail_max: int = 4096

    #: one replica call (prepare, append, read) before it counts as lost
    replica_call_timeout_s: float = 2.0
    #: an append waits this long for its quorum before the caller gets NoQuorum (outcome unknown)
    append_timeout_s: float = 5.0
    #: lead_shard gives up after this long without a quorum
    lead_timeout_s: float = 5.0
    #: a replica failing, or not answering, for this long does not count towards a quorum
    #: when deciding to fail fast (a cut-off leader answers 503 at once instead of hanging)
    replica_suspect_after_s: float = 1.0
    #: replication retry backoff (jittered, doubling, capped)
    retry_backoff_min_s: float = 0.01
    retry_backoff_max_s: float = 0.5
    #: a waiting append re-checks this often whether its quorum is still reachable, and gives
    #: up early (NoQuorum, outcome unknown) when it is not
    quorum_check_s: float = 0.1
    #: idle leaders push their commit position to replicas after this long
    commit_push_delay_s: float = 0.02

    #: conversations whose state a leader caches (LRU; conversations with writes in flight stay)
    conversation_cache_max: int = 20_000
    #: page size when loading a conversation's history into the leader's state
    conversation_page_events: int = 1000
    #: longest conversation the log accepts (events)
    conversation_events_max: int = 1_000_000

    def quorum(self, replica_count: int) -> int:
        w = self.write_quorum if self.write_quorum is not None else replica_count // 2 + 1
        if not 1 <= w <= replica_count:
            raise ValueError(f"write_quorum {w} outside 1..{replica_count}")
        return w

    def prepare_quorum(self, replica_count: int) -> int:
        """Replicas that must promise an epoch: a majority (so one leader per epoch) that also
        intersects every write quorum (so recovery sees every acknowledged entry)."""
        return max(replica_count // 2 + 1, replica_count - self.quorum(replica_count) + 1)
