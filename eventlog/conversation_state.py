"""Per-conversation rules of the log, pure: seq assignment, idempotency keys, tool attempts/effects.

A shard leader keeps one ``ConversationState`` per conversation it has touched, built from the
committed history (``from_history``) and updated synchronously with every proposal, so deciding
and proposing happen with no await in between (no two appends can take the same seq).
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
from eventlog.model import CONVERSATION_CREATED, EVENT_TYPES, LogEntry
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


@dataclass
class Attempt:
    attempt: LogEntry
    effect: LogEntry | None = None


@dataclass
class ConversationState:
    created: LogEntry
    last_seq: int = 0
    #: idempotency key -> entry that used it (committed or in flight)
    keys: dict[str, LogEntry] = field(default_factory=dict)
    attempts: dict[str, Attempt] = field(default_factory=dict)
    #: highest lsn of an entry of this conversation proposed by the current leader
    last_lsn: int = 0
    #: (lsn, seq) of proposed entries not yet seen committed, lsn order (bounded by the
    #: leader's in-flight limit); reads answer ``committed_last_seq``, never ``last_seq``
    proposed: deque[tuple[int, int]] = field(default_factory=deque)
    committed_seq: int = 0

    @property
    def tenant_id(self) -> str:
        return self.created.tenant_id

    @property
    def created_body(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.created.body)
        return body

    @classmethod
    def from_history(cls, entries: list[LogEntry]) -> ConversationState:
        """State after the given committed entries (seq order, starting with seq 0)."""
        if not entries or entries[0].event_type != CONVERSATION_CREATED:
            raise InvariantViolation("conversation history does not start with its creation")
        state = cls(created=entries[0])
        for entry in entries[1:]:
            state.apply(entry)
        state.proposed.clear()
        state.committed_seq = state.last_seq
        return state

    def committed_last_seq(self, commit_lsn: int) -> int:
        """The seq of the conversation's last entry at or below ``commit_lsn``."""
        while self.proposed and self.proposed[0][0] <= commit_lsn:
            self.committed_seq = self.proposed.popleft()[1]
        return self.committed_seq

    def apply(self, entry: LogEntry) -> None:
        if entry.seq != self.last_seq + 1:
            raise InvariantViolation(
                f"conversation {entry.conversation_id}: seq {entry.seq} after {self.last_seq}"
            )
        self.last_seq = entry.seq
        self.last_lsn = max(self.last_lsn, entry.lsn)
        self.proposed.append((entry.lsn, entry.seq))
        if entry.idempotency_key is not None:
            self.keys[entry.idempotency_key] = entry
        if entry.attempt_id is not None:
            if entry.event_type == "tool.attempt":
                self.attempts.setdefault(entry.attempt_id, Attempt(entry))
            elif entry.event_type == "tool.effect":
                attempt = self.attempts.get(entry.attempt_id)
                if attempt is None or attempt.effect is not None:
                    raise InvariantViolation(
                        f"conversation {entry.conversation_id}: effect for attempt "
                        f"{entry.attempt_id} without attempt or twice"
                    )
                attempt.effect = entry

    def existing_result(
        self,
        event_type: str,
        attempt_id: str | None,
        request_fingerprint: str,
        idempotency_key: str | None,
    ) -> LogEntry | None:
        """The entry an identical earlier request produced (to return it again), or None when
        the request is new. Raises when it conflicts with what the log already holds."""
        if idempotency_key is not None and idempotency_key in self.keys:
            earlier = self.keys[idempotency_key]
            if entry_fingerprint(earlier) != request_fingerprint:
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
            if entry_fingerprint(attempt.attempt) != request_fingerprint:
                raise Conflict(f"attempt {attempt_id!r} is already recorded with other arguments")
            return attempt.attempt
        if attempt is None:
            raise UnknownAttempt(f"no tool.attempt {attempt_id!r} in this conversation")
        if attempt.effect is None:
            return None
        if entry_fingerprint(attempt.effect) != request_fingerprint:
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


def entry_fingerprint(entry: LogEntry) -> str:
    value: str = json.loads(entry.body)["fingerprint"]
    return value
