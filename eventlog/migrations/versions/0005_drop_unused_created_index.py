"""``entries`` keeps only the indexes a query uses: ``ix_entries_created`` is dropped.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

Every index costs each replica one more index insert per entry, on every region's database, for
every append. ``ix_entries_created`` (``shard, created_at_ms``) was made in 0001 for the replay
scheduler's "conversations active since T" (``list_conversations``), but that query filters on
the conversation's *latest* activity (``HAVING max(created_at_ms) >= T``), which an index on
entries cannot serve: PostgreSQL used the index only for its ``shard`` prefix, the same shard scan
the primary key ``(shard, lsn)`` gives (``EXPLAIN ANALYZE`` on 640,000 entries: 46 ms with the
index, 45 ms without, both reading the shard's 10,000 entries). No other statement reads
``created_at_ms``.

Measured without it, on one server (``python -m bench.pg_groups --seconds 2``, alternating with
and without): the set-based group's server CPU fell 5-23 % by shape (10 sub-batches of one entry:
766 and 691 us against 823; 40 of one: 1,311 and 1,324 against 1,676; 20 of five: 1,821 and
1,879 against 1,979). Through REST (``bench/rest.py --no-peer``, alternating, four pairs) the
first two pairs showed +11-14 % route-following and +31 % any-region events/s; the next two sat
inside the machine's drift.

No row changes. The downgrade builds the index again.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_entries_created", table_name="entries")


def downgrade() -> None:
    op.create_index("ix_entries_created", "entries", ["shard", "created_at_ms"])
