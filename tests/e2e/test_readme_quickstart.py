"""The README's quickstart, run as a newcomer pastes it: the block under "## Quickstart",
unchanged, in bash with `-e`, from a fresh directory that holds only the project's venv, its
Makefile and pyproject.toml (so `make install` is the no-op it is after `make install`), with no
PYTHONPATH. Every command in it must succeed, the drill included."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
QUICKSTART_PORTS = (8700, 8701, 8702)  # what `convplane up --regions 3` binds, as the README says
QUICKSTART_TIMEOUT_S = 420


def quickstart_block() -> str:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quickstart", 1)[1]
    match = re.search(r"```sh\n(.*?)\n```", section, flags=re.DOTALL)
    assert match, "the README's quickstart has no sh block"
    return match.group(1)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as the nodes bind: TIME_WAIT is no holder
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    busy = [p for p in QUICKSTART_PORTS if not _port_free(p)]
    assert not busy, f"the quickstart needs ports {busy}, which something else holds"
    for name in (".venv", "Makefile", "pyproject.toml"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", quickstart_block()],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=QUICKSTART_TIMEOUT_S,
        )
    finally:  # a failed step leaves the detached plane running: stop it
        if (tmp_path / ".state/plane/cluster.json").exists():
            subprocess.run([str(tmp_path / ".venv/bin/convplane"), "down"], cwd=tmp_path,
                           env=env, capture_output=True, timeout=60)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert '"seq":1' in done.stdout and '"acked_by"' in done.stdout, output[-3000:]
    assert "-> passed" in done.stdout and "lost 0" in done.stdout, output[-3000:]
    assert "tool ran: True" in done.stdout and "state: committed" in done.stdout, output[-3000:]
    assert (tmp_path / "drill-report.html").read_text().startswith("<!doctype html>")
