"""Transcripts for in-process replay workers: read straight from this node's log (the shard's
leader is here: replay runs in the region that leads the conversation), no HTTP hop."""

from __future__ import annotations

from eventlog.conversations import ConversationLog
from eventlog.errors import InvalidRequest
from replay.worker import TranscriptEvent, TranscriptSource


class LogTranscriptSource(TranscriptSource):
    def __init__(
        self, log: ConversationLog, *, page_limit: int = 500, events_max: int = 20_000
    ) -> None:
        self._log = log
        self._page_limit = page_limit
        self._events_max = events_max

    async def fetch(
        self, tenant_id: str, conversation_id: str, through_seq: int
    ) -> list[TranscriptEvent]:
        events: list[TranscriptEvent] = []
        after_seq = 0
        while after_seq < through_seq:
            if len(events) >= self._events_max:
                raise InvalidRequest(f"transcript over {self._events_max} events")
            page = await self._log.list_events(
                tenant_id, conversation_id, after_seq, self._page_limit
            )
            events.extend(
                TranscriptEvent(r.seq, r.event_type, r.payload)
                for r in page
                if r.seq <= through_seq
            )
            if len(page) < self._page_limit:
                break
            after_seq = page[-1].seq
        return events
