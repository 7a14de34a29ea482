"""What the local harnesses ask of the machine: an address of it, a free port, and the
``convplane`` command a child runs."""

from __future__ import annotations

import ipaddress
import random
import socket
import sys
from pathlib import Path


class HarnessError(RuntimeError):
    """A local harness could not provide what was asked (a database, a broker, a plane, an
    engine): the message says why, with the log tail where there is one. Not an API error."""


def convplane_command(*args: str) -> list[str]:
    """``convplane args...`` as a harness spawns it: this interpreter, so the child imports the
    installation this process imported, from wherever it runs. ``-P`` keeps the working directory
    off the child's ``sys.path``: a folder named ``replay`` or ``services`` there never shadows
    the installed packages (and no ``PYTHONPATH`` is made up for it)."""
    return [sys.executable, "-P", "-m", "services.cli.main", *args]


def local_address(text: str) -> str:
    """``text`` if it is an IPv4 address of this machine (a socket can bind it): where a local
    plane's nodes, peer listeners and databases listen and what they advertise. HarnessError
    saying why otherwise (a name, IPv6, an address another machine has)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise HarnessError(
            f"--host {text!r} is not an IP address: give one of this machine's, e.g. 127.0.0.1 "
            "(the certificates and every URL name it)"
        ) from None
    if address.version != 4:
        raise HarnessError(f"--host {text}: IPv6 is not supported yet; give an IPv4 address")
    if address.is_unspecified or address.is_multicast:
        raise HarnessError(
            f"--host {text} is not one address: give the one the certificates and every URL "
            "name (this machine's, e.g. 127.0.0.1)"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((str(address), 0))
        except OSError as exc:
            raise HarnessError(
                f"--host {text} is not an address of this machine ({exc.strerror})"
            ) from None
    return str(address)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, for a harness process to bind soon after.

    Drawn below the kernel's ephemeral range: a port the kernel handed out (``bind`` to 0) can be
    taken, before the harness binds it, as the local port of any outgoing connection (a node's
    client to PostgreSQL, say), which made a plane fail to start now and then. Never the same port
    twice in one process."""
    low, _ = _ephemeral_range()
    first = _FIRST_HARNESS_PORT if low - _FIRST_HARNESS_PORT >= _PORT_DRAWS else 1024
    for _ in range(_PORT_DRAWS):
        port = _draw.randrange(first, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise HarnessError(f"no free TCP port on {host} in {first}..{low - 1}")


_FIRST_HARNESS_PORT = 15_000
_PORT_DRAWS = 200
_draw = random.Random()
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux; IANA's elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49_152, 65_535
