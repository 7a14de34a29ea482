"""Transcripts for in-process replay workers: read straight from this node's log (the shard's
leader is here: replay runs in the region that leads the conversation), no HTTP hop."""

from __future__ import annotations

from eventlog.conversations import ConversationLog
from replay.transcripts import PagedTranscriptSource, TranscriptEvent


class LogTranscriptSource(PagedTranscriptSource):
    def __init__(
        self, log: ConversationLog, *, page_limit: int = 500, events_max: int = 20_000
    ) -> None:
        super().__init__(page_limit=page_limit, events_max=events_max)
        self._log = log

    async def page(
        self, tenant_id: str, conversation_id: str, after_seq: int, read_grant: str
    ) -> list[TranscriptEvent]:
        del read_grant  # the node reads its own log: nothing to show
        records = await self._log.list_events(
            tenant_id, conversation_id, after_seq, self._page_limit
        )
        return [TranscriptEvent(r.seq, r.event_type, r.payload) for r in records]
