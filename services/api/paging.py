"""Pages of events bounded in bytes, not only in count.

A page of ``limit`` events (at most ``schemas.EVENTS_PAGE_MAX``) of bodies up to
``max_body_bytes`` each could reach hundreds of MiB: one tenant's huge conversation would push
the node's memory, and the client's, that far per request. ``within_bytes`` keeps the longest
prefix of a page whose serialized events fit ``events_page_bytes_max``; the page's
``next_after_seq`` then points at its last event, so a client reads on exactly as before.

This bounds what the API holds and sends. What the log loads for one read is the log's own
bound (``eventlog``), which should take the same byte budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from eventlog.conversations import EventRecord

#: what an event adds around its payload once serialized (ids, seq, type, timestamps)
EVENT_OVERHEAD_BYTES = 256


def event_bytes(record: EventRecord) -> int:
    payload = json.dumps(record.payload, separators=(",", ":"), ensure_ascii=False)
    return len(payload.encode("utf-8")) + len(record.event_type) + EVENT_OVERHEAD_BYTES


def within_bytes(records: Sequence[EventRecord], bytes_max: int) -> list[EventRecord]:
    """The longest prefix of ``records`` within ``bytes_max``; never empty when ``records`` is
    not (a single event, bounded by the body limit, always makes progress)."""
    kept: list[EventRecord] = []
    total = 0
    for record in records:
        total += event_bytes(record)
        if kept and total > bytes_max:
            break
        kept.append(record)
    return kept
