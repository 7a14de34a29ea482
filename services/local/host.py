"""What the local harnesses ask of the machine: a free port, and whether Docker runs here."""

from __future__ import annotations

import os
import socket
from pathlib import Path


class HarnessError(RuntimeError):
    """A local harness could not provide what was asked (a database, a broker, a plane, an
    engine): the message says why, with the log tail where there is one. Not an API error."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def docker_available() -> bool:
    """A Docker engine testcontainers can reach: its socket, or ``DOCKER_HOST`` (a client binary
    alone, as on machines where no engine runs, is not enough)."""
    return Path("/var/run/docker.sock").exists() or bool(os.environ.get("DOCKER_HOST"))
