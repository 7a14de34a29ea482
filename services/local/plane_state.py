"""What makes a local plane the same plane after a stop: ``<state-dir>/plane-state.json``.

``convplane up`` writes it (mode 0600: it holds the tenants' API keys, the databases'
superuser passwords and each node role's password) once the plane's databases exist, and reads
it on the next ``up`` with the same state directory: the same keys, ports, certificates (the
files under ``tls/``, never reissued), databases and log. Arguments that would make another plane
of the same directory (a different region count, SQLite against PostgreSQL, another shard count,
TLS on against off) are refused before anything is touched: ``conflicts`` says which.

Pure data and checks; ``services.local.plane`` does the starting.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE_FILE_NAME = "plane-state.json"
STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class SavedDatabase:
    """A region's PostgreSQL cluster under ``<state-dir>/postgres/<name>``."""

    name: str
    port: int
    password: str  # the ``postgres`` superuser's (SCRAM)
    tls: bool


@dataclass(frozen=True, slots=True)
class SavedRegion:
    name: str
    port: int
    peer_port: int
    db_password: str  # its node's role (services.deploy.db_roles), also in the region's pgpass file
    database: SavedDatabase | None  # None: a SQLite replica in the region's directory


@dataclass(frozen=True, slots=True)
class SavedEngines:
    """The real engines ``up --engine`` attached (``services.local.attached_engines``): a plain
    ``up`` attaches them again, checked again."""

    options: tuple[str, ...]  # each REGION=URL, as given
    priority_declared: bool
    kafka_bootstrap_servers: str  # "" = in-process workers
    #: kept across restarts: jobs still in Kafka stay verifiable, replayed caches reachable
    worker_keys: dict[str, str]  # region -> its workers' API key
    bus_secrets: dict[str, str]  # region -> 64 hex
    cache_salt_key: str  # 64 hex


@dataclass(frozen=True, slots=True)
class PlaneState:
    postgres: bool
    tls: bool
    shard_count: int
    host: str
    api_key: str
    limited_api_key: str
    operator_api_key: str
    viewer_api_key: str
    regions: tuple[SavedRegion, ...]
    engines: SavedEngines | None = None  # absent from files written before stop 44


@dataclass(frozen=True, slots=True)
class RequestedPlane:
    """What ``up``'s arguments ask for, to hold against a saved plane."""

    regions: int
    postgres: bool
    tls: bool
    shard_count: int
    host: str
    base_port: int  # 0: any (the saved ports are kept)


def conflicts(saved: PlaneState, requested: RequestedPlane) -> list[str]:
    """Each way ``requested`` differs from the plane saved in the state directory."""
    found = []
    if requested.regions != len(saved.regions):
        found.append(f"--regions {requested.regions}, it has {len(saved.regions)}")
    if requested.postgres != saved.postgres:
        has, asked = ("PostgreSQL", "SQLite") if saved.postgres else ("SQLite", "PostgreSQL")
        found.append(f"{asked} replicas asked, it has {has} ones")
    if requested.tls != saved.tls:
        found.append(f"--{'' if requested.tls else 'no-'}tls, it was started the other way")
    if requested.shard_count != saved.shard_count:
        found.append(f"--shard-count {requested.shard_count}, it has {saved.shard_count}")
    if requested.host != saved.host:
        found.append(f"host {requested.host}, it listens on {saved.host}")
    first_port = saved.regions[0].port
    if requested.base_port not in (0, first_port):
        found.append(f"--base-port {requested.base_port}, its first region is on {first_port}")
    return found


def load_state(path: Path) -> PlaneState | None:
    """The plane saved at ``path``; None when there is none. A file this module did not write
    (another version, a hand edit) is a ``ValueError`` naming it."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from exc
    try:
        if raw.pop("version") != STATE_VERSION:
            raise ValueError(f"version is not {STATE_VERSION}")
        regions = tuple(
            SavedRegion(
                **{k: v for k, v in region.items() if k != "database"},
                database=SavedDatabase(**region["database"]) if region["database"] else None,
            )
            for region in raw.pop("regions")
        )
        engines = raw.pop("engines", None)
        if engines is not None:
            engines = SavedEngines(**{**engines, "options": tuple(engines["options"])})
        return PlaneState(**raw, regions=regions, engines=engines)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path} is not a plane state this version wrote: {exc}") from exc


def state_json(state: PlaneState) -> dict[str, Any]:
    saved = {"version": STATE_VERSION, **asdict(state)}
    if state.engines is None:
        del saved["engines"]  # a plane without engines stays readable by older versions
    return saved
