"""PostgreSQL finds "conversations active since T" from the recent part of a shard, not all of it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``list_conversations`` (the replay scheduler's "conversations active within the replay window")
used to aggregate every entry of the shard and keep the conversations whose latest activity was
at least T: a scan of the whole shard, growing with the log's age, run for every shard a
failover moves, on the survivors, when their capacity is scarcest. It now asks first which
conversations have *any* entry at or after T (the same set: a conversation's latest activity is
at least T exactly when one of its entries is) and then sums only those conversations' entries
through ``ix_entries_conversation``.

The first step reads entries by ``created_at_ms``. Entries arrive in time order, so their pages
are too, and a BRIN index (block range: the smallest and largest ``created_at_ms`` per 128 heap
pages; about 32 kB for a 411 MB table) narrows it to the pages written since T. A BRIN insert
costs nearly nothing: a new entry lands in the newest, still unsummarised range and the index is
not touched; ``autosummarize`` has autovacuum summarise a range once the table has moved past it.
(0005 dropped a B-tree on ``(shard, created_at_ms)`` that cost every replica an index insert per
entry and that the old query could not use.)

Measured (``EXPLAIN ANALYZE``, 1,000,000 entries in 64 shards, 15,625 in the shard, the last
20,000 entries inside the window): 74 ms and 15,625 heap pages read before, 4.7 ms and 349 after.

``python -m bench.replay_query`` measures both sides in one run: through the store, 8.7 ms
against 66 ms for the query before (7.6 x), and an insert's server CPU 16.45 us per row with no
extra index, 17.2 us with the BRIN, 18.75 us with the old B-tree.

Built inside the migration's transaction, the index holds appends to this replica for as long as
one pass over the table takes (the other replicas keep the quorum meanwhile), and the migration's
statement timeout (60 s) bounds it. On a large log, build it first without blocking writes; the
migration then finds it and does nothing (one that build left INVALID, having failed, it drops
and builds again)::

    CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_entries_created_brin
        ON entries USING brin (created_at_ms) WITH (autosummarize = on);

SQLite (the embedded demo) has no BRIN; its query is the same, and scans the shard.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

INDEX = "ix_entries_created_brin"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        valid = bind.execute(
            text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
            {"name": INDEX},
        ).scalar()
        if valid is False:  # a CONCURRENTLY build that failed left it behind, never used
            op.execute(f"DROP INDEX {INDEX}")
        op.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON entries USING brin (created_at_ms) "
            "WITH (autosummarize = on)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP INDEX IF EXISTS {INDEX}")
