"""Per-conversation rules of the log, pure: seq assignment, idempotency keys, tool attempts/effects.

A shard leader keeps one ``ConversationState`` per conversation it has touched, built from the
committed history (applied page by page, never held whole) and updated synchronously with every
proposal, so deciding and proposing happen with no await in between (no two appends can take the
same seq). It keeps references, not bodies, and a bounded number of them (``StateConfig``).
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from eventlog.errors import (
    Conflict,
    EffectConflict,
    IdempotencyKeyReused,
    InvalidRequest,
    InvariantViolation,
    SeqConflict,
)
from eventlog.model import EVENT_TYPES, LogEntry
from eventlog.wire_values import check_text, check_value

EFFECT_STATES = ("committed", "failed")


class UnknownAttempt(Conflict):
    code = "unknown_attempt"


class ConversationExists(Conflict):
    code = "conversation_exists"


def fingerprint(event_type: str, payload: dict[str, Any], token_count: int | None) -> str:
    """Digest of what a client asked for, to tell an identical retry from a different request."""
    canonical = json.dumps(
        [event_type, payload, token_count], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


#: events whose ``payload.attempt_id`` identifies them: the log keeps every attempt and its
#: effect for the conversation's life, so an identical repeat is answered with the first
TOOL_EVENT_TYPES = frozenset({"tool.attempt", "tool.effect"})


def repeat_gets_first_result(event_type: str, idempotency_key: str | None) -> bool:
    """Whether the log answers an identical repeat of this append with the first one's result
    (or applies it if the first never landed), so sending it again can never apply it twice:
    it carries an Idempotency-Key, or it is a tool event (``existing_result``)."""
    return idempotency_key is not None or event_type in TOOL_EVENT_TYPES


def validate_event(event_type: str, payload: dict[str, Any]) -> str | None:
    """Check the log's rules for an event; return its attempt_id (tool events) or None.
    Every value must be one every store holds and hands back (``eventlog.wire_values``)."""
    if event_type not in EVENT_TYPES:
        raise InvalidRequest(f"unknown event type {event_type!r}; one of {', '.join(EVENT_TYPES)}")
    check_value(payload, "payload")
    if not event_type.startswith("tool."):
        return None
    attempt_id = payload.get("attempt_id")
    if not isinstance(attempt_id, str) or not 1 <= len(attempt_id) <= 128:
        raise InvalidRequest(f"{event_type} needs payload.attempt_id (a string of 1-128 chars)")
    check_text(attempt_id, "payload.attempt_id", column=True)
    if event_type == "tool.attempt":
        for name in ("tool", "argument_digest"):
            if not isinstance(payload.get(name), str) or not payload[name]:
                raise InvalidRequest(f"tool.attempt needs payload.{name} (a non-empty string)")
    elif payload.get("status") not in EFFECT_STATES:
        raise InvalidRequest("tool.effect needs payload.status: 'committed' or 'failed'")
    return attempt_id


#: what a leader charges a conversation's state for one remembered entry besides its strings
#: (the reference object, its dict slot, the ints): an estimate, the cache's unit of account
ENTRY_REF_BYTES = 240
#: what a conversation's state costs before any remembered entry (the object, counters, deque)
STATE_BASE_BYTES = 1024


@dataclass(frozen=True, slots=True)
class EntryRef:
    """What a leader remembers of a keyed or tool entry: enough to return it to an identical
    retry and to tell a conflicting one, never its body (bodies are read from a replica when a
    caller needs them)."""

    lsn: int
    epoch: int
    seq: int
    event_type: str
    event_id: str
    created_at_ms: int
    fingerprint: str
    effect_status: str | None = None  # a tool.effect's payload.status

    @classmethod
    def of(cls, entry: LogEntry, body: dict[str, Any] | None = None) -> EntryRef:
        body = json.loads(entry.body) if body is None else body
        status = (
            body.get("payload", {}).get("status") if entry.event_type == "tool.effect" else None
        )
        return cls(
            lsn=entry.lsn,
            epoch=entry.epoch,
            seq=entry.seq,
            event_type=entry.event_type,
            event_id=body["event_id"],
            created_at_ms=entry.created_at_ms,
            fingerprint=body["fingerprint"],
            effect_status=status,
        )

    def size_bytes(self) -> int:
        return ENTRY_REF_BYTES + len(self.event_id) + len(self.fingerprint)


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Per-conversation bounds of a leader's state (``eventlog.config.LogConfig`` names them)."""

    #: keys remembered per conversation (the newest); older ones are forgotten
    idempotency_keys_max: int = 10_000
    #: a key is remembered this long after its event (then forgotten)
    idempotency_retention_ms: int = 24 * 3600 * 1000
    #: tool attempts a conversation may record (each is kept: at most one effect per attempt)
    tool_attempts_max: int = 10_000


@dataclass
class Attempt:
    attempt: EntryRef
    effect: EntryRef | None = None


@dataclass
class ConversationState:
    """A conversation as its shard's leader needs it to decide an append: its creation, its
    last seq, the idempotency keys of its retention window and its tool attempts, as
    ``EntryRef`` s. Its size is bounded by ``StateConfig``, not by the conversation's length."""

    created: LogEntry
    limits: StateConfig = field(default_factory=StateConfig)
    last_seq: int = 0
    #: idempotency key -> entry that used it (committed or in flight), oldest first; only the
    #: retention window's (``forget_keys``) and at most ``limits.idempotency_keys_max``
    keys: dict[str, EntryRef] = field(default_factory=dict)
    attempts: dict[str, Attempt] = field(default_factory=dict)
    #: highest lsn of an entry of this conversation proposed by the current leader
    last_lsn: int = 0
    #: (lsn, seq) of proposed entries not yet seen committed, lsn order (bounded by the
    #: leader's in-flight limit); reads answer ``committed_last_seq``, never ``last_seq``
    proposed: deque[tuple[int, int]] = field(default_factory=deque)
    committed_seq: int = 0
    #: estimated memory of this state (``STATE_BASE_BYTES`` + the creation + remembered refs)
    size_bytes: int = 0
    #: what the leader's cache last counted for this state (``eventlog.conversation_cache``)
    counted_bytes: int = 0

    def __post_init__(self) -> None:
        self.size_bytes = STATE_BASE_BYTES + len(self.created.body)

    @property
    def tenant_id(self) -> str:
        return self.created.tenant_id

    @property
    def created_body(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.created.body)
        return body

    def committed_last_seq(self, commit_lsn: int) -> int:
        """The seq of the conversation's last entry at or below ``commit_lsn``."""
        while self.proposed and self.proposed[0][0] <= commit_lsn:
            self.committed_seq = self.proposed.popleft()[1]
        return self.committed_seq

    def loaded(self) -> None:
        """Called once the committed history has been applied: nothing of it is in flight."""
        self.proposed.clear()
        self.committed_seq = self.last_seq

    def apply(self, entry: LogEntry, body: dict[str, Any] | None = None) -> None:
        """Take the conversation's next entry (``body``: its parsed body when the caller has it;
        parsed here only for keyed and tool entries)."""
        if entry.seq != self.last_seq + 1:
            raise InvariantViolation(
                f"conversation {entry.conversation_id}: seq {entry.seq} after {self.last_seq}"
            )
        self.last_seq = entry.seq
        self.last_lsn = max(self.last_lsn, entry.lsn)
        self.proposed.append((entry.lsn, entry.seq))
        if entry.idempotency_key is None and entry.attempt_id is None:
            return
        ref = EntryRef.of(entry, body)
        if entry.idempotency_key is not None:
            self._remember_key(entry.idempotency_key, ref)
        if entry.attempt_id is not None:
            if entry.event_type == "tool.attempt":
                if entry.attempt_id not in self.attempts:
                    self.attempts[entry.attempt_id] = Attempt(ref)
                    self.size_bytes += len(entry.attempt_id) + ref.size_bytes()
            elif entry.event_type == "tool.effect":
                attempt = self.attempts.get(entry.attempt_id)
                if attempt is None or attempt.effect is not None:
                    raise InvariantViolation(
                        f"conversation {entry.conversation_id}: effect for attempt "
                        f"{entry.attempt_id} without attempt or twice"
                    )
                attempt.effect = ref
                self.size_bytes += ref.size_bytes()

    def _remember_key(self, key: str, ref: EntryRef) -> None:
        old = self.keys.pop(key, None)
        if old is not None:
            self.size_bytes -= len(key) + old.size_bytes()
        self.keys[key] = ref
        self.size_bytes += len(key) + ref.size_bytes()
        while len(self.keys) > self.limits.idempotency_keys_max:
            self._forget_oldest_key()

    def _forget_oldest_key(self) -> None:
        key = next(iter(self.keys))
        self.size_bytes -= len(key) + self.keys.pop(key).size_bytes()

    def forget_keys(self, now_ms: int) -> None:
        """Forget the keys whose event is older than the retention window (oldest first, so
        this costs one look when there is nothing to forget)."""
        horizon_ms = now_ms - self.limits.idempotency_retention_ms
        while self.keys and next(iter(self.keys.values())).created_at_ms < horizon_ms:
            self._forget_oldest_key()

    def check_room_for_attempt(self, attempt_id: str | None, event_type: str) -> None:
        """A new tool attempt past ``tool_attempts_max`` is refused (attempts are never
        forgotten: they guard at most one effect each)."""
        if (
            event_type == "tool.attempt"
            and attempt_id not in self.attempts
            and len(self.attempts) >= self.limits.tool_attempts_max
        ):
            raise InvalidRequest(
                f"the conversation has {len(self.attempts)} tool attempts, the most it may "
                "record; start a new conversation"
            )

    def existing_result(
        self,
        event_type: str,
        attempt_id: str | None,
        request_fingerprint: str,
        idempotency_key: str | None,
    ) -> EntryRef | None:
        """The entry an identical earlier request produced (to return it again), or None when
        the request is new. Raises when it conflicts with what the log already holds."""
        if idempotency_key is not None and idempotency_key in self.keys:
            earlier = self.keys[idempotency_key]
            if earlier.fingerprint != request_fingerprint:
                raise IdempotencyKeyReused(
                    f"Idempotency-Key {idempotency_key!r} was used for a different request "
                    f"(seq {earlier.seq})"
                )
            return earlier
        if attempt_id is None:
            return None
        attempt = self.attempts.get(attempt_id)
        if event_type == "tool.attempt":
            if attempt is None:
                return None
            if attempt.attempt.fingerprint != request_fingerprint:
                raise Conflict(f"attempt {attempt_id!r} is already recorded with other arguments")
            return attempt.attempt
        if attempt is None:
            raise UnknownAttempt(f"no tool.attempt {attempt_id!r} in this conversation")
        if attempt.effect is None:
            return None
        if attempt.effect.fingerprint != request_fingerprint:
            raise EffectConflict(
                f"attempt {attempt_id!r} already has a different effect (seq {attempt.effect.seq})"
            )
        return attempt.effect

    def check_expected_seq(self, expected_seq: int | None) -> None:
        if expected_seq is not None and expected_seq != self.last_seq:
            raise SeqConflict(
                f"expected_seq {expected_seq} but the conversation's last seq is {self.last_seq}",
                last_seq=self.last_seq,
            )
