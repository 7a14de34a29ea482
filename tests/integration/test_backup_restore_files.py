"""``convplane backup`` and ``convplane restore`` on a plane that is only its files
(``plane-state.json``, ``cluster.json``, the cluster file, SQLite replicas with the schema; no
node runs).

They refuse what they must not do, with the one error line and exit 1, and change nothing: an
unknown region, a missing or incomplete backup, a running region, a backup of another plane or
of another region, of another backend (a SQLite backup into a PostgreSQL plane and the other
way round) or of another PostgreSQL major version, a backup target that holds files. And a restore judges
the backup by the positions the other stores keep for the region: behind one of them, the
region is quarantined in their registries before the copy goes in; behind none, it is simply
restored."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from typer.testing import CliRunner

from eventlog.stores import migrate
from eventlog.stores.migrate import alembic_config
from services.cli.main import build_app
from services.config import ClusterConfig, RegionConfig, write_cluster
from services.local.backup import MANIFEST_NAME
from services.local.backup_region import plane_id
from services.local.plane_state import PlaneState, SavedDatabase, SavedRegion, state_json

REGIONS = ("us-east", "eu-west", "ap-south")
#: a pid no process has (above the kernel's pid_max)
NO_PROCESS = 2**22 + 1


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A replica with the newest schema, copied for each region (migrating is slow)."""
    replica = tmp_path_factory.mktemp("schema") / "replica.sqlite3"
    asyncio.run(migrate(f"sqlite+aiosqlite:///{replica}"))
    return replica


def _plane(
    state_dir: Path, schema: Path, *, postgres: bool = False, running: str | None = None
) -> PlaneState:
    database = SavedDatabase("db", 5432, "pw", tls=False) if postgres else None
    if postgres:  # what the checks read of a region's cluster, its major version
        (state_dir / "postgres" / "db").mkdir(parents=True)
        (state_dir / "postgres" / "db" / "PG_VERSION").write_text("16\n")
    saved = PlaneState(
        postgres=postgres, tls=False, shard_count=4, host="127.0.0.1", api_key="cp_first",
        limited_api_key="cp_l", operator_api_key="cp_o", viewer_api_key="cp_v",
        regions=tuple(SavedRegion(n, 9000 + i, 9100 + i, "pw", database)
                      for i, n in enumerate(REGIONS)),
    )  # fmt: skip
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "plane-state.json").write_text(json.dumps(state_json(saved)))
    regions = []
    for name in REGIONS:
        (state_dir / name).mkdir()
        shutil.copyfile(schema, state_dir / name / "replica.sqlite3")
        pid = os.getpid() if name == running else NO_PROCESS
        regions.append({"name": name, "url": "http://127.0.0.1:1", "node_pid": pid})
    (state_dir / "cluster.json").write_text(json.dumps({"regions": regions}))
    cluster = ClusterConfig(
        regions=[RegionConfig(name=n, url="http://127.0.0.1:1",
                              dsn=f"sqlite+aiosqlite:///{state_dir / n / 'replica.sqlite3'}")
                 for n in REGIONS],
        shard_count=saved.shard_count,
    )  # fmt: skip
    write_cluster(state_dir / "cluster-config.json", cluster)
    return saved


def _backup(
    path: Path, saved: PlaneState, region: str, *, plane: str | None = None,
    backend: str = "sqlite", pg_version: str = "16",
) -> Path:  # fmt: skip
    path.mkdir(parents=True)
    if backend == "sqlite":
        (path / "replica.sqlite3").write_bytes(b"")
    else:
        (path / "pgdata").mkdir()
        (path / "pgdata" / "PG_VERSION").write_text(pg_version + "\n")
    manifest = {"format": 1, "plane_id": plane or plane_id(saved), "region": region,
                "store_id": "s", "schema_revision": "0007", "created_at": "2026-12-06T00:00:00",
                "convplane_version": "0", "backend": backend}  # fmt: skip
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))
    return path


def _snapshot(*directories: Path) -> dict[str, str]:
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for directory in directories
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _refused(args: list[str], says: str, *unchanged: Path) -> None:
    before = _snapshot(*unchanged)
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 1, result.output
    assert says in " ".join(result.output.split()), result.output
    assert _snapshot(*unchanged) == before


@pytest.fixture
def plane_dir(tmp_path: Path) -> Path:
    return tmp_path / "plane"


def test_restore_refuses_bad_input_and_changes_nothing(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    saved = _plane(plane_dir, schema)
    good = _backup(tmp_path / "good", saved, "eu-west")
    other_plane = _backup(tmp_path / "other-plane", saved, "eu-west", plane="0123456789ab")
    other_region = _backup(tmp_path / "other-region", saved, "ap-south")
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    (incomplete / "replica.sqlite3").write_bytes(b"")
    state = ["--state-dir", str(plane_dir)]
    cases = [
        (["restore", "mars", "--from", str(good)], "no region 'mars'"),
        (["restore", "eu-west", "--from", str(tmp_path / "nowhere")], "no backup at"),
        (["restore", "eu-west", "--from", str(incomplete)], "did not finish"),
        (["restore", "eu-west", "--from", str(other_plane)], "a backup of another plane"),
        (["restore", "eu-west", "--from", str(other_region)], "a backup of region ap-south"),
    ]
    for args, says in cases:
        _refused([*args, *state], says, plane_dir, tmp_path)
    _refused(["restore", "eu-west", "--from", str(good), "--state-dir", str(tmp_path / "none")],
             "no plane in", plane_dir, tmp_path)  # fmt: skip


def test_restore_refuses_a_running_region(plane_dir: Path, tmp_path: Path, schema: Path) -> None:
    saved = _plane(plane_dir, schema, running="eu-west")
    good = _backup(tmp_path / "good", saved, "eu-west")
    args = ["restore", "eu-west", "--from", str(good), "--state-dir", str(plane_dir)]
    _refused(args, f"eu-west's node is running (pid {os.getpid()})", plane_dir, tmp_path)


def test_backup_refuses_a_target_with_files_and_unknown_regions(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    _plane(plane_dir, schema)
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("mine")
    state = ["--state-dir", str(plane_dir)]
    _refused(["backup", "eu-west", "--to", str(target), *state], "is not an empty directory",
             plane_dir, tmp_path)  # fmt: skip
    _refused(["backup", "mars", "--to", str(tmp_path / "new"), *state], "no region 'mars'",
             plane_dir, tmp_path)  # fmt: skip
    assert not (tmp_path / "new").exists()


def test_a_backup_of_another_backend_is_refused(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    sqlite_plane = _plane(plane_dir / "sqlite", schema)
    postgres_plane = _plane(plane_dir / "postgres", schema, postgres=True)
    sqlite_backup = _backup(tmp_path / "sqlite-backup", postgres_plane, "eu-west")
    postgres_backup = _backup(tmp_path / "pg-backup", sqlite_plane, "eu-west", backend="postgres")
    cases = [
        (plane_dir / "postgres", sqlite_backup,
         "a backup of a SQLite replica; eu-west's replica is a PostgreSQL one"),
        (plane_dir / "sqlite", postgres_backup,
         "a backup of a PostgreSQL replica; eu-west's replica is a SQLite one"),
    ]  # fmt: skip
    for state_dir, backup, says in cases:
        args = ["restore", "eu-west", "--from", str(backup), "--state-dir", str(state_dir)]
        _refused(args, says, plane_dir, tmp_path)


def test_a_postgresql_backup_of_another_major_version_or_into_a_running_region_is_refused(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    saved = _plane(plane_dir, schema, postgres=True, running="eu-west")
    older = _backup(tmp_path / "older", saved, "eu-west", backend="postgres", pg_version="15")
    good = _backup(tmp_path / "good", saved, "eu-west", backend="postgres")
    state = ["--state-dir", str(plane_dir)]
    _refused(["restore", "eu-west", "--from", str(older), *state],
             "is a PostgreSQL 15 cluster; eu-west's is 16", plane_dir, tmp_path)  # fmt: skip
    _refused(["restore", "eu-west", "--from", str(good), *state],
             f"eu-west's node is running (pid {os.getpid()})", plane_dir, tmp_path)  # fmt: skip


def test_a_backup_restores_into_its_own_plane_only_by_manifest(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    """The backup command's manifest names the plane and region the restore checks."""
    saved = _plane(plane_dir, schema)
    result = CliRunner().invoke(
        build_app(),
        ["backup", "eu-west", "--to", str(tmp_path / "b"), "--state-dir", str(plane_dir)],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "b" / MANIFEST_NAME).read_text())
    assert (manifest["plane_id"], manifest["region"]) == (plane_id(saved), "eu-west")
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert manifest["schema_revision"] == head
    assert (tmp_path / "b" / "replica.sqlite3").stat().st_mode & 0o777 == 0o600


def _sql(path: Path, statement: str, *args: object) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(statement, args).fetchall()
        conn.commit()
    return rows


def _replica(plane_dir: Path, region: str) -> Path:
    return plane_dir / region / "replica.sqlite3"


def _backed_up(plane_dir: Path, schema: Path, tmp_path: Path) -> Path:
    """A plane whose other stores know eu-west's replica (as ``st``, generation 4), and a
    backup of eu-west."""
    _plane(plane_dir, schema)
    backup = tmp_path / "b"
    args = ["backup", "eu-west", "--to", str(backup), "--state-dir", str(plane_dir)]
    assert CliRunner().invoke(build_app(), args).exit_code == 0
    for region in ("us-east", "ap-south"):
        _sql(
            _replica(plane_dir, region), "INSERT INTO replica_registry VALUES ('eu-west', 'st', 4)"
        )
    return backup


def _restore(plane_dir: Path, backup: Path) -> str:
    result = CliRunner().invoke(
        build_app(), ["restore", "eu-west", "--from", str(backup), "--state-dir", str(plane_dir)]
    )
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_backup_behind_a_position_kept_elsewhere_is_quarantined_before_it_goes_in(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    backup = _backed_up(plane_dir, schema, tmp_path)
    # since the backup: us-east's store learnt that eu-west held shard 2 through (epoch 3, lsn 7)
    _sql(
        _replica(plane_dir, "us-east"), "INSERT INTO replica_positions VALUES (2, 'eu-west', 3, 7)"
    )
    _sql(_replica(plane_dir, "eu-west"), "CREATE TABLE after_the_backup (x INTEGER)")
    inode = _replica(plane_dir, "eu-west").stat().st_ino

    said = _restore(plane_dir, backup)
    assert (
        "behind on 1 shard(s) (shard 2: it ends at epoch 0 lsn 0, the others know it held "
        "epoch 3 lsn 7): eu-west is quarantined" in said
    )
    for region in ("us-east", "ap-south"):
        registry = _sql(_replica(plane_dir, region),
                        "SELECT store_id, generation FROM replica_registry WHERE region = 'eu-west'")  # fmt: skip
        assert registry == [("rolled-back:st", 5)]
    restored = _replica(plane_dir, "eu-west")
    assert restored.stat().st_ino == inode  # in place: the same identity
    tables = _sql(restored, "SELECT name FROM sqlite_master WHERE name = 'after_the_backup'")
    assert tables == []  # the backup's content
    assert not (plane_dir / "eu-west" / "replica.sqlite3.restoring").exists()


def test_a_backup_behind_no_position_is_restored_without_quarantine(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    backup = _backed_up(plane_dir, schema, tmp_path)
    said = _restore(plane_dir, backup)
    assert "quarantined" not in said and "replica rebuild" not in said
    for region in ("us-east", "ap-south"):
        registry = _sql(_replica(plane_dir, region),
                        "SELECT store_id, generation FROM replica_registry WHERE region = 'eu-west'")  # fmt: skip
        assert registry == [("st", 4)]


def test_a_postgresql_backup_whose_server_does_not_answer_leaves_nothing(
    plane_dir: Path, tmp_path: Path, schema: Path
) -> None:
    """pg_basebackup fails (no server runs on the region's socket): one error line, and the
    target it made is gone again."""
    _plane(plane_dir, schema, postgres=True)
    target = tmp_path / "new"
    args = ["backup", "eu-west", "--to", str(target), "--state-dir", str(plane_dir)]
    _refused(args, "eu-west's PostgreSQL could not be copied", plane_dir)
    assert not target.exists()
