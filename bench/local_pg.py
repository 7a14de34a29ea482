"""One local PostgreSQL server for a benchmark that measures a single database."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.local.postgres import start_instances


@contextmanager
def one_postgres(name: str) -> Iterator[str]:
    """A server (``services.local.postgres``) in a scratch directory under /tmp, stopped and
    removed afterwards; yields its DSN."""
    work = Path(tempfile.mkdtemp(prefix=f"convplane-bench-{name}-", dir="/tmp"))
    work.chmod(0o755)  # the postgres user must traverse it
    try:
        (instance,) = start_instances(1, work)
        try:
            yield instance.dsn
        finally:
            instance.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
