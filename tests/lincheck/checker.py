"""Build (``tests.go_programs``) and run the Porcupine checker (``main.go``)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.go_programs import build_go_program

SOURCE_DIR = Path(__file__).resolve().parent
CHECK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Verdict:
    exit_code: int  # 0 linearizable, 1 not, 2 timed out or unusable input
    summary: dict[str, Any]
    stderr: str

    @property
    def linearizable(self) -> bool:
        return self.exit_code == 0


def build_checker() -> Path:
    """Build the checker (when its source changed); return the binary's path."""
    return build_go_program(SOURCE_DIR, "lincheck")


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
