"""``convplane upgrade-region``: one region of a running local plane moved to this installation.

Run it from the new installation, one region at a time (docs/upgrade-backup-restore.md): it
stops the region's node (its shards fail over to the other regions, as at a restart), starts
it again on its data with this installation's ``convplane`` (``services.local.region_restart``
does both), and returns once every region's node is healthy again, so the next region may
follow. The plane's other nodes keep running their version meanwhile: the peer protocol's
window (``services.peer_protocol``) and the schema's (``eventlog.stores.schema_window``) say
which versions may share a plane.

Only a detached plane (``convplane up --detach``): a supervised one's nodes are the children of
its ``convplane up``, which starts them with its own installation whatever asks.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import httpx

from services.local.plane import HEALTH_POLL_S, PlaneError
from services.local.plane_processes import pid_alive
from services.local.region_restart import read_info, region_entry, restart_region
from services.peer_protocol import PEER_PROTOCOL, PEER_PROTOCOL_OLDEST

#: how long the upgraded plane may take until every region's node is healthy again (it leads
#: the shards placed on it once they move back)
SETTLE_WAIT_S = 120.0


def upgrade_region(state_dir: Path, region: str) -> str:
    """Restart ``region`` with this installation and wait until the whole plane is healthy;
    return what was done (a line for the operator)."""
    state_dir = state_dir.resolve()
    info = read_info(state_dir)
    region_entry(info, state_dir, region)
    supervisor = info.get("supervisor_pid")
    if info.get("supervised") and isinstance(supervisor, int) and pid_alive(supervisor):
        raise PlaneError(
            f"the plane is supervised by convplane up (pid {supervisor}), which starts its "
            "nodes with its own installation: stop it (convplane down) and start it detached "
            "with this installation (convplane up --detach, the same arguments), or upgrade a "
            "detached plane region by region"
        )
    restart_region(state_dir, region)
    _wait_all_healthy([r["url"] for r in read_info(state_dir)["regions"]])
    from importlib.metadata import version

    return (
        f"{region} runs convplane {version('convplane')} from {sys.executable} (peer protocol "
        f"{PEER_PROTOCOL}, serves {PEER_PROTOCOL_OLDEST} to {PEER_PROTOCOL}); every region is "
        "healthy"
    )


def _wait_all_healthy(urls: list[str]) -> None:
    deadline_s = time.monotonic() + SETTLE_WAIT_S
    pending = list(urls)
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while pending:
            for url in list(pending):
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url + "/healthz").status_code == 200:
                        pending.remove(url)
            if pending and time.monotonic() > deadline_s:
                raise PlaneError(
                    f"not healthy {SETTLE_WAIT_S:g}s after the upgrade: {', '.join(pending)}"
                )
            time.sleep(HEALTH_POLL_S)
