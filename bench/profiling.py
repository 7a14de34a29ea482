"""Sampling a running benchmark process with py-spy (profiling runs, not the benchmark's numbers:
the sampler costs CPU)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def py_spy(pid: int, out: Path | None) -> Iterator[None]:
    """Record ``pid`` with py-spy (raw collapsed stacks, 200 Hz) into ``out`` while the block
    runs; nothing when ``out`` is None."""
    if out is None:
        yield
        return
    py_spy_bin = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    spy = subprocess.Popen(
        [py_spy_bin, "record", "-p", str(pid), "-o", str(out), "-f", "raw", "-r", "200",
         "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()
