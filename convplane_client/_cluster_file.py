"""Reading the ``cluster.json`` that ``convplane up`` writes: its regions' urls and the tenant
key, so a program beside a local plane (``convplane demo``, tests) needs no other setting."""

from __future__ import annotations

import json
from pathlib import Path


def read_cluster_file(path: Path) -> tuple[dict[str, str], str]:
    """``({region name: url}, tenant api key)`` from a local plane's ``cluster.json``."""
    info = json.loads(path.read_text())
    try:
        regions = {str(r["name"]): str(r["url"]) for r in info["regions"]}
        return regions, str(info["api_key"])
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"{path} does not describe a plane (regions with name and url, api_key)"
        ) from exc
