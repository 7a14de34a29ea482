"""Whether the tests' harnesses can fall back on testcontainers here (a test's question: the
product never starts containers)."""

from __future__ import annotations

import os
from pathlib import Path


def docker_available() -> bool:
    """A Docker engine testcontainers can reach: its socket, or ``DOCKER_HOST`` (a client binary
    alone, as on machines where no engine runs, is not enough)."""
    return Path("/var/run/docker.sock").exists() or bool(os.environ.get("DOCKER_HOST"))
