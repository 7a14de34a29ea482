"""Small programs the lab's own tests run inside hosts: a TCP listener, a TCP connect that says
how it ended, and a UDP receiver and sender."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from tests.harness.lab import Host

#: seconds a probe's connect or receive waits before it calls the packets dropped
PROBE_WAIT_S = 2.0
#: seconds a listener may take to accept its first connection
LISTENER_READY_S = 30.0

_LISTEN = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
while True:
    server.accept()[0].close()
"""

_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except ConnectionRefusedError:
    print("refused")
except TimeoutError:
    print("timeout")
"""

_RECEIVE = """
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.settimeout(float(sys.argv[3]))
print("ready", flush=True)
try:
    print(sock.recv(64).decode())
except TimeoutError:
    print("nothing")
"""

_SEND = """
import socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(10):
    sock.sendto(b"datagram", (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.05)
"""


def listen(host: Host, port: int) -> subprocess.Popen[bytes]:
    """A TCP listener on ``host``'s address, accepting until the host dies; returns once a
    connection from the test process got through."""
    process = host.run([sys.executable, "-c", _LISTEN, host.address, str(port)])
    deadline = time.monotonic() + LISTENER_READY_S
    while True:
        try:
            socket.create_connection((host.address, port), timeout=PROBE_WAIT_S).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def connect_from(host: Host, address: str, port: int) -> str:
    """How a TCP connect from ``host`` to ``address:port`` ends: connected, refused or
    timeout."""
    return host.exec(
        [sys.executable, "-c", _CONNECT, address, str(port), str(PROBE_WAIT_S)]
    ).strip()


def datagram_passes(source: Host, target: Host, port: int) -> bool:
    """Whether UDP datagrams ``source`` sends to ``target`` arrive."""
    receiver = target.run(
        [sys.executable, "-c", _RECEIVE, target.address, str(port), str(PROBE_WAIT_S)],
        stdout=subprocess.PIPE,
    )
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == b"ready"
    source.exec([sys.executable, "-c", _SEND, target.address, str(port)])
    received, _ = receiver.communicate()
    return received.decode().strip() == "datagram"
