"""Tables of a replica store (SQLAlchemy Core), shared by the queries of both dialects.

The migrations in ``eventlog/migrations/versions`` create these tables; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, Table, Text

from eventlog.model import LogEntry, ShardStatus

metadata = MetaData()

shards = Table(
    "shards",
    metadata,
    Column("shard", Integer, primary_key=True, autoincrement=False),
    Column("promised_epoch", BigInteger, nullable=False),
    Column("commit_lsn", BigInteger, nullable=False),
    Column("last_lsn", BigInteger, nullable=False),
    Column("last_epoch", BigInteger, nullable=False),
)

entries = Table(
    "entries",
    metadata,
    Column("shard", Integer, primary_key=True, autoincrement=False),
    Column("lsn", BigInteger, primary_key=True, autoincrement=False),
    Column("epoch", BigInteger, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("conversation_id", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("idempotency_key", Text),
    Column("attempt_id", Text),
    Column("token_count", BigInteger, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("body", Text, nullable=False),
    # the only B-tree besides the key: each one costs every replica an insert per entry
    # (migration 0005 dropped one no query could use). On PostgreSQL, migration 0006 adds a
    # BRIN index on created_at_ms (list_conversations' recent pages; an insert rarely touches
    # it), which SQLite has no kind of and so is not declared here
    Index("ix_entries_conversation", "shard", "tenant_id", "conversation_id", "seq"),
)

replica_identity = Table(
    "replica_identity",
    metadata,
    Column("singleton", Integer, primary_key=True, autoincrement=False),
    Column("store_id", Text, nullable=False),
)

replica_registry = Table(
    "replica_registry",
    metadata,
    Column("region", Text, primary_key=True),
    Column("store_id", Text, nullable=False),
    Column("generation", BigInteger, nullable=False),
)

#: per shard and region, the highest ``HeldPosition`` an append left here (migration 0007)
replica_positions = Table(
    "replica_positions",
    metadata,
    Column("shard", Integer, primary_key=True, autoincrement=False),
    Column("region", Text, primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("lsn", BigInteger, nullable=False),
)

#: entry columns in LogEntry field order (without the shard)
ENTRY_COLUMNS = (
    "lsn",
    "epoch",
    "tenant_id",
    "conversation_id",
    "seq",
    "event_type",
    "idempotency_key",
    "attempt_id",
    "token_count",
    "created_at_ms",
    "body",
)

EMPTY_STATUS = ShardStatus(promised_epoch=0, last_lsn=0, last_epoch=0, commit_lsn=0)


def entry_from_row(row: Mapping[Any, Any]) -> LogEntry:
    return LogEntry(**{name: row[name] for name in ENTRY_COLUMNS})


def entry_to_row(shard: int, entry: LogEntry) -> dict[str, Any]:
    row: dict[str, Any] = {name: getattr(entry, name) for name in ENTRY_COLUMNS}
    row["shard"] = shard
    return row


def status_from_row(row: Mapping[Any, Any] | None) -> ShardStatus:
    if row is None:
        return EMPTY_STATUS
    return ShardStatus(
        promised_epoch=row["promised_epoch"],
        last_lsn=row["last_lsn"],
        last_epoch=row["last_epoch"],
        commit_lsn=row["commit_lsn"],
    )
