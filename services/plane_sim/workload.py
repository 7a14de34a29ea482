"""Clients of the simulated plane, and the record of what they saw.

A client enters at a random serving region, as a chat application behind a load balancer does;
a region that does not lead the shard answers ``NotLeader`` with its hint and the client goes
there once (the API's forwarding decision), otherwise it backs off and tries again with the same
Idempotency-Key. Operations: create conversations (throughout the run), appends, tool attempts
with two racing effects, every kind of read, and poison values (which must be refused with
``InvalidRequest`` and nothing else).

Every read is recorded with what had been acknowledged *before it began*, so the checker can
tell a stale read (it misses an earlier ack) and a read of something never committed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from eventlog.conversations import AppendedEvent, ConversationInfo, EventRecord, ToolAttemptStatus
from eventlog.errors import ConvplaneError, InvalidRequest, NotLeader
from eventlog.node import LogNode
from services.plane_sim.plane import SimPlane

TENANT = "t"
CALL_TIMEOUT_S = 2.0
CALL_ATTEMPTS_MAX = 12
POISONS: tuple[dict[str, Any], ...] = (
    {"attempt_id": "p\ud800", "tool": "t", "argument_digest": "d"},
    {"attempt_id": "p\x00", "tool": "t", "argument_digest": "d"},
    {"attempt_id": "p", "tool": "t", "argument_digest": "d", "n": float("inf")},
)


@dataclass(frozen=True, slots=True)
class ReadSeen:
    """One successful read and what was acknowledged before it began."""

    conversation_id: str
    kind: str  # "events", "last_seq" or "attempt"
    acked_before: dict[int, str]  # seq -> event_id acknowledged before the read began
    effects_before: frozenset[str]  # attempt ids whose effect was acknowledged before
    events: tuple[tuple[int, str], ...] = ()  # (seq, event_id) the read returned
    last_seq: int = 0
    attempt_id: str = ""
    attempt_state: str = ""


@dataclass
class Observed:
    reads: list[ReadSeen] = field(default_factory=list)
    effects_acked: set[tuple[str, str]] = field(default_factory=set)
    poison_answers: list[str] = field(default_factory=list)


class Client:
    def __init__(self, plane: SimPlane, observed: Observed, rng: random.Random, name: str) -> None:
        self.plane = plane
        self.observed = observed
        self.rng = rng
        self.name = name
        self.conversations: list[str] = []

    async def call(self, fn: Callable[[LogNode], Awaitable[Any]]) -> Any:
        """The value, a non-retryable error, or None when the retries ran out (unknown)."""
        for _ in range(CALL_ATTEMPTS_MAX):
            serving = self.plane.serving()
            if serving:
                entry = self.rng.choice(serving)
                try:
                    return await self._call_once(entry.name, fn)
                except ConvplaneError as exc:
                    if not exc.retryable:
                        return exc
                except TimeoutError:
                    pass
            await asyncio.sleep(self.rng.uniform(0.02, 0.3))
        return None

    async def _call_once(self, region: str, fn: Callable[[LogNode], Awaitable[Any]]) -> Any:
        node = self.plane.node(region)
        if node is None:
            raise TimeoutError
        try:
            return await asyncio.wait_for(fn(node), CALL_TIMEOUT_S)
        except NotLeader as exc:
            hint = exc.leader_region
            target = self.plane.node(hint, exc.shard) if hint is not None else None
            if target is None or target is node:
                raise
            return await asyncio.wait_for(fn(target), CALL_TIMEOUT_S)  # forwarded once

    def _record(self, conversation_id: str, outcome: object, key: str | None) -> None:
        if isinstance(outcome, AppendedEvent):
            history = self.plane.history
            history.acked[(conversation_id, outcome.seq)] = outcome.event_id
            if key is not None:
                history.acked_keys[(conversation_id, key)].add(outcome.seq)
            self.plane.counts["acked_events"] += 1

    async def run(self, ops: int) -> None:
        for _ in range(2):
            await self.create()
        for op in range(ops):
            await asyncio.sleep(self.rng.uniform(0.0, 0.15))
            kind = self.rng.random()
            if kind < 0.08 or not self.conversations:
                await self.create()
                continue
            conversation = self.rng.choice(self.conversations)
            if kind < 0.5:
                await self.append(conversation, f"{self.name}-k{op}")
            elif kind < 0.65:
                await self.tool_call(conversation, f"{self.name}-att{op}")
            elif kind < 0.95:
                await self.read(conversation)
            else:
                await self.poison(conversation)

    async def create(self) -> None:
        conversation = f"{self.name}-c{len(self.conversations)}"
        outcome = await self.call(
            lambda n: n.create_conversation(TENANT, conversation, "m@1", {"by": self.name})
        )
        if isinstance(outcome, ConversationInfo):
            self.conversations.append(conversation)
        elif outcome is None:
            self.conversations.append(conversation)  # unknown: it may exist; appends will tell

    async def append(self, conversation: str, key: str) -> None:
        outcome = await self.call(
            lambda n: n.append_event(
                TENANT, conversation, "message.user", {"content": key}, idempotency_key=key
            )
        )
        self._record(conversation, outcome, key)

    async def tool_call(self, conversation: str, attempt_id: str) -> None:
        attempt = {"attempt_id": attempt_id, "tool": "pay", "argument_digest": "d1"}
        outcome = await self.call(
            lambda n: n.append_event(
                TENANT, conversation, "tool.attempt", attempt, idempotency_key=f"{attempt_id}-a"
            )
        )
        self._record(conversation, outcome, f"{attempt_id}-a")
        if not isinstance(outcome, AppendedEvent):
            return
        effects = [{"attempt_id": attempt_id, "status": s} for s in ("committed", "failed")]

        async def effect(payload: dict[str, str]) -> None:
            result = await self.call(
                lambda n: n.append_event(TENANT, conversation, "tool.effect", payload)
            )
            self._record(conversation, result, None)
            if isinstance(result, AppendedEvent):
                self.observed.effects_acked.add((conversation, attempt_id))

        await asyncio.gather(*(effect(p) for p in effects))

    async def read(self, conversation: str) -> None:
        acked = {
            seq: eid for (c, seq), eid in self.plane.history.acked.items() if c == conversation
        }
        effects = frozenset(a for c, a in self.observed.effects_acked if c == conversation)
        choice = self.rng.random()
        base = ReadSeen(conversation, "", acked, effects)
        if choice < 0.4:
            page = await self.call(lambda n: n.list_events(TENANT, conversation, 0, 10_000))
            if isinstance(page, list):
                events = tuple((e.seq, e.event_id) for e in page if isinstance(e, EventRecord))
                self.observed.reads.append(_with(base, kind="events", events=events))
        elif choice < 0.75:
            info = await self.call(lambda n: n.get_conversation(TENANT, conversation))
            if isinstance(info, ConversationInfo):
                self.observed.reads.append(_with(base, kind="last_seq", last_seq=info.last_seq))
        elif effects or self.rng.random() < 0.5:
            attempt_id = self.rng.choice(sorted(effects)) if effects else "none"
            status = await self.call(lambda n: n.tool_attempt(TENANT, conversation, attempt_id))
            if isinstance(status, ToolAttemptStatus):
                self.observed.reads.append(
                    _with(base, kind="attempt", attempt_id=attempt_id, attempt_state=status.state)
                )

    async def poison(self, conversation: str) -> None:
        payload = self.rng.choice(POISONS)
        outcome = await self.call(
            lambda n: n.append_event(TENANT, conversation, "tool.attempt", payload)
        )
        self.plane.counts["poison_inputs"] += 1
        if outcome is not None and not isinstance(outcome, InvalidRequest):
            self.observed.poison_answers.append(f"{type(outcome).__name__}: {outcome}")


def _with(base: ReadSeen, **changes: Any) -> ReadSeen:
    from dataclasses import replace

    return replace(base, **changes)
