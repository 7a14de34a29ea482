"""Where a replay worker reads a conversation's transcript from: the port (``TranscriptSource``),
a paged base for sources that read a page at a time, and the error a source raises when it
cannot answer now. Adapters: ``replay.transcripts_http`` (the region's REST API, for workers in
their own processes) and ``services.replay.transcripts`` (the node's log, for embedded workers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventlog.errors import InvalidRequest, Unavailable


@dataclass(frozen=True, slots=True)
class TranscriptEvent:
    seq: int
    event_type: str
    payload: Mapping[str, Any]


class TranscriptSource(ABC):
    @abstractmethod
    async def fetch(
        self, tenant_id: str, conversation_id: str, through_seq: int, read_grant: str = ""
    ) -> list[TranscriptEvent]:
        """The conversation's committed events with ``seq <= through_seq``, in seq order.
        ``read_grant``: the job's (``replay.read_grant``), for a source that must show it."""


class PagedTranscriptSource(TranscriptSource):
    """A source that reads the transcript a page at a time (``page``: events after a seq, at
    most ``page_limit``), up to ``through_seq`` and never more than ``events_max`` events."""

    def __init__(self, *, page_limit: int, events_max: int) -> None:
        self._page_limit = page_limit
        self._events_max = events_max

    @abstractmethod
    async def page(
        self, tenant_id: str, conversation_id: str, after_seq: int, read_grant: str
    ) -> list[TranscriptEvent]: ...

    async def fetch(
        self, tenant_id: str, conversation_id: str, through_seq: int, read_grant: str = ""
    ) -> list[TranscriptEvent]:
        events: list[TranscriptEvent] = []
        after_seq = 0
        while after_seq < through_seq:
            if len(events) >= self._events_max:
                raise InvalidRequest(f"transcript over {self._events_max} events")
            page = await self.page(tenant_id, conversation_id, after_seq, read_grant)
            events.extend(e for e in page if e.seq <= through_seq)
            if len(page) < self._page_limit:
                break
            after_seq = page[-1].seq
        return events


class TranscriptUnavailable(Unavailable):
    code = "transcript_unavailable"
