"""Build (``tests.go_programs``) and run the compose loader (``main.go``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.go_programs import build_go_program

SOURCE_DIR = Path(__file__).resolve().parent
LOAD_TIMEOUT_S = 60


def build_loader() -> Path:
    """Build the loader (when its source changed); return the binary's path."""
    return build_go_program(SOURCE_DIR, "compose_spec")


def load_project(binary: Path, compose_file: Path) -> dict[str, Any]:
    """The project ``compose_file`` describes, normalized by compose-go (every profile)."""
    done = subprocess.run(
        [str(binary), str(compose_file)],
        capture_output=True,
        text=True,
        timeout=LOAD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"compose-go refused {compose_file}: {done.stderr.strip()}")
    project: dict[str, Any] = json.loads(done.stdout)
    return project
