"""The Go programs the tests run (``tests/lincheck``, ``tests/compose_spec``): Go from PATH or
/usr/local/go, modules from the Go module proxy (pinned by each program's ``go.sum``), each
binary cached under ``.cache/``. No Go toolchain is a loud failure, never a skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 600


def go_binary() -> str:
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if found is None:
        raise RuntimeError(
            "the tests' Go programs need a Go toolchain (go on PATH or /usr/local/go): "
            "apt-get install golang-go"
        )
    return found


def build_go_program(source_dir: Path, name: str) -> Path:
    """Build the program in ``source_dir`` once per source change (``go build`` is
    incremental and fast when nothing changed); return the binary's path."""
    binary = REPO_ROOT / ".cache" / name / name
    binary.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    subprocess.run(
        [go_binary(), "build", "-o", str(binary), "."],
        cwd=source_dir,
        env=env,
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return binary
