"""The lab itself (``tests.harness.lab``): addresses, dropped packets, CPU quotas, cleanup."""

from __future__ import annotations

import ipaddress
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import lab as lab_module
from tests.harness.lab import Lab, LabError, check_machine, lab_leftovers, sweep_stale
from tests.lab.probes import connect_from, datagram_passes, listen

PORT = 9000
#: a busy loop's iterations: far more CPU than one CFS period's quota of a throttled host
BUSY_ITERATIONS = 3_000_000
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_hosts_reach_each_other_by_their_addresses(lab: Lab) -> None:
    a, b = lab.add_host("a"), lab.add_host("b")
    assert a.address != b.address
    assert ipaddress.ip_address(a.address) in ipaddress.ip_network(str(lab.subnet))
    listen(b, PORT)  # the test process, in the root namespace, reached it
    assert connect_from(a, b.address, PORT) == "connected"
    assert connect_from(b, b.address, PORT + 1) == "refused"  # nothing listens there
    assert connect_from(a, "127.0.0.1", PORT) == "refused"  # a's loopback is a's own


def test_a_partition_drops_packets_rather_than_refusing_and_heal_restores(lab: Lab) -> None:
    a, b, c = lab.add_host("a"), lab.add_host("b"), lab.add_host("c")
    listen(b, PORT)
    lab.partition(a, b)
    assert connect_from(a, b.address, PORT) == "timeout"
    assert connect_from(a, b.address, PORT + 1) == "timeout"  # not even a refusal gets back
    assert connect_from(c, b.address, PORT) == "connected"  # only a and b are cut
    listen(a, PORT)
    assert connect_from(b, a.address, PORT) == "timeout"
    lab.heal()
    assert connect_from(a, b.address, PORT) == "connected"
    assert connect_from(b, a.address, PORT) == "connected"


def test_a_one_way_cut_drops_one_direction_only(lab: Lab) -> None:
    a, b = lab.add_host("a"), lab.add_host("b")
    assert datagram_passes(a, b, PORT) and datagram_passes(b, a, PORT)
    lab.cut_one_way(a, b)
    assert not datagram_passes(a, b, PORT)
    assert datagram_passes(b, a, PORT)
    lab.heal()
    assert datagram_passes(a, b, PORT)


def test_a_host_cpu_quota_throttles_it(lab: Lab) -> None:
    capped, free = lab.add_host("capped", cpu_quota=0.05), lab.add_host("free")
    busy = [sys.executable, "-c", f"sum(range({BUSY_ITERATIONS}))"]
    for host in (capped, free):
        assert host.run(busy).wait() == 0
    assert capped.cpu_stat()["nr_throttled"] > 0
    assert free.cpu_stat()["nr_throttled"] == 0


def test_a_process_is_in_its_host_when_run_returns(lab: Lab) -> None:
    host = lab.add_host("a")
    for _ in range(20):  # it joins the cgroup itself, after Popen returned: run waits for it
        assert host.run(["sleep", "600"]).pid in host.pids()


def test_kill_ends_every_process_of_the_host(lab: Lab) -> None:
    a, b = lab.add_host("a"), lab.add_host("b")
    parent = a.run(["/bin/sh", "-c", "sleep 600 & sleep 600 & wait"])
    other = b.run(["sleep", "600"])
    while len(a.pids()) < 3:  # the shell and its two children
        assert parent.poll() is None
        time.sleep(0.01)
    a.kill()
    assert a.pids() == [] and parent.returncode == -signal.SIGKILL
    assert other.poll() is None and b.pids() == [other.pid]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_nothing_is_left_after_an_exception_in_the_lab(error: type[BaseException]) -> None:
    with pytest.raises(error), Lab() as lab:
        host = lab.add_host("a", cpu_quota=0.5)
        sleeper = host.run(["sleep", "600"])
        assert lab_leftovers(lab.tag) != []
        raise error("inside the lab")
    assert lab_leftovers(lab.tag) == []
    assert sleeper.wait() == -signal.SIGKILL


def test_the_stale_sweep_removes_what_a_killed_owner_left() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    tag, sleeper_pid = owner.stdout.readline().split()
    owner.kill()  # SIGKILL: no atexit, no finally
    owner.communicate()
    assert len(lab_leftovers(tag)) == 4  # the namespace, the bridge, the veth and the cgroup
    assert tag in sweep_stale()
    assert lab_leftovers(tag) == []
    assert not _running(int(sleeper_pid))


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


_OWNER = """
import subprocess, time
from tests.harness.lab import Lab
lab = Lab()
lab.start()
sleeper = lab.add_host("a").run(["sleep", "600"], stdout=subprocess.DEVNULL)
print(lab.tag, sleeper.pid, flush=True)
time.sleep(600)
"""


def test_two_labs_get_subnets_that_do_not_overlap(lab: Lab) -> None:
    with Lab() as other:
        assert other.subnet is not None and lab.subnet is not None
        assert not other.subnet.overlaps(lab.subnet)


def test_a_taken_range_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    first = next(lab_module.SUBNET_POOL.subnets(new_prefix=24))
    in_use = [ipaddress.IPv4Network(f"{first.network_address + 16}/28")]
    monkeypatch.setattr(lab_module, "_networks_in_use", lambda: in_use)
    assert not lab_module.free_subnet().overlaps(first)


def test_a_machine_without_iptables_is_an_error_not_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    real = lab_module._which
    monkeypatch.setattr(
        lab_module, "_which", lambda tool: None if tool == "iptables" else real(tool)
    )
    with pytest.raises(LabError, match=r"iptables command \(apt-get install iptables\)"):
        check_machine()
