"""Alembic environment of the replica stores (run it with ``eventlog.stores.migrate``)."""
