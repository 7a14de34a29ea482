"""A plane of the pinned earlier release upgraded region by region, under load, to this one.

The earlier release (``tests.e2e.old_release``: the wheel of commit 83d929a, in its own
virtualenv) starts a detached plane; writers append through every region and record each ack;
``convplane upgrade-region`` of this checkout restarts each region in turn on its data with
this version, while the writers go on. Then: every acked event is read back, in order, from
every region; while the regions restarted, the only failures were retryable (503/504 with
``retryable: true``, a refused or dropped connection); no node refused another's peer protocol;
every node runs this version; and the earlier release's migrations are byte for byte the first
ones of this version (migrations only append)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventlog.http_headers import IDEMPOTENCY_KEY_HEADER
from eventlog.stores.migrate import MIGRATIONS_DIR
from tests.e2e.old_release import PinnedReleaseMissing, old_release
from tests.e2e.plane import Plane, plane_info, run_convplane, until_answered

CONVERSATIONS = 6
WRITERS = 2
#: the writers' pace between appends (they run for the whole roll)
WRITE_PAUSE_S = 0.05
#: a retried append waits this long before its next try (another region)
RETRY_PAUSE_S = 0.05
#: load before the roll, and between two regions' upgrades
LOAD_BETWEEN_S = 2.0
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def old_bin() -> Path:
    try:
        return old_release()
    except PinnedReleaseMissing as exc:  # never a skip: the test exists to run against it
        pytest.fail(str(exc))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "plane"


class Writers:
    """Threads appending to ``CONVERSATIONS`` conversations (made before they start) through
    every region; an append is tried again, with its Idempotency-Key, through the next region
    until it is acked. Each answer that is not an ack is kept as (status or exception,
    retryable)."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.acks: dict[str, list[tuple[int, str]]] = {f"up-{i}": [] for i in range(CONVERSATIONS)}
        self.failures: list[tuple[str, Any]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True) for w in range(WRITERS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=RUN_TIMEOUT_S)

    def _write(self, writer: int) -> None:
        rng = random.Random(writer)
        mine = [cid for i, cid in enumerate(self.acks) if i % WRITERS == writer]
        regions = list(self.plane.urls)
        with httpx.Client(headers=self.plane.headers, timeout=20.0, trust_env=False) as client:
            n = 0
            while not self._stop.is_set():
                cid = mine[n % len(mine)]
                key = f"{cid}-{n}"
                body = {"type": "note", "payload": {"key": key}}
                seq = self._until_acked(client, regions, rng, f"/v1/conversations/{cid}/events",
                                        body, key)  # fmt: skip
                self.acks[cid].append((seq, key))
                n += 1
                time.sleep(WRITE_PAUSE_S)

    def _until_acked(
        self,
        client: httpx.Client,
        regions: list[str],
        rng: random.Random,
        path: str,
        body: dict[str, Any],
        key: str,
    ) -> int:
        region = rng.choice(regions)
        while True:
            try:
                reply = client.post(self.plane.urls[region] + path, json=body,
                                    headers={IDEMPOTENCY_KEY_HEADER: key})  # fmt: skip
            except httpx.TransportError as exc:
                self.failures.append((type(exc).__name__, True))
            else:
                if reply.status_code in (200, 201):
                    seq: int = reply.json().get("seq", 0)
                    return seq
                self.failures.append((f"{reply.status_code} {reply.text[:300]}", _retryable(reply)))
            region = regions[(regions.index(region) + 1) % len(regions)]
            time.sleep(RETRY_PAUSE_S)


def test_a_plane_of_the_earlier_release_upgrades_region_by_region_under_load(
    old_bin: Path, state_dir: Path
) -> None:
    _check_migrations_only_append(old_bin)
    old = subprocess.run(
        [str(old_bin / "convplane"), "up", "--regions", "3", "--state-dir", str(state_dir),
         "--base-port", "0", "--shard-count", "16", "--detach"],
        cwd=state_dir.parent, env=_env_without_checkout(), capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert old.returncode == 0, old.stdout + old.stderr
    writers = None
    try:
        plane = Plane(plane_info(state_dir))
        assert all(_runs_under(pid, old_bin) for pid in plane.node_pids())
        writers = Writers(plane)
        with plane.client(next(iter(plane.urls))) as client:
            for cid in writers.acks:  # before the roll: a create is not idempotent
                until_answered(client, "POST", "/v1/conversations", {"conversation_id": cid})
        writers.start()
        time.sleep(LOAD_BETWEEN_S)
        for region in plane.urls:
            upgraded = run_convplane("upgrade-region", region, "--state-dir", str(state_dir))
            assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
            assert f"{region} runs convplane" in upgraded.stdout
            time.sleep(LOAD_BETWEEN_S)
        writers.stop()

        not_retryable = [f for f in writers.failures if f[1] is not True]
        assert not not_retryable, not_retryable
        acked = sum(len(a) for a in writers.acks.values())
        assert acked > 0
        kinds = Counter(what.split(" ", 1)[0] for what, _ in writers.failures)
        print(f"\nacked {acked} appends during the roll; retryable failures while regions "
              f"restarted: {dict(kinds)}")  # fmt: skip
        assert not any(_runs_under(pid, old_bin) for pid in plane.node_pids())
        refusals = [line for r in plane.info["regions"] for line in _log_lines(r["log"])
                    if "peer call refused" in line or "refuses this node's peer calls" in line]  # fmt: skip
        assert not refusals, refusals  # old and new nodes served each other all along
        for region in plane.urls:
            with plane.client(region) as client:
                for cid, acks in writers.acks.items():
                    assert _transcript(client, cid) == acks, (region, cid)
    finally:
        if writers is not None:
            writers.stop()
        down = run_convplane("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr


def test_a_supervised_plane_is_refused_and_left_running(tmp_path: Path) -> None:
    """upgrade-region on an unknown region or a plane whose ``up`` supervises it (its nodes
    are that process's children, on its installation) changes nothing."""
    state = tmp_path / "plane"
    state.mkdir()
    info = {"supervised": True, "supervisor_pid": os.getpid(),
            "regions": [{"name": "us-east", "url": "http://127.0.0.1:1", "node_pid": None}]}  # fmt: skip
    (state / "cluster.json").write_text(json.dumps(info))
    before = (state / "cluster.json").read_bytes()
    for region, says in (("mars", "no region 'mars'"), ("us-east", "supervised by convplane up")):
        result = run_convplane("upgrade-region", region, "--state-dir", str(state))
        assert result.returncode == 1, result.stdout + result.stderr
        assert says in " ".join(result.stderr.split()), result.stderr
    assert (state / "cluster.json").read_bytes() == before


def _transcript(client: httpx.Client, cid: str) -> list[tuple[int, str]]:
    """Every event of ``cid`` after its creation, page by page, as (seq, key)."""
    events: list[tuple[int, str]] = []
    after_seq = 0
    while True:
        path = f"/v1/conversations/{cid}/events?after_seq={after_seq}&limit=1000"
        page = until_answered(client, "GET", path).json()
        if not page["events"]:
            return events
        events += [(e["seq"], e["payload"]["key"]) for e in page["events"]]
        after_seq = page["next_after_seq"]


def _check_migrations_only_append(old_bin: Path) -> None:
    """The earlier release's migrations are this version's first ones, unchanged."""
    (site,) = (old_bin.parent / "lib").glob("python3*/site-packages")
    released = sorted((site / "eventlog" / "migrations" / "versions").glob("*.py"))
    assert released
    for old_file in released:
        new_file = MIGRATIONS_DIR / "versions" / old_file.name
        assert new_file.is_file(), f"released migration {old_file.name} is gone"
        assert new_file.read_bytes() == old_file.read_bytes(), f"{old_file.name} was edited"


def _log_lines(path: str) -> list[str]:
    return Path(path).read_text(errors="replace").splitlines()


def _runs_under(pid: int, bin_dir: Path) -> bool:
    """Whether process ``pid`` is the interpreter of the virtualenv of ``bin_dir`` (the
    directories compared resolved: the cache may be reached through a link; the interpreter
    itself is not resolved, a virtualenv's is a link to the system's)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except FileNotFoundError:
        return False
    return Path(command).parent.resolve() == bin_dir.resolve()


def _retryable(reply: httpx.Response) -> bool:
    try:
        return reply.status_code in (503, 504) and reply.json()["error"]["retryable"] is True
    except (ValueError, KeyError, TypeError):
        return False


def _env_without_checkout() -> dict[str, str]:
    """This environment without what would lead the earlier release to this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    return env
