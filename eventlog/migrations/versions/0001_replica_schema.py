"""Replica schema: shards, entries, and (PostgreSQL only) the one-round-trip write functions.

Revision ID: 0001
Revises:
Create Date: 2026-01-01

``convplane_append`` applies a whole group commit in one statement: the sub-batches arrive as
parallel arrays (one element per sub-batch, entries flattened), the function locks the shard rows
in shard order (so concurrent leaders writing overlapping shards cannot deadlock), then applies
each sub-batch in arrival order with exactly the steps of ``eventlog.stores._plan.plan_append``
and returns one ``(index, kind, value)`` row per sub-batch. Called in autocommit, the statement's
own commit is the only commit: one round trip per group. ``convplane_prepare`` does the same for a
prepare and returns the status row followed by the tail.

Reply kinds: 0 Accepted(match_lsn), 1 Rejected(promised_epoch), 2 Mismatch(last_lsn),
3 invariant violation (value = the committed lsn the request would truncate; nothing but the
promise is written).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

APPEND_FUNCTION = r"""
CREATE OR REPLACE FUNCTION convplane_append(
    b_shard integer[], b_epoch bigint[], b_prev_lsn bigint[], b_prev_epoch bigint[],
    b_leader_commit bigint[], b_count integer[],
    e_lsn bigint[], e_epoch bigint[], e_tenant text[], e_conversation text[], e_seq bigint[], e_type text[],
    e_idempotency text[], e_attempt text[], e_tokens bigint[], e_created bigint[], e_body text[]
) RETURNS TABLE(o_index integer, o_kind smallint, o_value bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    i integer;
    lo integer;
    next_lo integer := 1;
    n integer;
    s record;
    v_shard integer;
    v_epoch bigint;
    v_prev bigint;
    v_conflict bigint;
    v_first_new bigint;
    v_match bigint;
    v_last bigint;
    v_last_epoch bigint;
BEGIN
    INSERT INTO shards (shard, promised_epoch, commit_lsn, last_lsn, last_epoch)
    SELECT DISTINCT u.shard, 0, 0, 0, 0 FROM unnest(b_shard) AS u(shard) ORDER BY u.shard
    ON CONFLICT (shard) DO NOTHING;
    PERFORM 1 FROM shards WHERE shards.shard = ANY (b_shard) ORDER BY shards.shard FOR UPDATE;
    FOR i IN 1 .. coalesce(array_length(b_shard, 1), 0) LOOP
        o_index := i - 1;
        n := b_count[i];
        lo := next_lo;
        next_lo := next_lo + n;
        v_shard := b_shard[i];
        v_epoch := b_epoch[i];
        v_prev := b_prev_lsn[i];
        SELECT * INTO STRICT s FROM shards WHERE shards.shard = v_shard;
        IF v_epoch < s.promised_epoch THEN
            o_kind := 1; o_value := s.promised_epoch; RETURN NEXT;
            CONTINUE;
        END IF;
        IF v_epoch <> s.promised_epoch THEN
            UPDATE shards SET promised_epoch = v_epoch WHERE shards.shard = v_shard;
        END IF;
        -- the common case (appending at the tail) skips both lookups: the shard row already
        -- says that (prev_lsn, prev_epoch) is the last entry and nothing can overlap
        IF v_prev > 0 AND NOT (v_prev = s.last_lsn AND b_prev_epoch[i] = s.last_epoch)
           AND (v_prev > s.last_lsn OR NOT EXISTS (
                SELECT 1 FROM entries x
                WHERE x.shard = v_shard AND x.lsn = v_prev AND x.epoch = b_prev_epoch[i]))
        THEN
            o_kind := 2; o_value := s.last_lsn; RETURN NEXT;
            CONTINUE;
        END IF;
        v_conflict := NULL;
        IF n > 0 AND v_prev < s.last_lsn THEN
            SELECT min(x.lsn) INTO v_conflict
            FROM generate_series(lo, lo + n - 1) AS k
            JOIN entries x ON x.shard = v_shard AND x.lsn = e_lsn[k] AND x.epoch <> e_epoch[k];
        END IF;
        IF v_conflict IS NOT NULL AND v_conflict <= s.commit_lsn THEN
            o_kind := 3; o_value := v_conflict; RETURN NEXT;
            CONTINUE;
        END IF;
        IF v_conflict IS NOT NULL THEN
            DELETE FROM entries x WHERE x.shard = v_shard AND x.lsn >= v_conflict;
        END IF;
        v_first_new := coalesce(v_conflict, s.last_lsn + 1);
        INSERT INTO entries (shard, lsn, epoch, tenant_id, conversation_id, seq, event_type,
                             idempotency_key, attempt_id, token_count, created_at_ms, body)
        SELECT v_shard, e_lsn[k], e_epoch[k], e_tenant[k], e_conversation[k], e_seq[k], e_type[k],
               e_idempotency[k], e_attempt[k], e_tokens[k], e_created[k], e_body[k]
        FROM generate_series(lo, lo + n - 1) AS k
        WHERE e_lsn[k] >= v_first_new;
        v_match := v_prev + n;
        v_last := s.last_lsn;
        v_last_epoch := s.last_epoch;
        IF v_conflict IS NOT NULL OR v_match > v_last THEN
            v_last := v_match;
            v_last_epoch := e_epoch[lo + n - 1];
        END IF;
        UPDATE shards
        SET promised_epoch = v_epoch, last_lsn = v_last, last_epoch = v_last_epoch,
            commit_lsn = greatest(s.commit_lsn, least(b_leader_commit[i], v_match))
        WHERE shards.shard = v_shard;
        o_kind := 0; o_value := v_match; RETURN NEXT;
    END LOOP;
END
$fn$;
"""

PREPARE_FUNCTION = r"""
CREATE OR REPLACE FUNCTION convplane_prepare(p_shard integer, p_epoch bigint, p_tail_max integer)
RETURNS TABLE(
    o_ok boolean, o_promised bigint, o_commit bigint, o_last_lsn bigint, o_last_epoch bigint,
    lsn bigint, epoch bigint, tenant_id text, conversation_id text, seq bigint, event_type text,
    idempotency_key text, attempt_id text, token_count bigint, created_at_ms bigint, body text
)
LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    INSERT INTO shards AS t (shard, promised_epoch, commit_lsn, last_lsn, last_epoch)
    VALUES (p_shard, 0, 0, 0, 0) ON CONFLICT (shard) DO NOTHING;
    SELECT * INTO STRICT s FROM shards t WHERE t.shard = p_shard FOR UPDATE;
    IF p_epoch <= s.promised_epoch THEN
        RETURN QUERY SELECT false, s.promised_epoch, s.commit_lsn, s.last_lsn, s.last_epoch,
            NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::text,
            NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::text;
        RETURN;
    END IF;
    UPDATE shards t SET promised_epoch = p_epoch WHERE t.shard = p_shard;
    RETURN QUERY SELECT true, p_epoch, s.commit_lsn, s.last_lsn, s.last_epoch,
        NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::text,
        NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::text;
    RETURN QUERY SELECT true, p_epoch, s.commit_lsn, s.last_lsn, s.last_epoch,
        x.lsn, x.epoch, x.tenant_id, x.conversation_id, x.seq, x.event_type,
        x.idempotency_key, x.attempt_id, x.token_count, x.created_at_ms, x.body
    FROM entries x WHERE x.shard = p_shard AND x.lsn > s.commit_lsn
    ORDER BY x.lsn LIMIT greatest(p_tail_max, 0);
END
$fn$;
"""


def upgrade() -> None:
    op.create_table(
        "shards",
        sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("promised_epoch", sa.BigInteger, nullable=False),
        sa.Column("commit_lsn", sa.BigInteger, nullable=False),
        sa.Column("last_lsn", sa.BigInteger, nullable=False),
        sa.Column("last_epoch", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "entries",
        sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("lsn", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("conversation_id", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("attempt_id", sa.Text),
        sa.Column("token_count", sa.BigInteger, nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_index("ix_entries_conversation", "entries", ["shard", "conversation_id", "seq"])
    op.create_index("ix_entries_created", "entries", ["shard", "created_at_ms"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND_FUNCTION)
        op.execute(PREPARE_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS convplane_prepare(integer, bigint, integer)")
        op.execute(
            "DROP FUNCTION IF EXISTS convplane_append(integer[], bigint[], bigint[], bigint[], "
            "bigint[], integer[], bigint[], bigint[], text[], text[], bigint[], text[], text[], text[], "
            "bigint[], bigint[], text[])"
        )
    op.drop_table("entries")
    op.drop_table("shards")
