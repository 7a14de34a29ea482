"""Fakes of the replay worker's ports, shared by the worker's tests: an engine that records its
prefills (scripted failures, a hold), a spare gate that can be closed, a transcript source with
one three-message conversation per id (``missing``: NotFound)."""

from __future__ import annotations

import asyncio

from eventlog.errors import NotFound
from replay.engines.base import InferenceEngine
from replay.model import EngineMetrics, PrefillOutcome, PrefillRequest
from replay.transcripts import TranscriptEvent, TranscriptSource


class FakeEngine(InferenceEngine):
    def __init__(self, engine_id: str = "e1", revision: str = "rev-a") -> None:
        self._id = engine_id
        self._revision = revision
        self.requests: list[PrefillRequest] = []
        self.failures: list[Exception] = []  # raised by the next calls, in order
        self.hold: asyncio.Event | None = None  # when set, prefill waits for it
        self.entered = asyncio.Event()

    @property
    def engine_id(self) -> str:
        return self._id

    @property
    def model_revision(self) -> str:
        return self._revision

    async def prefill(self, request: PrefillRequest) -> PrefillOutcome:
        self.requests.append(request)
        self.entered.set()
        if self.failures:
            raise self.failures.pop(0)
        if self.hold is not None:
            await self.hold.wait()
        tokens = sum(len(str(m.get("content"))) for m in request.prompt.messages)
        return PrefillOutcome(prompt_tokens=tokens, cached_prompt_tokens=0, duration_ms=1.0)

    async def metrics(self) -> EngineMetrics:
        return EngineMetrics(0, 0, 0, 0, 0, 0)

    async def aclose(self) -> None:
        return None


class FakeGate:
    def __init__(self, spare: bool = True, asked_signal_at: int = 20) -> None:
        self.open = asyncio.Event()
        if spare:
            self.open.set()
        self.asked: list[int] = []
        self.granted = 0
        self.released: list[int | None] = []
        self.priority_verified: bool | None = None  # None: the worker has not said
        self.asked_often = asyncio.Event()  # set once the worker asked asked_signal_at times
        self._asked_signal_at = asked_signal_at

    def has_spare(self, prompt_tokens: int) -> bool:
        self.asked.append(prompt_tokens)
        if len(self.asked) >= self._asked_signal_at:
            self.asked_often.set()
        return self.open.is_set()

    async def wait_for_spare(self, prompt_tokens: int, tenant_id: str, deadline_s: float) -> None:
        self.granted += 1
        await self.open.wait()

    def release(self, computed_tokens: int | None) -> None:
        self.released.append(computed_tokens)

    def set_priority_verified(self, verified: bool) -> None:
        self.priority_verified = verified


class FakeTranscripts(TranscriptSource):
    def __init__(self) -> None:
        self.calls = 0

    async def fetch(
        self, tenant_id: str, conversation_id: str, through_seq: int, read_grant: str = ""
    ) -> list[TranscriptEvent]:
        self.calls += 1
        if conversation_id == "missing":
            raise NotFound("no such conversation")
        events = [
            TranscriptEvent(1, "message.system", {"content": "be brief"}),
            TranscriptEvent(2, "message.user", {"content": f"hello from {conversation_id}"}),
            TranscriptEvent(3, "message.assistant", {"content": "hi"}),
        ]
        return [e for e in events if e.seq <= through_seq]
