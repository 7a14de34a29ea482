"""``LocalPlane.wait_healthy``: a node that never turns healthy fails the wait with what a user
needs to see why (its last /healthz answer and its log's tail), not only its name."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.local.plane import LocalPlane, PlaneError, RegionProcess


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_node_that_never_answers_fails_the_wait_with_its_log_tail(tmp_path: Path) -> None:
    log_path = tmp_path / "node.log"
    log_path.write_text("starting\nshard 3: lead attempt 1 failed: no quorum\n", "utf-8")
    port = _unused_port()  # nothing listens: the wait sees no answer
    member = RegionProcess(
        name="eu-west", port=port, url=f"http://127.0.0.1:{port}", peer_port=0, peer_url="",
        dsn="sqlite://", path=None, log_path=log_path,
    )  # fmt: skip
    member.node = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    plane = LocalPlane(state_dir=tmp_path, ready_timeout_s=0.0)
    try:
        with pytest.raises(PlaneError) as failure:
            plane.wait_healthy([member])
    finally:
        member.node.kill()
        member.node.wait()
    message = str(failure.value)
    assert message.startswith("nodes not healthy after 0s: eu-west")
    assert "eu-west: last /healthz: no answer (ConnectError)" in message
    assert "shard 3: lead attempt 1 failed: no quorum" in message
