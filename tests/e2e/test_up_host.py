"""``convplane up --host``: an address that is not an IPv4 address of this machine is refused
before anything starts, saying why. (A plane on a real non-loopback address, started and
resumed by this command: ``tests/lab/test_plane_on_a_real_address.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.plane import run_convplane


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("plane.example.com", "is not an IP address"),
        ("::1", "IPv6 is not supported yet"),
        ("192.0.2.1", "is not an address of this machine"),  # TEST-NET-1: nobody's
    ],
)
def test_a_host_that_is_not_an_address_of_this_machine_is_refused(
    tmp_path: Path, host: str, said: str
) -> None:
    result = run_convplane("up", "--state-dir", str(tmp_path / "plane"), "--host", host,
                           "--base-port", "0", "--detach")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert said in " ".join(result.stdout.split()), result.stdout
    assert not (tmp_path / "plane").exists()
