"""Replica migrations are forward-only and each states its window
(``eventlog.stores.schema_window``): one linear chain numbered in order, one file each, every
revision with the oldest peer protocol it serves, never narrowing, and never narrower than the
window the same version's nodes serve (``services.peer_protocol``). That released migrations
are never edited is checked against the pinned earlier release in
``tests/e2e/test_rolling_upgrade.py``."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from eventlog.stores.migrate import MIGRATIONS_DIR, alembic_config
from eventlog.stores.schema_window import OLDEST_PEER_PROTOCOL_SERVED
from services.peer_protocol import PEER_PROTOCOL, PEER_PROTOCOL_OLDEST


def _chain() -> list[str]:
    """The revisions from the first to the head, following each one's down_revision."""
    script = ScriptDirectory.from_config(alembic_config())
    assert len(script.get_heads()) == 1, script.get_heads()  # no branch
    chain = []
    for revision in script.walk_revisions():  # head first
        assert revision.down_revision is None or isinstance(revision.down_revision, str)
        chain.append(revision.revision)
    return chain[::-1]


def test_migrations_are_one_chain_numbered_in_order_one_file_each() -> None:
    chain = _chain()
    assert chain == [f"{n:04d}" for n in range(1, len(chain) + 1)]
    files = sorted(p.name for p in (MIGRATIONS_DIR / "versions").glob("*.py"))
    assert [name[:4] for name in files] == chain


def test_every_migration_states_the_oldest_protocol_it_serves_and_the_window_never_narrows() -> (
    None
):
    chain = _chain()
    assert list(OLDEST_PEER_PROTOCOL_SERVED) == chain
    oldest = list(OLDEST_PEER_PROTOCOL_SERVED.values())
    assert oldest == sorted(oldest) and all(1 <= p <= PEER_PROTOCOL for p in oldest)
    # every node this version still serves as a peer works on the newest schema
    assert oldest[-1] <= PEER_PROTOCOL_OLDEST
