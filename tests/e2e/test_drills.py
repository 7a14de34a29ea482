"""Drills on a real plane: ``convplane up --postgres`` (3 node processes, 3 PostgreSQL
instances), driven over HTTP with the operator key ``up`` writes into cluster.json.

Waits poll an outcome (a drill's verdict) under a generous bound; the only timing asserted is
the product's own promise (RTO max <= 3 s), measured by the drill and by an independent client.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventlog.sharding import shard_of
from services.cli.up import SUPERVISE_POLL_S
from services.config import api_key_sha256, load_cluster
from tests.e2e.conftest import CALL_FAILED
from tests.e2e.plane import CONVPLANE, Plane, convplane_env, start_plane, stop_plane

pytestmark = pytest.mark.postgres

DRILL_END_WAIT_S = 120.0
#: how long a drill start retries preflight's "shards not writable" refusal
PREFLIGHT_RETRY_S = 30.0
#: how long a read of operator state retries 503 (the control shard between leaders)
CONTROL_FAILOVER_WAIT_S = 30.0
RTO_MAX_S = 3.0
#: the independent client's RTO may differ from the drill's by its own and the canaries'
#: write cadence (one round each) plus a scheduling hiccup
RTO_AGREEMENT_S = 1.0


@dataclass
class Ops:
    plane: Plane
    operator: dict[str, str]
    tenant: dict[str, str]
    urls: list[str]
    #: tests of the module that failed so far
    failures: int = 0

    def call(self, method: str, path: str, *, headers: dict[str, str] | None = None,
             **kw: Any) -> httpx.Response:  # fmt: skip
        """The first region that answers (a drill's target may be cut off)."""
        last: Exception | None = None
        for url in self.urls:
            try:
                r = httpx.request(method, url + path, headers=headers or self.operator,
                                  timeout=20.0, **kw)  # fmt: skip
            except httpx.HTTPError as exc:
                last = exc
                continue
            if r.status_code in (502, 503) and url != self.urls[-1]:
                continue
            return r
        raise AssertionError(f"no region answered {method} {path}: {last!r}")

    def start(self, **body: Any) -> dict[str, Any]:
        """Start a drill. Preflight refuses (409, nothing changed) while some shard cannot take
        its canary yet, e.g. on a loaded machine right after a previous drill's failback: that
        refusal is retried, under a bound; any other answer is the test's."""
        drill = {"kind": "region-loss", "hold_s": 4.0, "reason": f"e2e {uuid.uuid4()}", **body}
        deadline = time.monotonic() + PREFLIGHT_RETRY_S
        while True:
            r = self.call("POST", "/v1/drills", json=drill)
            if r.status_code == 409 and "another drill is active" in r.text:
                # ``call`` sends the POST on to the next region when one answers 5xx or drops
                # the connection, and the first may have created the drill all the same
                mine = self._drill_with_reason(str(drill["reason"]))
                if mine is not None:
                    return mine
            retry = r.status_code == 409 and "shards not writable" in r.text
            if not retry or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert r.status_code == 201, r.text
        created: dict[str, Any] = r.json()
        return created

    def _drill_with_reason(self, reason: str) -> dict[str, Any] | None:
        r = self.read("/v1/drills")
        assert r.status_code == 200, r.text
        drills: list[dict[str, Any]] = r.json()["drills"]
        return next((d for d in drills if d["reason"] == reason), None)

    def read(self, path: str, **kw: Any) -> httpx.Response:
        """A read of operator state. The control shard's leader answers it (linearizable); while
        that shard is between leaders (a drill of its region moves it) every region answers 503
        with Retry-After, and the read is retried, under a bound."""
        deadline = time.monotonic() + CONTROL_FAILOVER_WAIT_S
        while True:
            r = self.call("GET", path, **kw)
            if r.status_code not in (502, 503) or time.monotonic() > deadline:
                return r
            time.sleep(0.5)

    def drill(self, drill_id: str) -> dict[str, Any]:
        r = self.read(f"/v1/drills/{drill_id}")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def wait_phase(self, drill_id: str, phases: set[str]) -> dict[str, Any]:
        deadline = time.monotonic() + DRILL_END_WAIT_S
        while time.monotonic() < deadline:
            d = self.drill(drill_id)
            if d["phase"] in phases:
                return d
            time.sleep(0.2)
        raise AssertionError(f"drill {drill_id} never reached {phases}: {self.drill(drill_id)}")

    def report(self, drill_id: str) -> dict[str, Any]:
        self.wait_phase(drill_id, {"done", "aborted", "failed"})
        r = self.read(f"/v1/drills/{drill_id}/report")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def placement(self) -> dict[str, Any]:
        r = self.call("GET", "/v1/placement", headers=self.tenant)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def region_back(self, region: str) -> bool:
        p = self.placement()
        regions = self.call("GET", "/v1/regions", headers=self.tenant).json()["regions"]
        up = {r["name"]: r["status"] for r in regions}
        return region not in p["down"] + p["evacuated"] and up[region] == "up"


@pytest.fixture(scope="module")
def ops() -> Iterator[Ops]:
    # a state dir the postgres user can traverse (pytest's tmp dirs are 0700)
    base = tempfile.mkdtemp(prefix="convplane-drills-")
    os.chmod(base, 0o711)
    proc, plane = start_plane(Path(base), "--postgres")
    try:
        assert "operator_api_key" in plane.info
        yield Ops(
            plane=plane,
            operator={"Authorization": f"Bearer {plane.info['operator_api_key']}"},
            tenant=plane.headers,
            urls=list(plane.urls.values()),
        )
    finally:
        output = stop_plane(proc)
        shutil.rmtree(base, ignore_errors=True)
        assert proc.returncode == 0, output[-4000:]


@pytest.fixture(autouse=True)
def _plane_logs_on_failure(request: pytest.FixtureRequest, ops: Ops) -> Iterator[None]:
    """A failed test's report ends with the node logs' tails: the plane's own account of what
    went wrong (the fixture is module-wide, so later tests see the same plane)."""
    yield
    if request.node.stash.get(CALL_FAILED, False):
        # the first failure gets the long account (later ones often follow from it)
        print(ops.plane.log_tails(lines=30 if ops.failures else 200))
        ops.failures += 1


@dataclass
class Writer:
    """An independent client: writes to one conversation through a survivor, all the time."""

    url: str
    headers: dict[str, str]
    conversation_id: str
    acks_s: list[float] = field(default_factory=list)
    errors_s: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=1.0) as c:
            r = c.post("/v1/conversations", json={"conversation_id": self.conversation_id},
                       timeout=20.0)  # fmt: skip
            assert r.status_code in (200, 201), r.text
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    r = c.post(f"/v1/conversations/{self.conversation_id}/events",
                               json={"type": "note", "payload": {"n": n}},
                               headers={"Idempotency-Key": f"w-{n}"})  # fmt: skip
                    if r.status_code in (200, 201):
                        self.acks_s.append(time.time())
                    else:
                        self.errors_s.append(time.time())
                except httpx.HTTPError:
                    self.errors_s.append(time.time())
                time.sleep(0.05)


def test_a_dry_run_changes_nothing(ops: Ops) -> None:
    before = ops.placement()
    drills_before = ops.read("/v1/drills").json()["drills"]
    audit_before = ops.read("/v1/audit").json()["entries"]
    r = ops.call("POST", "/v1/drills", json={"kind": "region-loss", "region": "eu-west",
                                             "hold_s": 5, "reason": "plan", "dry_run": True})  # fmt: skip
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert plan["ok"] and plan["shards_moved"] == len([
        s for s, owner in before["assignment"].items() if owner == "eu-west"
    ])  # fmt: skip
    assert "eu-west" not in plan["moves"].values()
    for dry_run in (True, False):  # a region the plane does not have: 404, nothing planned
        r = ops.call("POST", "/v1/drills", json={"kind": "region-loss", "region": "mars",
                                                 "hold_s": 5, "reason": "plan",
                                                 "dry_run": dry_run})  # fmt: skip
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    after = ops.placement()
    assert (after["version"], after["assignment"]) == (before["version"], before["assignment"])
    assert ops.read("/v1/drills").json()["drills"] == drills_before
    assert ops.read("/v1/audit").json()["entries"] == audit_before


def test_a_tenant_key_cannot_start_abort_or_halt(ops: Ops) -> None:
    calls = [
        ("POST", "/v1/drills", {"kind": "region-loss", "region": "eu-west", "hold_s": 5,
                                "reason": "x"}),
        ("POST", "/v1/drills/anything/abort", {"reason": "x"}),
        ("POST", "/v1/admin/halt", {"reason": "x"}),
        ("DELETE", "/v1/admin/halt", None),
        ("POST", "/v1/admin/regions/eu-west/evacuate", None),
    ]  # fmt: skip
    for method, path, body in calls:
        r = ops.call(method, path, headers=ops.tenant, json=body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (path, r.text)
    assert not ops.read("/v1/admin/halt").json()["on"]
    assert ops.read("/v1/drills").json()["drills"] == []


@pytest.mark.parametrize("region", ["us-east", "ap-south", "eu-west"])
def test_a_region_loss_drill_of_each_region_passes(ops: Ops, region: str) -> None:
    """ap-south has the lowest name: it leads the control shard, and its loss moves the drill
    itself to another node mid-run."""
    survivor = next(r for r in ops.plane.urls if r != region)
    cid = ops.plane.conversation_led_by(region, f"writer-{region}")
    writer = Writer(ops.plane.urls[survivor], ops.tenant, cid)
    thread = threading.Thread(target=writer.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not writer.acks_s and time.monotonic() < deadline:
            time.sleep(0.1)
        assert writer.acks_s, "the writer never got an ack before the drill"
        created = ops.start(region=region)
        assert created["status"] == "injecting"
        body = ops.report(created["drill_id"])
    finally:
        writer.stop.set()
        thread.join(timeout=10)
    assert body["verdict"] == "passed", body
    assert body["shards_moved"] > 0 and body["shards_recovered"] == body["shards_moved"]
    assert body["rto_max_s"] <= RTO_MAX_S, body["rto_by_shard_s"]
    assert body["canary_acked"] > 0 and body["canary_lost"] == 0
    assert [t["phase"] for t in body["timeline"]] == [
        "planned", "preflight", "injecting", "holding", "restoring", "done"
    ]  # fmt: skip
    # the client's outage: from its first failed write after injection to its next ack
    injected_s = body["timeline"][2]["at_ms"] / 1000
    outage_s = next(t for t in writer.errors_s if t > injected_s)
    independent = next(t for t in writer.acks_s if t > outage_s) - injected_s
    shard = str(shard_of(cid, ops.plane.shard_count))
    assert abs(body["rto_by_shard_s"][shard] - independent) <= RTO_AGREEMENT_S, (
        body["rto_by_shard_s"][shard], independent)  # fmt: skip
    assert ops.region_back(region)
    html = ops.read(f"/v1/drills/{created['drill_id']}/report",
                    headers={**ops.operator, "Accept": "text/html"})  # fmt: skip
    assert html.headers["content-type"].startswith("text/html") and "<svg" in html.text
    audit = ops.read("/v1/audit").json()["entries"]
    started = [e for e in audit if e["action"] == "drill.start"]
    assert started[-1]["detail"]["drill_id"] == created["drill_id"]
    assert (started[-1]["by"], started[-1]["role"]) == ("sre", "operator")


def test_an_abort_mid_drill_restores_the_region(ops: Ops) -> None:
    created = ops.start(region="us-east", hold_s=120.0)
    ops.wait_phase(created["drill_id"], {"holding"})
    r = ops.call("POST", f"/v1/drills/{created['drill_id']}/abort", json={"reason": "enough"})
    assert r.status_code == 200, r.text
    body = ops.report(created["drill_id"])
    assert body["verdict"] == "aborted" and "enough" in body["abort_reason"]
    assert body["canary_lost"] == 0
    assert ops.region_back("us-east")


def test_the_halt_switch_aborts_and_blocks(ops: Ops) -> None:
    created = ops.start(region="eu-west", hold_s=120.0, kind="evacuate")
    ops.wait_phase(created["drill_id"], {"holding"})
    r = ops.call("POST", "/v1/admin/halt", json={"reason": "incident 7"})
    assert r.status_code == 200 and r.json()["on"], r.text
    try:
        body = ops.report(created["drill_id"])
        assert body["verdict"] == "aborted" and "incident 7" in body["abort_reason"]
        assert ops.region_back("eu-west")
        r = ops.call("POST", "/v1/drills", json={"kind": "region-loss", "region": "us-east",
                                                 "hold_s": 5, "reason": "blocked?"})  # fmt: skip
        assert r.status_code == 409 and r.json()["error"]["code"] == "preflight_failed", r.text
        assert "halt switch is on (incident 7)" in r.json()["error"]["message"]
    finally:
        r = ops.call("DELETE", "/v1/admin/halt")
        assert r.status_code == 200 and not r.json()["on"], r.text
    # The audit log is served from the node's fold of the control shard: the entry the control
    # leader just committed reaches the node serving this read a moment later (bounded wait).
    for _ in range(100):
        actions = [e["action"] for e in ops.read("/v1/audit").json()["entries"]]
        if actions[-1:] == ["halt.off"]:
            break
        time.sleep(0.1)
    assert actions[-2:] == ["halt.on", "halt.off"]


def test_convplane_drill_run_follows_a_drill_and_exits_0_when_it_passed(ops: Ops) -> None:
    state_dir = Path(ops.plane.info["cluster_file"]).parent
    deadline = time.monotonic() + PREFLIGHT_RETRY_S
    while True:  # preflight's canary refusal right after a drill is retried, as in Ops.start
        out = subprocess.run(
            [*CONVPLANE, "drill", "run", "--region", "eu-west", "--hold-s", "3", "--state-dir",
             str(state_dir)],
            env=convplane_env(), capture_output=True, text=True, timeout=DRILL_END_WAIT_S,
        )  # fmt: skip
        refused = out.returncode != 0 and "shards not writable" in out.stdout + out.stderr
        if not refused or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "holding" in out.stdout and "-> passed" in out.stdout
    listed = subprocess.run([*CONVPLANE, "drill", "list", "--state-dir", str(state_dir)],
                            env=convplane_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listed.returncode == 0 and "passed" in listed.stdout.splitlines()[0]
    drill_id = listed.stdout.split()[0]
    page = state_dir / "report.html"
    wrote = subprocess.run([*CONVPLANE, "drill", "report", drill_id, "--html", str(page),
                            "--state-dir", str(state_dir)],
                           env=convplane_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    html = page.read_text()
    assert html.startswith("<!doctype html>") and drill_id in html and "<script" not in html


def test_a_kill_drill_kills_the_region_and_the_supervisor_restarts_it(ops: Ops) -> None:
    victim = next(r for r in ops.plane.info["regions"] if r["name"] == "us-east")
    created = ops.start(region="us-east", hold_s=5.0, kind="kill")
    body = ops.report(created["drill_id"])
    assert body["verdict"] == "passed", body
    assert body["shards_recovered"] == body["shards_moved"] > 0
    # RTO counts from the drill's first record; the supervisor kills at its next poll
    assert body["rto_max_s"] <= RTO_MAX_S + SUPERVISE_POLL_S and body["canary_lost"] == 0
    with pytest.raises(ProcessLookupError):
        os.kill(victim["node_pid"], 0)  # the node that ran before the drill was SIGKILLed
    assert ops.region_back("us-east")  # a new node process serves the region again


def test_keys_create_adds_a_key_with_a_role_and_audits_it(ops: Ops) -> None:
    cluster_file = Path(ops.plane.info["cluster_file"])
    made = subprocess.run(
        [*CONVPLANE, "keys", "create", "--tenant", "dashboards", "--role", "viewer",
         "--cluster-file", str(cluster_file), "--reason", "grafana",
         "--audit-url", ops.urls[0], "--audit-key", ops.operator["Authorization"][7:]],
        env=convplane_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    cluster = load_cluster(cluster_file)
    added = [t for t in cluster.tenants if t.tenant_id == "dashboards"]
    assert [(t.role, t.api_key_sha256) for t in added] == [("viewer", api_key_sha256(key))]
    entry = ops.read("/v1/audit").json()["entries"][-1]
    assert (entry["action"], entry["target"], entry["reason"], entry["by"]) == (
        "key.create", "dashboards (viewer)", "grafana", "sre")  # fmt: skip


def test_keys_create_audits_at_the_local_plane_by_default_and_refuses_when_it_cannot(
    ops: Ops, tmp_path: Path
) -> None:
    cluster_file = Path(ops.plane.info["cluster_file"])
    made = subprocess.run(
        [*CONVPLANE, "keys", "create", "--tenant", "oncall", "--role", "operator",
         "--cluster-file", str(cluster_file), "--reason", "new on-call"],
        env=convplane_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    entry = ops.read("/v1/audit").json()["entries"][-1]
    assert (entry["action"], entry["target"], entry["reason"]) == (
        "key.create", "oncall (operator)", "new on-call")  # fmt: skip
    # a cluster file with no plane beside it and no --audit-url: nothing is added ...
    alone = tmp_path / "cluster-config.json"
    alone.write_bytes(cluster_file.read_bytes())
    refused = subprocess.run(
        [*CONVPLANE, "keys", "create", "--tenant", "ghost", "--cluster-file", str(alone)],
        env=convplane_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "no key added" in refused.stderr, refused.stderr
    assert alone.read_bytes() == cluster_file.read_bytes()
    # ... unless the operator says so
    unrecorded = subprocess.run(
        [*CONVPLANE, "keys", "create", "--tenant", "ghost", "--cluster-file", str(alone),
         "--no-audit"],
        env=convplane_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert unrecorded.returncode == 0, unrecorded.stderr
    assert [t.tenant_id for t in load_cluster(alone).tenants][-1] == "ghost"


def test_an_audit_entry_recorded_at_any_region_is_in_the_next_read_at_every_region(
    ops: Ops,
) -> None:
    """Reads of operator state are linearizable: the control leader answers them after applying
    everything committed (a node's own fold of the control shard trails the leader by a poll)."""
    for n, url in enumerate(ops.urls * 2):
        recorded = httpx.post(url + "/v1/audit", headers=ops.operator, timeout=20.0, json={
            "action": "e2e.read-after-write", "target": f"n{n}", "reason": "linearizable"})  # fmt: skip
        assert recorded.status_code == 201, recorded.text
        for reader in ops.urls:
            r = read_at(reader, "/v1/audit?limit=1000", ops.operator)
            assert r.status_code == 200, r.text
            assert r.json()["entries"][-1]["target"] == f"n{n}", (url, reader)


def read_at(url: str, path: str, headers: dict[str, str]) -> httpx.Response:
    """One region's answer; a 503 (the control shard between leaders) is retried, under a bound."""
    deadline = time.monotonic() + CONTROL_FAILOVER_WAIT_S
    while True:
        r = httpx.get(url + path, headers=headers, timeout=20.0)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def test_losing_the_terminal_the_starting_node_and_the_control_leader_mid_drill(
    ops: Ops, tmp_path: Path
) -> None:
    """Last in this module: it leaves ap-south dead. ``convplane drill run`` starts an evacuate
    drill at ap-south's node, which also leads the control shard; mid-drill the operator's
    terminal (the CLI process) and that node are both SIGKILLed. The drill lives in the control
    shard, so the new control leader finishes it from its records: restored, and reported."""
    leader = next(r for r in ops.plane.info["regions"] if r["name"] == "ap-south")
    deadline = time.monotonic() + CONTROL_FAILOVER_WAIT_S
    while ops.placement()["control_leader"] != "ap-south":  # back after the earlier drills
        assert time.monotonic() < deadline, ops.placement()
        time.sleep(0.5)
    drill_id, terminal = "", None
    deadline = time.monotonic() + PREFLIGHT_RETRY_S
    while not drill_id:
        terminal = subprocess.Popen(
            [*CONVPLANE, "drill", "run", "--kind", "evacuate", "--region", "us-east",
             "--hold-s", "8", "--reason", "e2e: terminal lost", "--state-dir",
             str(tmp_path / "no-plane-here"), "--url", ops.plane.urls["ap-south"],
             "--key", ops.operator["Authorization"][7:]],
            env={**convplane_env(), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert terminal.stdout is not None
        first = terminal.stdout.readline()  # "drill <id>: evacuate of us-east, hold 8s"
        if first.startswith("drill "):
            drill_id = first.split()[1].rstrip(":")
            break
        _, err = terminal.communicate(timeout=60)
        # preflight refuses while a shard cannot take its canary yet (right after a failback)
        assert "shards not writable" in err and time.monotonic() < deadline, err
        time.sleep(1.0)
    assert terminal is not None
    ops.wait_phase(drill_id, {"holding"})
    terminal.kill()
    terminal.communicate(timeout=30)
    os.kill(leader["node_pid"], signal.SIGKILL)
    ops.urls = [u for name, u in ops.plane.urls.items() if name != "ap-south"]
    body = ops.report(drill_id)
    # another node took the control shard over and finished the drill from its records
    assert body["verdict"] == "passed", body
    assert [t["phase"] for t in body["timeline"]][-2:] == ["restoring", "done"]
    assert body["canary_lost"] == 0 and body["shards_recovered"] == body["shards_moved"]
    p = ops.placement()
    assert "us-east" not in p["evacuated"]
    assert p["control_leader"] != "ap-south"
