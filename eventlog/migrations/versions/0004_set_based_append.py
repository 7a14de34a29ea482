"""``convplane_append`` applies the common case of a group as a whole, not a sub-batch at a time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

Under REST load a node's group to a replica holds many sub-batches of about one entry (one per
shard: each shard has one append in flight per replica), and migration 0001's function paid four
statements per sub-batch (about 87 us of server CPU each, ``bench/pg_groups.py``). Here every
sub-batch that appends at its shard's tail (its epoch at least the promise, its
``(prev_lsn, prev_epoch)`` the shard's last entry) is applied by two statements for the whole
group: one ``UPDATE shards ... FROM unnest(...)`` and one ``INSERT INTO entries ... SELECT``. What
that leaves (a rejected epoch, a mismatch, a re-sent or conflicting suffix) runs through 0001's
loop unchanged, sub-batch by sub-batch. The fast path only takes groups in which no shard appears
twice (then the sub-batches touch disjoint rows and their order does not matter); a group with a
repeated shard runs wholly through the loop, in arrival order.

Same signature, same reply rows (``o_index``, ``o_kind``, ``o_value``; kinds as in 0001), same
locking (missing shard rows created before any lock is taken, then every shard row of the group
locked in shard order, so concurrent leaders cannot deadlock).
``tests/integration/test_pg_append_function.py`` holds it to 0001's loop on random groups, and
``bench/pg_groups.py`` measures both in one run.

The function plans its statements once per session (``plan_cache_mode =
force_generic_plan``): left to choose, PostgreSQL re-planned the array-driven statements on every
call, which cost a one-entry group more than the loop. Its ``SECURITY DEFINER`` and
``search_path``, where ``services.db_roles`` set them, are kept: ``CREATE OR REPLACE`` resets a
function's attributes, so they are re-applied.
"""

from __future__ import annotations

from alembic import op

from eventlog.stores.migrate import migration_module

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

APPEND_SIGNATURE = (
    "convplane_append(integer[], bigint[], bigint[], bigint[], bigint[], integer[], bigint[], "
    "bigint[], text[], text[], bigint[], text[], text[], text[], bigint[], bigint[], text[])"
)

APPEND_FUNCTION = r"""
CREATE OR REPLACE FUNCTION convplane_append(
    b_shard integer[], b_epoch bigint[], b_prev_lsn bigint[], b_prev_epoch bigint[],
    b_leader_commit bigint[], b_count integer[],
    e_lsn bigint[], e_epoch bigint[], e_tenant text[], e_conversation text[], e_seq bigint[], e_type text[],
    e_idempotency text[], e_attempt text[], e_tokens bigint[], e_created bigint[], e_body text[]
) RETURNS TABLE(o_index integer, o_kind smallint, o_value bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    batches integer := coalesce(array_length(b_shard, 1), 0);
    at_tail integer[] := '{}';
    locked integer;
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
    -- rows for shards this replica has never seen are created before any row is locked (as
    -- 0001 does: inserting while holding locks could close a cycle with another group), but
    -- only when some row is missing (a look without locks; shard rows are never deleted)
    IF (SELECT count(*) FROM shards WHERE shards.shard = ANY (b_shard))
       < (SELECT count(DISTINCT u) FROM unnest(b_shard) AS u) THEN
        INSERT INTO shards (shard, promised_epoch, commit_lsn, last_lsn, last_epoch)
        SELECT DISTINCT u.shard, 0, 0, 0, 0 FROM unnest(b_shard) AS u(shard) ORDER BY u.shard
        ON CONFLICT (shard) DO NOTHING;
    END IF;
    -- every shard row of the group locked in shard order (so concurrent leaders cannot
    -- deadlock)
    PERFORM 1 FROM shards WHERE shards.shard = ANY (b_shard) ORDER BY shards.shard FOR UPDATE;
    GET DIAGNOSTICS locked = ROW_COUNT;

    -- The whole group at once: every sub-batch appending at its shard's tail (only when no
    -- shard repeats: one row locked per sub-batch).
    IF locked = batches THEN
        WITH b AS (
            SELECT u.i::integer AS i, u.shard, u.epoch, u.prev_lsn, u.prev_epoch,
                   u.leader_commit, u.n, (sum(u.n) OVER (ORDER BY u.i) - u.n + 1)::integer AS lo
            FROM unnest(b_shard, b_epoch, b_prev_lsn, b_prev_epoch, b_leader_commit, b_count)
                 WITH ORDINALITY AS u(shard, epoch, prev_lsn, prev_epoch, leader_commit, n, i)
        ), tail AS (
            UPDATE shards t
            SET promised_epoch = b.epoch,
                last_lsn = b.prev_lsn + b.n,
                last_epoch = CASE WHEN b.n > 0 THEN e_epoch[b.lo + b.n - 1] ELSE t.last_epoch END,
                commit_lsn = greatest(t.commit_lsn, least(b.leader_commit, b.prev_lsn + b.n))
            FROM b
            WHERE t.shard = b.shard AND b.epoch >= t.promised_epoch AND b.prev_lsn = t.last_lsn
              AND (b.prev_lsn = 0 OR b.prev_epoch = t.last_epoch)
            RETURNING b.i, b.shard, b.lo, b.n, b.prev_lsn
        ), inserted AS (
            INSERT INTO entries (shard, lsn, epoch, tenant_id, conversation_id, seq, event_type,
                                 idempotency_key, attempt_id, token_count, created_at_ms, body)
            SELECT tail.shard, e_lsn[k], e_epoch[k], e_tenant[k], e_conversation[k], e_seq[k],
                   e_type[k], e_idempotency[k], e_attempt[k], e_tokens[k], e_created[k], e_body[k]
            FROM tail, generate_series(tail.lo, tail.lo + tail.n - 1) AS k
        )
        SELECT coalesce(array_agg(tail.i), '{}') INTO at_tail FROM tail;
        RETURN QUERY
            SELECT u.i::integer - 1, 0::smallint, b_prev_lsn[u.i] + b_count[u.i]
            FROM unnest(at_tail) AS u(i);
        IF array_length(at_tail, 1) = batches THEN
            RETURN;
        END IF;
    END IF;

    -- The rest, a sub-batch at a time, as migration 0001 did.
    FOR i IN 1 .. batches LOOP
        n := b_count[i];
        lo := next_lo;
        next_lo := next_lo + n;
        IF i = ANY (at_tail) THEN
            CONTINUE;
        END IF;
        o_index := i - 1;
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


def _security_definer() -> bool:
    """Whether ``services.db_roles`` made the function ``SECURITY DEFINER`` (its settings go
    with a replaced body and must be put back)."""
    bind = op.get_bind()
    found = bind.exec_driver_sql(
        "SELECT p.prosecdef FROM pg_proc p WHERE p.oid = 'convplane_append'::regproc"
    ).scalar()
    return bool(found)


def _replace(function_sql: str) -> None:
    definer = _security_definer()
    op.execute(function_sql)
    if definer:
        op.execute(
            f"ALTER FUNCTION {APPEND_SIGNATURE} SECURITY DEFINER SET search_path = public, pg_temp"
        )


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _replace(APPEND_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _replace(migration_module("0001").APPEND_FUNCTION)
