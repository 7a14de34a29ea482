"""A lab of hosts on one machine, for tests that need what a multi-host deployment has: an
address and a TCP stack per host, packets that are dropped rather than refused, and a CPU quota
per host. Test-only: the product never imports it.

A ``Lab`` is a bridge in the root network namespace with an address of its own (the test
process reaches every host through it) and, per host, a network namespace joined to the bridge
by a veth pair, its own address on the bridge's subnet and ``lo`` up, and a child group of the
cgroup v1 ``cpu`` controller whose ``cpu.cfs_quota_us`` caps the host's CPU. ``Host.run``
starts a process inside both (``ip netns exec``; the process joins the cgroup before it execs,
so everything it forks is in the host too); ``Host.kill`` kills every process of the group at
once, a host crash. ``Lab.partition``, ``cut_one_way`` and ``heal`` add and flush iptables DROP
rules inside the hosts' namespaces (they vanish with them): a connection across a cut times out,
it is never refused.

Every name the lab creates carries ``LAB_PREFIX``, its owner's pid and a per-process lab number
(``cpl<pid hex>-<n hex>``). ``Lab.close`` removes everything on every exit path it sees: the
end of a ``with`` block (exceptions and KeyboardInterrupt too), interpreter exit (``atexit``)
and SIGTERM (turned into ``SystemExit`` while a lab is open, when nobody else handles it). What
a SIGKILLed owner left behind is removed by the next lab's start (``sweep_stale``): anything
named for a pid that no longer runs.

The subnet is the first /24 of ``SUBNET_POOL`` that no address or route of the machine
overlaps. A machine that does not allow the lab (not root, no ``ip``, no ``iptables``, no cgroup
v1 ``cpu`` controller) gets a ``LabError`` naming what is missing: never a skip.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

#: every interface, namespace and cgroup of a lab starts with this
LAB_PREFIX = "cpl"
#: the /24s a lab may take, the first one free on this machine
SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")
CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: one CFS period; a host's quota is a fraction of it (1.0: one core)
CFS_PERIOD_US = 100_000
#: the smallest quota the kernel accepts
CFS_QUOTA_MIN_US = 1_000
#: hosts per lab (the host's number is in its veth's name: 15 characters at most)
HOSTS_MAX = 99
#: labs per process (the lab's number is in its interfaces' names)
LABS_PER_PROCESS_MAX = 256
#: seconds an ``ip``/``iptables`` command may take
COMMAND_TIMEOUT_S = 30.0
#: seconds a killed host's processes may take to leave its cgroup
KILL_WAIT_S = 10.0
#: serializes sweeping and subnet choice between labs of different processes
LOCK_FILE = Path("/run/convplane-lab.lock")
#: the chain in each host's namespace that holds the lab's DROP rules
DROP_CHAIN = "CONVPLANE_LAB"

_NAME = re.compile(rf"^{LAB_PREFIX}(?P<pid>[0-9a-f]+)-(?P<n>[0-9a-f]+)(?:$|[-v])")
_lab_numbers = itertools.count()


class LabError(RuntimeError):
    """The lab could not be built, used or removed here: the message says what is missing."""


@dataclass
class Host:
    """One host of a lab: a network namespace, its address and its cgroup."""

    name: str
    namespace: str
    address: str
    cgroup: Path
    #: cores (0.25: a quarter of one); None: no quota
    cpu_quota: float | None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        stdout: IO[Any] | int | None = None,
        stderr: IO[Any] | int | None = None,
        cwd: Path | str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the host (its namespace and cgroup), as ``user`` if given; its
        pid is ``argv``'s own (every wrapper execs). Its own session: no terminal signal
        reaches it."""
        as_user = []
        if user is not None:
            as_user = [_tool("setpriv"), f"--reuid={user}", f"--regid={user}", "--init-groups"]
        command = [
            "/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cgroup / "cgroup.procs"),
            _tool("ip"), "netns", "exec", self.namespace, *as_user, *argv,
        ]  # fmt: skip
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            env=None if env is None else dict(env), cwd=cwd, start_new_session=True,
        )  # fmt: skip
        self.processes.append(process)
        self._wait_joined(process)
        return process

    def _wait_joined(self, process: subprocess.Popen[bytes]) -> None:
        """Until ``process`` is in the host's cgroup (it writes itself there before it execs;
        Popen returns before that): from then on ``kill`` and the sweep see it."""
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while process.pid not in self.pids() and process.poll() is None:
            if time.monotonic() > deadline:
                process.kill()
                raise LabError(f"{self.name}: a process did not join {self.cgroup}")
            time.sleep(0.001)

    def exec(self, argv: Sequence[str]) -> str:
        """Run ``argv`` in the host's namespace (not its cgroup: a chore, such as iptables) to
        its end; its output, or a LabError with it."""
        return _run([_tool("ip"), "netns", "exec", self.namespace, *argv])

    def pids(self) -> list[int]:
        try:
            text = (self.cgroup / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(pid) for pid in text.split()]

    def kill(self) -> None:
        """SIGKILL every process of the host at once (a crash), and wait until none is left."""
        _kill_group(self.cgroup)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_WAIT_S)

    def cpu_stat(self) -> dict[str, int]:
        """The host's ``cpu.stat``: ``nr_periods``, ``nr_throttled``, ``throttled_time``..."""
        lines = (self.cgroup / "cpu.stat").read_text().splitlines()
        return {name: int(value) for name, value in (line.split() for line in lines)}


class Lab:
    """Hosts on a bridge (module docstring); use it as a context manager."""

    def __init__(self) -> None:
        number = next(_lab_numbers)
        if number >= LABS_PER_PROCESS_MAX:
            raise LabError(f"more than {LABS_PER_PROCESS_MAX} labs in one process")
        self.tag = f"{LAB_PREFIX}{os.getpid():x}-{number:x}"
        self.bridge = f"{self.tag}-br"
        self.cgroup = CGROUP_CPU_ROOT / self.tag
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self._previous_sigterm: Any = None
        self._open = False

    @property
    def address(self) -> str:
        """The bridge's address: where the test process's packets come from."""
        assert self.subnet is not None, "the lab is not started"
        return str(self.subnet.network_address + 1)

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        check_machine()
        self._open = True
        atexit.register(self.close)
        self._handle_sigterm()
        try:
            with _machine_lock():
                sweep_stale()
                self.subnet = free_subnet()
                _run([_tool("ip"), "link", "add", self.bridge, "type", "bridge"])
                _run([_tool("ip"), "addr", "add", f"{self.address}/24", "dev", self.bridge])
                _run([_tool("ip"), "link", "set", self.bridge, "up"])
            self.cgroup.mkdir()
        except BaseException:
            self.close()
            raise

    def add_host(self, name: str, *, cpu_quota: float | None = None) -> Host:
        """A new host named ``name`` (letters, digits, dashes) with ``cpu_quota`` cores."""
        if not re.fullmatch(r"[a-z0-9-]+", name) or name in self.hosts:
            raise LabError(f"host name {name!r} is taken or not [a-z0-9-]+")
        if len(self.hosts) >= HOSTS_MAX:
            raise LabError(f"a lab has at most {HOSTS_MAX} hosts")
        assert self.subnet is not None, "the lab is not started"
        index = len(self.hosts)
        host = Host(
            name=name,
            namespace=f"{self.tag}-{name}",
            address=str(self.subnet.network_address + 2 + index),
            cgroup=self.cgroup / name,
            cpu_quota=cpu_quota,
        )
        self.hosts[name] = host
        ip, veth = _tool("ip"), f"{self.tag}v{index}"
        _run([ip, "netns", "add", host.namespace])
        _run([ip, "link", "add", "eth0", "netns", host.namespace, "type", "veth",
              "peer", "name", veth])  # fmt: skip
        _run([ip, "link", "set", veth, "master", self.bridge, "up"])
        _run([ip, "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run([ip, "-n", host.namespace, "link", "set", "eth0", "up"])
        _run([ip, "-n", host.namespace, "link", "set", "lo", "up"])
        host.exec([_tool("iptables"), "-w", "-N", DROP_CHAIN])
        host.exec([_tool("iptables"), "-w", "-A", "INPUT", "-j", DROP_CHAIN])
        host.cgroup.mkdir()
        (host.cgroup / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        quota_us = (
            -1 if cpu_quota is None else max(CFS_QUOTA_MIN_US, int(cpu_quota * CFS_PERIOD_US))
        )
        (host.cgroup / "cpu.cfs_quota_us").write_text(str(quota_us))
        return host

    def partition(self, a: Host, b: Host) -> None:
        """Drop every packet between ``a`` and ``b``, both ways."""
        self.cut_one_way(a, b)
        self.cut_one_way(b, a)

    def cut_one_way(self, source: Host, target: Host) -> None:
        """Drop every packet from ``source`` to ``target`` (on arrival at ``target``); the
        other way still passes."""
        target.exec([_tool("iptables"), "-w", "-A", DROP_CHAIN, "-s", source.address, "-j", "DROP"])

    def heal(self) -> None:
        """Remove every cut."""
        for host in self.hosts.values():
            host.exec([_tool("iptables"), "-w", "-F", DROP_CHAIN])

    def close(self) -> None:
        """Kill every host's processes and remove the namespaces, the bridge and the cgroups;
        idempotent. A LabError names what could not be removed."""
        if not self._open:
            return
        self._open = False
        atexit.unregister(self.close)
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        for host in self.hosts.values():
            with contextlib.suppress(LabError):
                host.kill()  # and reap the processes it started
        left = remove_lab(self.tag)
        if left:
            raise LabError(f"lab {self.tag} left behind: {', '.join(left)}")

    def _handle_sigterm(self) -> None:
        """SIGTERM ends the process through ``SystemExit`` (so ``close`` runs) while the lab is
        open, unless someone else already handles it; only the main thread may set it."""
        with contextlib.suppress(ValueError):
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


# --- the machine ---------------------------------------------------------------------------


def check_machine() -> None:
    """A LabError naming everything the lab needs that this machine lacks."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, iptables and cgroups need it)")
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables"), ("setpriv", "util-linux")):
        if _which(tool) is None:
            missing.append(f"the {tool} command (apt-get install {package})")
    if not (CGROUP_CPU_ROOT / "cpu.cfs_quota_us").exists():
        missing.append(f"the cgroup v1 cpu controller at {CGROUP_CPU_ROOT}")
    if missing:
        raise LabError("this machine cannot host the lab: needs " + "; ".join(missing))


def free_subnet() -> ipaddress.IPv4Network:
    """The first /24 of SUBNET_POOL that no address or route of the machine overlaps."""
    taken = _networks_in_use()
    for subnet in SUBNET_POOL.subnets(new_prefix=24):
        if not any(subnet.overlaps(network) for network in taken):
            return subnet
    raise LabError(f"every /24 of {SUBNET_POOL} overlaps an address or route of this machine")


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network of an address or a route (the default route aside)."""
    ip = _tool("ip")
    taken = []
    for link in json.loads(_run([ip, "-j", "-4", "addr", "show"])):
        for info in link.get("addr_info", []):
            taken.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_run([ip, "-j", "-4", "route", "show", "table", "all"])):
        destination = route.get("dst", "default")
        if destination != "default":
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(destination, strict=False))
    return [network for network in taken if isinstance(network, ipaddress.IPv4Network)]


def sweep_stale() -> list[str]:
    """Remove what labs of processes that no longer run left behind; what was removed."""
    removed = []
    for tag in sorted({tag for tag in _lab_tags() if not _alive(_owner_pid(tag))}):
        removed.append(tag)
        remove_lab(tag)
    return removed


def lab_leftovers(tag: str) -> list[str]:
    """Every namespace, interface and cgroup of lab ``tag`` that exists now."""
    found = [f"namespace {name}" for name in _namespaces() if _tag_of(name) == tag]
    found += [f"interface {name}" for name in _interfaces() if _tag_of(name) == tag]
    if (CGROUP_CPU_ROOT / tag).exists():
        found.append(f"cgroup {CGROUP_CPU_ROOT / tag}")
    return found


def remove_lab(tag: str) -> list[str]:
    """Kill lab ``tag``'s processes, remove its namespaces, bridge and cgroups; what is left."""
    group = CGROUP_CPU_ROOT / tag
    hosts = sorted(path for path in group.iterdir() if path.is_dir()) if group.exists() else []
    for host_group in hosts:
        with contextlib.suppress(LabError):
            _kill_group(host_group)
        with contextlib.suppress(OSError):
            host_group.rmdir()
    ip = _tool("ip")
    for namespace in _namespaces():
        if _tag_of(namespace) == tag:
            with contextlib.suppress(LabError):  # anything else that entered it
                for pid in _run([ip, "netns", "pids", namespace]).split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(LabError):
                _run([ip, "netns", "delete", namespace])
    for interface in _interfaces():
        if _tag_of(interface) == tag:
            with contextlib.suppress(LabError):
                _run([ip, "link", "delete", interface])
    with contextlib.suppress(OSError):
        group.rmdir()
    return lab_leftovers(tag)


def _lab_tags() -> list[str]:
    names = [*_namespaces(), *_interfaces()]
    if CGROUP_CPU_ROOT.exists():
        names += [path.name for path in CGROUP_CPU_ROOT.iterdir() if path.is_dir()]
    return [tag for name in names if (tag := _tag_of(name)) is not None]


def _tag_of(name: str) -> str | None:
    match = _NAME.match(name)
    return None if match is None else f"{LAB_PREFIX}{match['pid']}-{match['n']}"


def _owner_pid(tag: str) -> int:
    match = _NAME.match(tag)
    assert match is not None
    return int(match["pid"], 16)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run([_tool("ip"), "netns", "list"]).splitlines() if line]


def _interfaces() -> list[str]:
    return [link["ifname"] for link in json.loads(_run([_tool("ip"), "-j", "link", "show"]))]


def _kill_group(group: Path) -> None:
    """SIGKILL every process of cgroup ``group`` until none is left (one may fork meanwhile)."""
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        try:
            pids = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise LabError(f"processes {pids} of {group} survived SIGKILL for {KILL_WAIT_S:g}s")
        time.sleep(0.01)


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _tool(tool: str) -> str:
    path = _which(tool)
    if path is None:
        raise LabError(f"the lab needs the {tool} command")
    return path


def _run(argv: Sequence[str]) -> str:
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(argv)} took more than {COMMAND_TIMEOUT_S:g}s") from exc
    if result.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result.stdout
