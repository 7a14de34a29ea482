"""A region's log node: leads some shards and serves the ConversationLog API for them.

The node writes to every region's replica directly (through the ``replicas`` ports); it holds no
durable state of its own. Calls for shards it does not lead raise ``NotLeader`` with the leader's
region when known, so the routing layer can forward them.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from eventlog.aio import bounded
from eventlog.clock import Clock
from eventlog.committed_view import CommittedView
from eventlog.config import LogConfig
from eventlog.conversation_cache import ConversationCache, ConversationKey
from eventlog.conversation_state import (
    ConversationExists,
    ConversationState,
    EntryRef,
    StateConfig,
    fingerprint,
    validate_event,
)
from eventlog.conversations import (
    AppendedEvent,
    ConversationInfo,
    ConversationLog,
    EventRecord,
    ToolAttemptStatus,
)
from eventlog.errors import (
    Conflict,
    ConvplaneError,
    InvalidRequest,
    InvariantViolation,
    LeadershipChanged,
    NoQuorum,
    NotFound,
    NotLeader,
)
from eventlog.identity import IdentityGuard
from eventlog.identity_sweep import sweep_identities
from eventlog.json_text import compact_json
from eventlog.leader import CommitObserver, ShardLeader
from eventlog.model import CONVERSATION_CREATED, LogEntry, ShardStatus, record_entry
from eventlog.read_index import QuorumChoice
from eventlog.replica import ReplicaStore
from eventlog.sharding import shard_of
from eventlog.wire_values import check_text, check_value

__all__ = ["LogConfig", "LogNode"]


@dataclass
class _LoadSlot:
    """A conversation's history-load lock, and how many callers hold or wait for it: it
    leaves ``LogNode._loading`` only when none does."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class LogListener(Protocol):
    """What other parts of a region (e.g. the replay scheduler) learn from the log node.
    Called synchronously; implementations must not block (enqueue and return)."""

    def shard_led(self, shard: int, epoch: int, previous_region: str | None) -> None:
        """This node now leads ``shard``; ``previous_region`` is who this node last knew as its
        leader (None: unknown). A different region means the shard moved here."""

    def conversation_written(self, tenant_id: str, conversation_id: str, event_type: str) -> None:
        """An event of the conversation was just acknowledged (a live request is under way)."""


class LogNode(ConversationLog):
    def __init__(
        self,
        *,
        region: str,
        replicas: Mapping[str, ReplicaStore],
        config: LogConfig,
        clock: Clock,
        rng: random.Random,
        observer: CommitObserver | None = None,
        listeners: Sequence[LogListener] = (),
    ) -> None:
        if region not in replicas:
            raise ValueError(f"region {region!r} has no replica")
        self.region = region
        self.config = config
        self._replicas = dict(replicas)
        self._clock = clock
        self._rng = rng
        self._observer = observer
        self._listeners = list(listeners)
        self._region_unreachable: Callable[[str], bool] | None = None
        self._leaders: dict[int, ShardLeader] = {}
        self._hints: dict[int, str | None] = {}
        self._epochs_seen: dict[int, int] = {}
        #: (shard, tenant_id, conversation_id) -> state: a conversation is keyed by its tenant
        #: and its id, so two tenants' conversations never share state, seqs or keys
        self._states = ConversationCache(
            config.conversation_cache_max, config.conversation_cache_bytes_max
        )
        self._state_limits = StateConfig(
            idempotency_keys_max=config.idempotency_keys_per_conversation_max,
            idempotency_retention_ms=int(config.idempotency_retention_s * 1000),
            tool_attempts_max=config.tool_attempts_per_conversation_max,
        )
        #: one history load at a time per conversation (``_state``)
        self._loading: dict[ConversationKey, _LoadSlot] = {}
        self._leading: dict[int, asyncio.Lock] = {}
        #: the last region known to lead each shard (hint or self), for LogListener.shard_led
        self._previous_leader: dict[int, str] = {}
        #: which replicas may vote and ack (``eventlog.identity``); filled by verify_replicas
        self.identity = IdentityGuard()
        #: which replicas every shard's read rounds ask first (``eventlog.read_index``)
        self._read_choice = QuorumChoice()
        self._verify_lock = asyncio.Lock()

    # --- leadership -----------------------------------------------------------------------

    def shard_of(self, conversation_id: str) -> int:
        """The conversation's shard; InvalidRequest for an id no store could hold."""
        check_text(conversation_id, "conversation_id", column=True)
        return shard_of(conversation_id, self.config.shard_count)

    def leads(self, shard: int) -> bool:
        leader = self._leaders.get(shard)
        return leader is not None and leader.serving

    def led_shards(self) -> list[int]:
        return sorted(s for s in self._leaders if self.leads(s))

    def leader(self, shard: int) -> ShardLeader | None:
        return self._leaders.get(shard)

    def committed_view(self, shard: int) -> CommittedView:
        """For readers beside the log (replay's planner): ``shard``'s committed log as of now
        (``eventlog.committed_view``). NotLeader when this node does not serve the shard."""
        leader = self._leaders.get(shard)
        if leader is None or not leader.serving:
            raise NotLeader(f"{self.region} does not lead shard {shard}", shard=shard)
        return CommittedView(self._replicas[leader.read_source()], shard, leader.commit_lsn)

    def set_region_health(self, unreachable: Callable[[str], bool]) -> None:
        """Let leaders fail fast (503 no_quorum) while too few regions answer the failure
        detector, instead of waiting for replica calls to time out. Affects new leaders."""
        self._region_unreachable = unreachable
        for leader in self._leaders.values():
            leader.set_region_health(unreachable)

    def add_listener(self, listener: LogListener) -> None:
        self._listeners.append(listener)

    def set_leader_hint(self, shard: int, region: str | None) -> None:
        self._hints[shard] = region
        if region is not None:
            self._previous_leader[shard] = region

    async def lead_shard(self, shard: int) -> int:
        """Become the shard's leader at an epoch higher than any promised; returns the epoch.
        Calls for one shard are serialized: two overlapping calls would otherwise install two
        leaders, the second over the first's conversation state."""
        if not self.identity.swept:
            await self.verify_replicas()  # never lead on votes nobody has vouched for
        lock = self._leading.setdefault(shard, asyncio.Lock())
        async with lock:
            await self.resign_shard(shard)
            leader = ShardLeader(
                shard=shard,
                region=self.region,
                replicas=self._replicas,
                config=self.config,
                clock=self._clock,
                rng=self._rng,
                min_epoch=self._epochs_seen.get(shard, 0),
                observer=self._observer,
                region_unreachable=self._region_unreachable,
                identity=self.identity,
                read_choice=self._read_choice,
                commit_push_delay_s=(
                    self.config.commit_push_delay_s
                    if shard < self.config.shard_count
                    else self.config.records_commit_push_delay_s
                ),
            )
            try:
                epoch = await leader.lead()
            finally:
                self._epochs_seen[shard] = max(
                    self._epochs_seen.get(shard, 0), leader.highest_seen_epoch
                )
            if shard in self._leaders or self._states.holds_shard(shard):
                raise InvariantViolation(f"shard {shard}: state left over from another leader")
            previous_region = self._previous_leader.get(shard)
            self._leaders[shard] = leader
            self._hints[shard] = self.region
            self._previous_leader[shard] = self.region
            for listener in self._listeners:
                listener.shard_led(shard, epoch, previous_region)
            return epoch

    async def resign_shard(self, shard: int, *, publish_commit: bool = False) -> None:
        """Stop leading ``shard``. ``publish_commit``: a voluntary handoff first pushes the
        commit position to the replicas (``ShardLeader.publish_commit``, bounded by a replica
        call's timeout), so that the next leader, learning from them, knows every record."""
        leader = self._leaders.get(shard)
        if publish_commit and leader is not None and leader.serving:
            await leader.publish_commit(self.config.replica_call_timeout_s)
            if self._leaders.get(shard) is not leader:
                return  # re-led meanwhile: the new leader is not this call's to stop
        self._leaders.pop(shard, None)
        if leader is not None:
            self._epochs_seen[shard] = max(
                self._epochs_seen.get(shard, 0), leader.highest_seen_epoch
            )
            await leader.close()
            if self._hints.get(shard) == self.region:
                self._hints[shard] = None
        self._states.drop_shard(shard)

    async def verify_replicas(self) -> list[str]:
        """Sweep every store's identity and registry (``eventlog.identity_sweep``), record what
        a new cluster trusts on first use, and update which replicas count. Returns the regions
        found quarantined by this sweep that were not before (the caller alerts)."""
        async with self._verify_lock:
            newly_quarantined = await sweep_identities(
                self._replicas, self.identity, self.config.replica_call_timeout_s
            )
            for leader in self._leaders.values():
                leader.identities_vouched()
            return newly_quarantined

    async def publish_commits(self) -> None:
        """Before a graceful stop: every serving leader pushes its commit position to the
        replicas (``ShardLeader.publish_commit``), all at once, under one replica call's
        timeout. Conversation shards push theirs lazily while running
        (``LogConfig.commit_push_delay_s``); after this, the replicas' hints are as fresh as
        the leaders' memory, so the next leaders recover less and a reader of the replicas
        alone (the chaos audit) sees every acknowledged entry inside the committed prefix."""
        serving = [leader for leader in self._leaders.values() if leader.serving]
        timeout_s = self.config.replica_call_timeout_s
        await asyncio.gather(*(leader.publish_commit(timeout_s) for leader in serving))

    async def close(self) -> None:
        for shard in list(self._leaders):
            await self.resign_shard(shard)

    def _serving_leader(self, shard: int) -> ShardLeader:
        leader = self._leaders.get(shard)
        if leader is not None and leader.serving:
            return leader
        hint = self._hints.get(shard)
        raise NotLeader(
            f"region {self.region} does not lead shard {shard}",
            shard=shard,
            leader_region=hint if hint != self.region else None,
            retry_after_s=0.5,
        )

    # --- conversation state ---------------------------------------------------------------

    async def _state(
        self, shard: int, tenant_id: str, conversation_id: str
    ) -> tuple[ShardLeader, ConversationState | None]:
        """The shard's serving leader and the conversation's state (None: no such conversation).
        No await separates the return from the caller's decision.

        "No such conversation" is an answer about the committed log of the leader that is
        serving when this returns: a load that started under another leader (the shard was
        re-led while the history was being read) proves nothing about the new leader's log, whose
        recovered tail may hold the conversation. Such a load fails retryable
        (``LeadershipChanged``); it is never read as absence, or a retried create would write a
        second ``conversation.created`` and restart the seqs."""
        key = (shard, tenant_id, conversation_id)
        leader = self._serving_leader(shard)
        state = self._states.get(key)
        if state is None:
            # A caller that gives up (its deadline cancels it) must not take the lock out of
            # the map while others still wait for it: the next caller would make a second lock
            # and load the conversation beside a load in progress, and two states of one
            # conversation decide two entries with the same seq (the whole-plane simulation,
            # seed 1935, once refusals began to confirm leadership and calls took longer)
            slot = self._loading.setdefault(key, _LoadSlot())
            slot.users += 1
            try:
                async with slot.lock:
                    state = self._states.get(key)
                    if state is None:
                        state = await self._load_state(leader, tenant_id, conversation_id)
                        if self._leaders.get(shard) is not leader or not leader.serving:
                            raise LeadershipChanged(
                                f"shard {shard}: leader changed while conversation "
                                f"{conversation_id!r} was being read; retry",
                                retry_after_s=0.1,
                            )
                        if state is not None:
                            self._states.put(key, state)
            finally:
                slot.users -= 1
                if slot.users == 0:
                    self._loading.pop(key, None)
        if self._leaders.get(shard) is not leader:
            # re-led while this call waited for another caller's load: that load's answer (or
            # its absence) belongs to the old leader
            raise LeadershipChanged(
                f"shard {shard}: leader changed during the call; retry", retry_after_s=0.1
            )
        leader = self._serving_leader(shard)
        if state is not None:
            state.forget_keys(self._clock.wall_ms())
            self._states.account(state)
            self._states.touch(key)
            self._evict(keep=key)
        return leader, state

    def _evict(self, keep: ConversationKey) -> None:
        """Bound the cache (``ConversationCache``); never the state just handed to a caller
        (``keep``), nor one with writes in flight: its decisions are in no replica yet."""

        def evictable(key: ConversationKey, state: ConversationState) -> bool:
            shard_leader = self._leaders.get(key[0])
            in_flight = shard_leader is not None and state.last_lsn > shard_leader.commit_lsn
            return key != keep and not in_flight

        self._states.evict(evictable)

    async def _load_state(
        self, leader: ShardLeader, tenant_id: str, conversation_id: str
    ) -> ConversationState | None:
        """The conversation's state from its committed history, applied a page at a time: a
        load holds one page (``conversation_page_events`` entries) and the state, never the
        whole history. None: no such conversation."""
        state: ConversationState | None = None
        page_events = self.config.conversation_page_events
        after_seq = -1
        while True:
            page = await self._read_conversation(
                leader, tenant_id, conversation_id, after_seq, page_events
            )
            for entry in page:
                if state is not None:
                    state.apply(entry)
                elif entry.event_type == CONVERSATION_CREATED and entry.seq == 0:
                    state = ConversationState(created=entry, limits=self._state_limits)
                else:
                    raise InvariantViolation(
                        f"conversation {conversation_id!r}: history does not start with its "
                        "creation"
                    )
            if len(page) < page_events:
                break
            after_seq = page[-1].seq
            del page  # one page at a time
        if state is not None:
            state.loaded()
        return state

    async def _read_conversation(
        self, leader: ShardLeader, tenant_id: str, conversation_id: str, after_seq: int, limit: int
    ) -> list[LogEntry]:
        """Committed entries, from a replica known to hold everything committed."""
        commit_lsn = leader.commit_lsn
        last_error: ConvplaneError | None = None
        timeout_s = self.config.replica_call_timeout_s
        for region in leader.read_sources():
            # The source held the commit point when chosen; a database that was wiped or
            # restored since answers from an emptier log. The store says what it is as of the
            # page's own read (one snapshot, ``ReplicaStore.read_page_snapshot``): its identity
            # (a wiped store has a new one, for good, even once it is refilled) and its status
            # (a log shorter than the commit point lost data), at least as fresh as asked_at.
            asked_at = self._clock.monotonic()
            try:
                page = await bounded(
                    self._replicas[region].read_page_snapshot(
                        leader.shard, tenant_id, conversation_id, after_seq, limit, commit_lsn
                    ),
                    timeout_s,
                )
            except (ConvplaneError, TimeoutError) as exc:
                last_error = exc if isinstance(exc, ConvplaneError) else None
                continue
            if not self.identity.vouches_for(region, page.store_id):
                continue
            if not self._source_lost_data(leader, region, page.status, asked_at, commit_lsn):
                return page.entries
        raise last_error or NoQuorum(
            f"shard {leader.shard}: no replica answered a read", retry_after_s=0.5
        )

    @staticmethod
    def _source_lost_data(
        leader: ShardLeader, region: str, status: ShardStatus, asked_at: float, commit_lsn: int
    ) -> bool:
        """Whether a read's source, by its status as of the read, holds less than the commit
        point the read was bounded by (it lost data: wiped or restored)."""
        leader.note_replica_status(region, status, asked_at)
        return status.last_lsn < commit_lsn

    @staticmethod
    async def _confirm_refusal(leader: ShardLeader, state: ConversationState | None) -> None:
        """Before a write is refused on what this leader remembers of a conversation (no such
        conversation, an unknown attempt, another effect, another seq, a reused key...): the
        entries the refusal rests on are committed, and the leadership is confirmed, as for a
        read (``confirm_leadership``). A refusal is a read of the conversation: a deposed or
        cut-off leader must not answer one from its memory, where a new leader may already have
        committed the attempt the refusal says is unknown (Porcupine caught exactly that,
        ``tests/chaos/test_linearizable_history.py``). Raises retryably when it cannot."""
        await leader.confirm_leadership()  # first: a cut-off leader fails fast
        if state is not None:
            await leader.wait_committed(state.last_lsn)

    # --- ConversationLog ------------------------------------------------------------------

    async def create_conversation(
        self,
        tenant_id: str,
        conversation_id: str,
        model_revision: str,
        metadata: dict[str, Any],
    ) -> ConversationInfo:
        check_text(tenant_id, "tenant_id", column=True)
        check_text(model_revision, "model_revision")
        check_value(metadata, "metadata")
        shard = self.shard_of(conversation_id)
        leader, state = await self._state(shard, tenant_id, conversation_id)
        request_fp = fingerprint(
            CONVERSATION_CREATED, {"model_revision": model_revision, "metadata": metadata}, None
        )
        if state is not None:
            created = json.loads(state.created.body)
            if created["fingerprint"] != request_fp:
                await self._confirm_refusal(leader, state)
                raise ConversationExists(f"conversation {conversation_id!r} already exists")
            await leader.wait_committed(state.created.lsn)
            return self._info(leader, state)
        now_ms = self._clock.wall_ms()
        body = {
            "event_id": self._new_id("conv"),
            "tenant_id": tenant_id,
            "conversation_id": conversation_id,
            "type": CONVERSATION_CREATED,
            "model_revision": model_revision,
            "metadata": metadata,
            "created_at_ms": now_ms,
            "fingerprint": request_fp,
        }
        entry = _propose_body(leader, body)
        state = ConversationState(created=entry, limits=self._state_limits, last_lsn=entry.lsn)
        self._states.put((shard, tenant_id, conversation_id), state)
        await leader.wait_committed(entry.lsn)
        return self._info(leader, state)

    async def append_event(
        self,
        tenant_id: str,
        conversation_id: str,
        event_type: str,
        payload: dict[str, Any],
        *,
        token_count: int | None = None,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> AppendedEvent:
        attempt_id = validate_event(event_type, payload)
        if token_count is not None and token_count < 0:
            raise InvalidRequest("token_count must be >= 0")
        if idempotency_key is not None:
            check_text(idempotency_key, "Idempotency-Key", column=True)
        shard = self.shard_of(conversation_id)
        leader, state = await self._state(shard, tenant_id, conversation_id)
        if state is None:
            await self._confirm_refusal(leader, None)
            raise NotFound(f"no conversation {conversation_id!r}")
        # From here to propose: no await, so the decision and the seq are atomic.
        request_fp = fingerprint(event_type, payload, token_count)
        try:
            earlier = state.existing_result(event_type, attempt_id, request_fp, idempotency_key)
            if earlier is None:
                state.check_expected_seq(expected_seq)
                state.check_room_for_attempt(attempt_id, event_type)
                if state.last_seq >= self.config.conversation_events_max:
                    raise InvalidRequest(
                        f"conversation {conversation_id!r} is full "
                        f"({self.config.conversation_events_max} events)"
                    )
        except (Conflict, InvalidRequest):
            await self._confirm_refusal(leader, state)
            raise
        if earlier is not None:
            await leader.wait_committed(earlier.lsn)
            return self._appended(leader, conversation_id, earlier, replayed=True)
        seq = state.last_seq + 1
        now_ms = self._clock.wall_ms()
        tokens = token_count if token_count is not None else estimate_tokens(payload)
        body = {
            "event_id": self._new_id("evt"),
            "tenant_id": tenant_id,
            "conversation_id": conversation_id,
            "seq": seq,
            "type": event_type,
            "payload": payload,
            "token_count": tokens,
            "created_at_ms": now_ms,
            "idempotency_key": idempotency_key,
            "fingerprint": request_fp,
        }
        entry = _propose_body(leader, body, attempt_id=attempt_id)
        state.apply(entry, body)
        self._states.account(state)
        await leader.wait_committed(entry.lsn)
        for listener in self._listeners:
            listener.conversation_written(tenant_id, conversation_id, event_type)
        return self._appended(leader, conversation_id, EntryRef.of(entry, body), replayed=False)

    async def get_conversation(self, tenant_id: str, conversation_id: str) -> ConversationInfo:
        leader, state = await self._committed_state(tenant_id, conversation_id)
        return self._info(leader, state)

    async def list_events(
        self, tenant_id: str, conversation_id: str, after_seq: int, limit: int
    ) -> list[EventRecord]:
        if limit < 1:
            raise InvalidRequest("limit must be >= 1")
        leader, _ = await self._committed_state(tenant_id, conversation_id)
        records: list[EventRecord] = []
        page_bytes = 0
        after_seq = max(after_seq, 0)
        # Read in pieces of conversation_page_events, and stop at read_page_bytes_max: a
        # page of ``limit`` huge events is never materialised whole (at least one event always,
        # so a reader always moves on).
        while len(records) < limit and page_bytes < self.config.read_page_bytes_max:
            want = min(limit - len(records), self.config.conversation_page_events)
            entries = await self._read_conversation(
                leader, tenant_id, conversation_id, after_seq, want
            )
            for entry in entries:
                records.append(event_record(entry))
                page_bytes += len(entry.body)
            if len(entries) < want:
                break
            after_seq = entries[-1].seq
        return records

    async def tool_attempt(
        self, tenant_id: str, conversation_id: str, attempt_id: str
    ) -> ToolAttemptStatus:
        leader, state = await self._committed_state(tenant_id, conversation_id)
        attempt = state.attempts.get(attempt_id)
        if attempt is None or attempt.attempt.lsn > leader.commit_lsn:
            raise NotFound(f"no tool attempt {attempt_id!r} in conversation {conversation_id!r}")
        refs = [attempt.attempt]
        state_name: Any = "pending"
        if attempt.effect is not None and attempt.effect.lsn <= leader.commit_lsn:
            refs.append(attempt.effect)
            state_name = attempt.effect.effect_status
        # the state keeps no bodies: the events are read back (one each, committed, by seq)
        events = []
        for ref in refs:
            read = await self._read_conversation(leader, tenant_id, conversation_id, ref.seq - 1, 1)
            if [(e.seq, e.lsn) for e in read] != [(ref.seq, ref.lsn)]:
                raise InvariantViolation(
                    f"conversation {conversation_id!r}: committed seq {ref.seq} (lsn {ref.lsn}) "
                    f"read back as {[(e.seq, e.lsn) for e in read]}"
                )
            events.append(event_record(read[0]))
        return ToolAttemptStatus(attempt_id=attempt_id, state=state_name, events=tuple(events))

    async def _committed_state(
        self, tenant_id: str, conversation_id: str
    ) -> tuple[ShardLeader, ConversationState]:
        """For reads: the leadership is confirmed first (``eventlog.read_index``), so the state
        and commit position read after it hold every write acknowledged before the read began;
        callers show only what is at or below ``commit_lsn``."""
        shard = self.shard_of(conversation_id)
        confirmed = self._serving_leader(shard)
        await confirmed.confirm_leadership()
        leader, state = await self._state(shard, tenant_id, conversation_id)
        if leader is not confirmed:
            raise LeadershipChanged(
                f"shard {shard}: leader changed during the read; retry", retry_after_s=0.1
            )
        if state is None or state.created.lsn > leader.commit_lsn:
            raise NotFound(f"no conversation {conversation_id!r}")
        return leader, state

    # --- records outside conversations (the control shard) -------------------------------

    async def append_record(self, shard: int, record_type: str, body: dict[str, Any]) -> int:
        """Append a record that belongs to no conversation (e.g. to the control shard, whose id
        is outside ``0..shard_count-1``); returns its lsn once W replicas hold it."""
        if not record_type.startswith("control."):
            raise InvalidRequest("record types start with 'control.'")
        leader = self._serving_leader(shard)
        now_ms = self._clock.wall_ms()
        text = json.dumps(body, separators=(",", ":"), sort_keys=True)
        entry = leader.propose(
            lambda lsn, epoch: record_entry(lsn, epoch, record_type, text, now_ms)
        )
        await leader.wait_committed(entry.lsn)
        return entry.lsn

    async def read_committed(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        """Committed entries of a shard this node leads (any kind), lsn order. Leadership is
        confirmed first (``eventlog.read_index``): a leader that was paused or cut off while
        another took over must learn that here, not keep answering from its old commit point
        (the control plane reads its own records this way)."""
        leader = self._serving_leader(shard)
        await leader.confirm_leadership()
        commit_lsn = leader.commit_lsn
        if after_lsn >= commit_lsn:
            return []
        entries = await bounded(
            self._replicas[leader.read_source()].read_log(
                shard, after_lsn, min(limit, commit_lsn - after_lsn)
            ),
            self.config.replica_call_timeout_s,
        )
        return [e for e in entries if e.lsn <= commit_lsn]

    # --- helpers --------------------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{self._rng.getrandbits(80):020x}"

    def _info(self, leader: ShardLeader, state: ConversationState) -> ConversationInfo:
        created = state.created_body
        return ConversationInfo(
            conversation_id=state.created.conversation_id,
            tenant_id=state.tenant_id,
            leader_region=self.region,
            model_revision=created["model_revision"],
            metadata=created["metadata"],
            created_at_ms=state.created.created_at_ms,
            last_seq=state.committed_last_seq(leader.commit_lsn),
            shard=leader.shard,
            epoch=leader.epoch,
        )

    def _appended(
        self, leader: ShardLeader, conversation_id: str, ref: EntryRef, *, replayed: bool
    ) -> AppendedEvent:
        return AppendedEvent(
            event_id=ref.event_id,
            conversation_id=conversation_id,
            seq=ref.seq,
            event_type=ref.event_type,
            acked_by=leader.holders(ref.lsn),
            committed_at_ms=ref.created_at_ms,
            shard=leader.shard,
            epoch=ref.epoch,
            lsn=ref.lsn,
            replayed=replayed,
        )


def _propose_body(
    leader: ShardLeader, body: dict[str, Any], attempt_id: str | None = None
) -> LogEntry:
    """Propose an entry of a conversation; its indexed fields are copies of its body's."""
    text = compact_json(body)
    return leader.propose(
        lambda lsn, epoch: LogEntry(
            lsn=lsn,
            epoch=epoch,
            tenant_id=body["tenant_id"],
            conversation_id=body["conversation_id"],
            seq=body.get("seq", 0),
            event_type=body["type"],
            idempotency_key=body.get("idempotency_key"),
            attempt_id=attempt_id,
            token_count=body.get("token_count", 0),
            created_at_ms=body["created_at_ms"],
            body=text,
        )
    )


def estimate_tokens(payload: dict[str, Any]) -> int:
    """A rough prompt-token estimate (4 characters a token) when the client sends none."""
    content = payload.get("content")
    text = content if isinstance(content, str) else json.dumps(payload)
    return max(1, len(text) // 4)


def event_record(entry: LogEntry) -> EventRecord:
    body = json.loads(entry.body)
    return EventRecord(
        event_id=body["event_id"],
        conversation_id=entry.conversation_id,
        seq=entry.seq,
        event_type=entry.event_type,
        payload=body.get("payload", {}),
        token_count=entry.token_count,
        created_at_ms=entry.created_at_ms,
    )
