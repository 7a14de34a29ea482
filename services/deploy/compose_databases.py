"""The compose stack's databases, made ready before any node starts (service ``db-init``).

``python -m services.deploy.compose_databases --secrets DIR`` reads ``DIR/databases.json`` (each
region's owner DSN and every node role's password, ``services.deploy.compose_bundles``) and, as the
owner of each region's database over TLS (``DIR/tls/ca.pem`` verifies the server): migrates
it to the newest schema, then restricts every node's role to the protocol
(``services.deploy.db_roles.restrict_to_protocol``). Idempotent: it runs at every ``docker compose
up``, and a restart re-keys the roles from the same passwords.

So no node ever connects as the owner: each holds only its own role's password.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from eventlog.stores import migrate
from services.deploy.db_roles import asyncpg_dsn, restrict_to_protocol

#: one region's migration and role set-up, at most
DATABASE_SETUP_TIMEOUT_S = 120.0


async def prepare_databases(secrets_dir: Path) -> list[str]:
    """Migrate and restrict every region's database (module docstring); return the regions."""
    databases = json.loads((secrets_dir / "databases.json").read_text(encoding="utf-8"))
    roles: dict[str, str] = databases["node_role_passwords"]
    owner_dsns: dict[str, str] = databases["owner_dsns"]
    ca_file = secrets_dir / "tls" / "ca.pem"
    # asyncpg reads the CA of ssl=verify-full from here, for SQLAlchemy's engine too
    os.environ["PGSSLROOTCERT"] = str(ca_file)
    for dsn in owner_dsns.values():
        async with asyncio.timeout(DATABASE_SETUP_TIMEOUT_S):
            await migrate(dsn)
            await restrict_to_protocol(asyncpg_dsn(dsn, ca_file=ca_file), roles)
    return sorted(owner_dsns)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secrets", type=Path, required=True)
    args = parser.parse_args(argv)
    regions = asyncio.run(prepare_databases(args.secrets))
    print(f"databases migrated, node roles restricted: {', '.join(regions)}")


if __name__ == "__main__":
    main()
