"""Whether the four packages this process imports are the convplane distribution's own.

The distribution installs four top-level packages with generic names: ``eventlog``,
``regions``, ``replay`` and ``services``. Another distribution may install a package of the same
name into the same environment (pip then mixes both's files in one directory), and a directory
of that name on ``sys.path`` (the working directory, ``PYTHONPATH``) shadows the installed one.
Either way the failure would surface far away, as an ``ImportError`` of some name inside a node
process. ``installation_problems`` finds both, up front:

* each of the four must be a regular package imported from the same directory as ``services``
  (a site-packages, or the source tree of an editable install);
* no installed distribution but ``convplane`` may claim one of the four names.

``convplane`` runs it before any command (``services.cli.main``) and stops with the list. The
names stay as they are for now; the check is what keeps them safe until they move under one
``convplane`` package.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

DISTRIBUTION = "convplane"
TOP_LEVEL_PACKAGES = ("eventlog", "regions", "replay", "services")


def installation_problems() -> list[str]:
    """What is wrong with where the four packages come from; empty when nothing is."""
    from importlib.metadata import packages_distributions

    origins = {name: _origin(name) for name in TOP_LEVEL_PACKAGES}
    return origin_problems(origins) + claim_problems(packages_distributions())


def origin_problems(origins: Mapping[str, Path | None]) -> list[str]:
    """``origins``: each package's ``__init__.py`` (None: a namespace package, that is a bare
    directory of that name somewhere on ``sys.path``)."""
    home = origins["services"]
    root = home.parent.parent if home is not None else None
    problems = []
    for name, origin in origins.items():
        if origin is None:
            problems.append(
                f"{name!r} is a directory without __init__.py found on sys.path, not convplane's "
                f"package: rename or move it, or run from another directory"
            )
        elif root is not None and origin.parent.parent != root:
            problems.append(
                f"{name!r} was imported from {origin.parent}, not from {root / name} where "
                "convplane's other packages are: another package of that name shadows it"
            )
    return problems


def claim_problems(claims: Mapping[str, Sequence[str]]) -> list[str]:
    """``claims``: top-level name -> distributions that install it
    (``importlib.metadata.packages_distributions``)."""
    problems = []
    for name in TOP_LEVEL_PACKAGES:
        others = sorted({d for d in claims.get(name, ()) if _normalized(d) != DISTRIBUTION})
        if others:
            problems.append(
                f"the distribution {', '.join(others)} also installs a top-level package "
                f"{name!r}, mixed with convplane's: install convplane in its own virtualenv"
            )
    return problems


def _origin(name: str) -> Path | None:
    """Where ``name`` is (or would be) imported from, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.has_location:
        return None
    return Path(spec.origin).resolve()


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()
