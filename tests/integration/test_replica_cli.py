"""``convplane replica status | rebuild`` on three SQLite replicas, straight from the cluster file
(no node runs): a fresh cluster is admitted on first use; a replica re-created empty in its place
is quarantined (exit 1) until ``rebuild`` copies the log back and re-admits it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from services.cli.main import build_app
from services.config import ClusterConfig, RegionConfig, write_cluster

REGIONS = ("a", "b", "c")


def _cluster_file(tmp_path: Path) -> Path:
    cluster = ClusterConfig(
        regions=[
            RegionConfig(
                name=r, url=f"http://{r}.test", dsn=f"sqlite+aiosqlite:///{tmp_path}/{r}.db"
            )
            for r in REGIONS
        ],
        shard_count=4,
    )
    path = tmp_path / "cluster.json"
    write_cluster(path, cluster)
    return path


def _status(runner: CliRunner, cluster_file: Path) -> tuple[int, dict[str, str]]:
    result = runner.invoke(build_app(), ["replica", "status", "--cluster-file", str(cluster_file)])
    verdicts = json.loads(result.stdout)
    return result.exit_code, {region: v["state"] for region, v in verdicts.items()}


def test_a_replaced_replica_is_quarantined_until_rebuilt(tmp_path: Path) -> None:
    runner = CliRunner()
    cluster_file = _cluster_file(tmp_path)
    assert _status(runner, cluster_file) == (0, dict.fromkeys(REGIONS, "admitted"))

    for suffix in ("", "-wal", "-shm"):  # c's disk is replaced: an empty database in its place
        (tmp_path / f"c.db{suffix}").unlink(missing_ok=True)
    code, states = _status(runner, cluster_file)
    assert (code, states["c"]) == (1, "quarantined")

    rebuilt = runner.invoke(
        build_app(), ["replica", "rebuild", "--cluster-file", str(cluster_file), "--region", "c"]
    )
    assert rebuilt.exit_code == 0, rebuilt.output
    assert json.loads(rebuilt.stdout)["generation"] == 1
    assert _status(runner, cluster_file) == (0, dict.fromkeys(REGIONS, "admitted"))
