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
    #: bytes of not yet committed entries a shard leader holds (bodies, estimated); a proposal
    #: that would pass it is shed (Overloaded), unless nothing is in flight (one always goes)
    inflight_bytes_max: int = 16 * 1024 * 1024
    #: committed entries a leader keeps in memory for lagging replicas (older ones are re-read)
    buffer_entries_max: int = 8192
    #: ... and at most this many bytes of them (bodies, estimated): huge events keep few
    buffer_bytes_max: int = 16 * 1024 * 1024
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
    #: a conversation shard's leader, idle, pushes its commit position to the replicas after
    #: this long. Only a future leader's recovery reads those replicas' commit hints (it then
    #: re-replicates less), and any later append carries the position anyway: so the push is
    #: lazy. At 0.02 s, under REST load (a shard's next append ~50 ms away) nearly every event
    #: cost each replica a second, empty sub-batch: 0.37 x the peer's throughput against 0.45
    #: at 0.5 s (``bench/rest.py``, same runs)
    commit_push_delay_s: float = 1.0
    #: ... and the leader of a shard outside the conversations (the control shard): other
    #: nodes learn its records from those hints, so its position goes out almost at once
    records_commit_push_delay_s: float = 0.02
    #: how often at most a busy leader leaves the replicas' held positions at one store with
    #: its appends (``eventlog.identity``: how a store rolled back to an older copy of itself
    #: is found); each time costs the store an upsert per region that moved. An idle push
    #: (the commit push above) always carries them. Measured (a local PostgreSQL, one group of
    #: 10 one-entry sub-batches with positions for 3 regions each): 977 against 621 us of
    #: server CPU per group without them; every 0.1 s that is paid a few times a second
    positions_push_every_s: float = 0.1

    #: conversations whose state a leader caches (LRU; conversations with writes in flight stay)
    conversation_cache_max: int = 20_000
    #: ... and the estimated bytes of those states (``ConversationState.size_bytes``: refs of
    #: keyed and tool entries, never bodies), all shards of the node together
    conversation_cache_bytes_max: int = 256 * 1024 * 1024
    #: entries per replica read when loading a conversation's state or reading its events: a
    #: load holds one such page, never the whole history (128 x a 256 KiB event = 32 MiB)
    conversation_page_events: int = 128
    #: a list_events call stops reading once its events reach this many body bytes (so it
    #: holds at most this plus one page; at least one event is returned: a reader moves on)
    read_page_bytes_max: int = 4 * 1024 * 1024
    #: an Idempotency-Key is remembered for this long after its event (then a retry with it is
    #: a new append); 24 h, as payment APIs do
    idempotency_retention_s: float = 24 * 3600.0
    #: ... and at most this many keys per conversation, the newest (a retry after more than
    #: this many later keyed appends to the same conversation is a new append)
    idempotency_keys_per_conversation_max: int = 10_000
    #: tool attempts a conversation may record: each is remembered for good (it guards at most
    #: one effect), so their number is what bounds a conversation's state
    tool_attempts_per_conversation_max: int = 10_000
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
