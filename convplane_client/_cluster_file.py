"""Reading the ``cluster.json`` that ``convplane up`` writes: its regions' urls and the tenant
key, so a program beside a local plane (``convplane demo``, tests) needs no other setting."""

from __future__ import annotations

import json
from pathlib import Path


def read_cluster_file(path: Path) -> tuple[dict[str, list[str]], str]:
    """``({region name: its nodes' urls}, tenant api key)`` from a local plane's
    ``cluster.json`` (a region's first node first, then its ``more_nodes``)."""
    info = json.loads(path.read_text())
    try:
        regions = {
            str(r["name"]): [str(r["url"]), *(str(n["url"]) for n in r.get("more_nodes", []))]
            for r in info["regions"]
        }
        return regions, str(info["api_key"])
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"{path} does not describe a plane (regions with name and url, api_key)"
        ) from exc
