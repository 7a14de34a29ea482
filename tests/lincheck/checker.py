"""Build and run the Porcupine checker (``main.go``): Go from PATH or /usr/local/go, modules
from the Go module proxy (pinned by ``go.sum``), the binary cached under ``.cache/``.

No Go toolchain is a loud failure, never a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE_DIR = Path(__file__).resolve().parent
REPO_ROOT = SOURCE_DIR.parents[1]
BINARY = REPO_ROOT / ".cache" / "lincheck" / "lincheck"
BUILD_TIMEOUT_S = 600
CHECK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Verdict:
    exit_code: int  # 0 linearizable, 1 not, 2 timed out or unusable input
    summary: dict[str, Any]
    stderr: str

    @property
    def linearizable(self) -> bool:
        return self.exit_code == 0


def go_binary() -> str:
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if found is None:
        raise RuntimeError(
            "the linearizability checker needs a Go toolchain (go on PATH or /usr/local/go): "
            "apt-get install golang-go"
        )
    return found


def build_checker() -> Path:
    """Build the checker once per source change (``go build`` is incremental and fast when
    nothing changed); return the binary's path."""
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    subprocess.run(
        [go_binary(), "build", "-o", str(BINARY), "."],
        cwd=SOURCE_DIR,
        env=env,
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return BINARY


def check_history(binary: Path, history_file: Path, html_file: Path | None = None) -> Verdict:
    """Run the checker on a recorded history file."""
    args = [str(binary), "-timeout", f"{CHECK_TIMEOUT_S - 30}s"]
    if html_file is not None:
        args += ["-html", str(html_file)]
    done = subprocess.run(
        [*args, str(history_file)], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
    )
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    return Verdict(done.returncode, summary, done.stderr)
