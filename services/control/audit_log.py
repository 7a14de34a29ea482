"""The audit log's two guards: operator entries (``POST /v1/audit``) are rate limited per
operator key, and every page of ``GET /v1/audit`` is complete however many entries came after.

A node keeps only the newest ``AUDIT_KEPT_MAX`` entries in memory (``OpsState``); before,
10,000 posted entries pushed every earlier action (a halt, a drill) out of every readable page,
although the records stayed in the control shard. A page older than the memory window is now
read from the control shard itself: its records are folded afresh from the start (the same
``ControlState`` and ``OpsState`` folds every node runs, so an entry counts exactly when its
record took effect), keeping only the entries past the page's cursor.

Posted entries are limited where they are committed, at the control shard's leader (other
nodes forward there): ``AUDIT_POSTS_PER_S`` per operator key with bursts of
``AUDIT_POSTS_BURST``, 429 ``quota_exceeded`` (with ``Retry-After``) past it. ``convplane_audit_posts_total``
counts them by outcome; the ``ConvplaneAuditBurst`` alert fires on a burst.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from eventlog.clock import Clock
from eventlog.errors import QuotaExceeded
from regions.control import ControlState
from regions.ops_state import AuditEntry, OpsState
from replay.capacity import TokenBucket
from services.control.controller import CONTROL_READ_MAX, Controller

#: a posted entry's fields, at most (its reason: ``regions.drills.REASON_CHARS_MAX``)
AUDIT_ACTION_CHARS_MAX = 100
AUDIT_TARGET_CHARS_MAX = 200
#: entries one operator key may post per second, sustained, and at once
AUDIT_POSTS_PER_S = 0.5
AUDIT_POSTS_BURST = 20
#: operator keys whose bucket is remembered (past it the oldest is forgotten: a full bucket)
AUDIT_POSTERS_TRACKED_MAX = 1_024


class AuditPostLimiter:
    """A token bucket per operator key, for entries posted through ``POST /v1/audit``."""

    def __init__(self, clock: Clock, registry: CollectorRegistry) -> None:
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self.posts = Counter(
            "convplane_audit_posts",
            "Operator audit entries posted (POST /v1/audit) at this node while it led the "
            "control shard, by outcome (recorded, rate_limited)",
            ["outcome"],
            registry=registry,
        )

    def admit(self, poster: str) -> None:
        """Take one entry from ``poster``'s bucket; QuotaExceeded (429) when it is empty."""
        now_s = self._clock.monotonic()
        bucket = self._buckets.pop(poster, None)
        if bucket is None:
            if len(self._buckets) >= AUDIT_POSTERS_TRACKED_MAX:
                del self._buckets[next(iter(self._buckets))]
            bucket = TokenBucket(AUDIT_POSTS_PER_S, AUDIT_POSTS_BURST, now_s, AUDIT_POSTS_BURST)
        self._buckets[poster] = bucket  # the most recent poster last
        bucket.refill(now_s)
        if not bucket.can_take(1):
            self.posts.labels("rate_limited").inc()
            raise QuotaExceeded(
                f"{poster} posted over {AUDIT_POSTS_PER_S}/s audit entries (bursts of "
                f"{AUDIT_POSTS_BURST})",
                retry_after_s=bucket.seconds_until(1),
            )
        bucket.take(1)
        self.posts.labels("recorded").inc()


async def audit_page(
    controller: Controller, ops: OpsState, after: int, limit: int
) -> list[AuditEntry]:
    """Up to ``limit`` entries past the cursor ``after``, oldest first. Call on the control
    shard's leader after its read barrier (``DrillDriver.read_barrier``)."""
    page = ops.audit_page(after, limit)
    if page is not None:
        return page
    control = ControlState(
        shard_count=controller.state.shard_count, regions=controller.state.weights
    )
    folded = OpsState(audit_kept_max=limit, audit_after=after)
    lsn = 0
    while len(folded.audit) < limit:
        entries = await controller.node.read_committed(
            controller.control_shard, lsn, CONTROL_READ_MAX
        )
        if not entries:
            break
        for entry in entries:
            folded.apply_entry(entry, control.apply(entry.lsn, entry.event_type, entry.body))
            if len(folded.audit) >= limit:
                break
        lsn = entries[-1].lsn
    return list(folded.audit)
