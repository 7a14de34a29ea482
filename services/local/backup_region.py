"""A region of a local plane as ``convplane backup`` and ``convplane restore`` find it in a state
directory (``services.local.backup``), whatever its replica's backend."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.local.plane import PlaneError
from services.local.plane_state import STATE_FILE_NAME, PlaneState, SavedDatabase, load_state

REPLICA_FILE_NAME = "replica.sqlite3"


@dataclass(frozen=True, slots=True)
class LocalRegion:
    """A region of the local plane in a state directory, as a backup or restore needs it."""

    state_dir: Path
    name: str
    replica: Path
    node_pid: int | None
    plane_id: str
    saved: PlaneState
    info: dict[str, Any]
    database: SavedDatabase | None  # None: a SQLite replica, ``replica``

    @property
    def cluster_file(self) -> Path:
        return self.state_dir / "cluster-config.json"


def plane_id(saved: PlaneState) -> str:
    """What names a plane in its backups: a digest of the key its first ``up`` made (it never
    changes for a state directory, and the digest tells nothing of the key)."""
    return hashlib.sha256(b"convplane plane\0" + saved.api_key.encode()).hexdigest()[:24]


def local_region(state_dir: Path, region: str) -> LocalRegion:
    """``region`` of the plane in ``state_dir``; PlaneError when there is none or it is not one
    these commands cover."""
    state_dir = state_dir.resolve()
    try:
        saved = load_state(state_dir / STATE_FILE_NAME)
        info: dict[str, Any] = json.loads((state_dir / "cluster.json").read_text("utf-8"))
    except FileNotFoundError as exc:
        raise PlaneError(f"no plane in {state_dir} (no cluster.json)") from exc
    except ValueError as exc:
        raise PlaneError(str(exc)) from exc
    if saved is None:
        raise PlaneError(f"no plane in {state_dir} (no {STATE_FILE_NAME})")
    names = [r.name for r in saved.regions]
    if region not in names:
        raise PlaneError(
            f"no region {region!r} in the plane in {state_dir} (it has {', '.join(names)})"
        )
    entry: dict[str, Any] = next(
        (r for r in info.get("regions", []) if r.get("name") == region), {}
    )
    pid = entry.get("node_pid")
    return LocalRegion(
        state_dir=state_dir,
        name=region,
        replica=state_dir / region / REPLICA_FILE_NAME,
        node_pid=pid if isinstance(pid, int) else None,
        plane_id=plane_id(saved),
        saved=saved,
        info=info,
        database=next(r.database for r in saved.regions if r.name == region),
    )
