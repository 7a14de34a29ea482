"""Practice runs on a real plane (``convplane up``, SQLite replicas, simulated engines), with a
practice tick of 0.5 s: a schedule skips while an operator alert fires (the skip is in the
calendar with the alert's reason), then runs its drill by itself; a drill the approval policy
names waits until a second operator's key approves it (the requester's own key is refused);
a key's blast radius refuses a drill outside it; schemathesis finds no failure in the
practice operations, with an operator key and with a viewer key."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.openapi_contract_run import assert_all_passed, run_schemathesis
from tests.e2e.plane import Plane, run_convplane, start_plane, stop_plane

WAIT_S = 120.0
PRACTICE_ENV = {"CONVPLANE_PRACTICE_TICK_S": "0.5", "CONVPLANE_PRACTICE_FAILOVER_QUIET_S": "2"}
EVERY_DAY = [f"{day} 00:00-24:00" for day in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")]
#: these tests are about scheduling and approval, not RTO (``tests/e2e/test_drills.py`` holds the
#: drills to theirs): guards a loaded machine's slow canaries do not trip
LOOSE_GUARDS = {"max_rto_s": 60.0, "max_error_ratio": 1.0, "max_ack_p99_ms": 60_000.0}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    proc, plane = start_plane(
        tmp_path_factory.mktemp("practice"), "--sim-engines", "1", env=PRACTICE_ENV
    )
    try:
        yield plane
    finally:
        output = stop_plane(proc)
        assert proc.returncode == 0, output


class Api:
    def __init__(self, plane: Plane, key: str) -> None:
        self.plane = plane
        self.urls = list(plane.urls.values())
        self.key = key
        self.headers = {"Authorization": f"Bearer {key}"}

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The answer of the first region that gives one other than a retryable 503 (the
        control shard between leaders while a drill moves it) or 429 (a created key's quota),
        retried under a bound."""
        deadline = time.monotonic() + WAIT_S
        while True:
            for url in self.urls:
                try:
                    r = httpx.request(method, url + path, headers=self.headers, timeout=20, **kw)
                except httpx.TransportError:
                    continue
                if r.status_code not in (429, 503):
                    return r
            assert time.monotonic() < deadline, f"{method} {path}: no answer but 503"
            time.sleep(0.3)


def _until(what: str, found: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


def _calendar(api: Api, schedule_id: str | None = None) -> list[dict[str, Any]]:
    r = api.call("GET", "/v1/practice/calendar")
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()["entries"]
    return [e for e in entries if schedule_id is None or e["schedule_id"] == schedule_id]


def _drill_ended(api: Api, drill_id: str) -> dict[str, Any] | None:
    r = api.call("GET", f"/v1/drills/{drill_id}")
    assert r.status_code == 200, r.text
    drill: dict[str, Any] = r.json()
    return drill if drill["phase"] in ("done", "aborted", "failed") else None


def _audit(api: Api) -> list[dict[str, Any]]:
    r = api.call("GET", "/v1/audit", params={"limit": 1000})
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()["entries"]
    return entries


def _new_operator(by: Api, name: str) -> Api:
    body = {"tenant_id": name, "role": "operator", "reason": f"operator {name}"}
    r = by.call("POST", "/v1/admin/keys", json=body)
    assert r.status_code == 201, r.text
    made = Api(by.plane, r.json()["api_key"])
    _until(f"key {name} works", lambda: made.call("GET", "/v1/practice").status_code == 200)
    return made


@pytest.fixture(scope="module")
def operators(plane: Plane) -> tuple[Api, Api]:
    """Two operators, ``sre-1`` and ``sre-2``, whose keys the plane's administrator (the
    cluster-file operator key) created: two lines of descent, so one may approve the other."""
    admin = Api(plane, plane.info["operator_api_key"])
    return _new_operator(admin, "sre-1"), _new_operator(admin, "sre-2")


def test_a_schedule_skips_while_an_alert_fires_then_runs_its_drill_by_itself(
    plane: Plane, operators: tuple[Api, Api]
) -> None:
    sre, _ = operators
    region = sorted(plane.urls)[-1]
    fired = {"firing": True, "reason": "error rate over budget"}
    assert sre.call("PUT", "/v1/practice/alerts/pager", json=fired).status_code == 200
    schedule = {"region": region, "kind": "evacuate", "windows": EVERY_DAY, "hold_s": 1.0,
                "min_interval_s": 3600, "retry_after_skip_s": 1,
                "guards": LOOSE_GUARDS}  # fmt: skip
    r = sre.call("PUT", "/v1/practice/schedules/weekly", json=schedule)
    assert r.status_code == 200, r.text
    assert r.json()["by"] == "sre-1"
    skipped = _until(
        "a skip for the firing alert",
        lambda: [e for e in _calendar(sre, "weekly") if e["outcome"] == "skipped"],
    )
    assert "alert 'pager' firing: error rate over budget" in skipped[0]["reason"]
    assert not [e for e in _calendar(sre, "weekly") if e["outcome"] == "ran"]
    cleared = {"firing": False, "reason": "resolved"}
    assert sre.call("PUT", "/v1/practice/alerts/pager", json=cleared).status_code == 200
    ran = _until(
        "the scheduled drill",
        lambda: [e for e in _calendar(sre, "weekly") if e["outcome"] == "ran"],
    )
    drill = _until("the drill's end", lambda: _drill_ended(sre, ran[0]["drill_id"]))
    verdict = (drill["verdict"], drill["kind"], drill["region"])
    assert verdict == ("passed", "evacuate", region), drill
    assert drill["guards"] == LOOSE_GUARDS  # the schedule's
    starts = [e for e in _audit(sre) if e["action"] == "drill.start"]
    assert starts[-1]["by"] == "practice:sre-1"
    assert [e["action"] for e in _audit(sre)].count("practice.alert.fire") == 1
    assert sre.call("DELETE", "/v1/practice/schedules/weekly").status_code == 200


def test_a_drill_the_policy_names_waits_for_a_second_operators_approval(
    plane: Plane, operators: tuple[Api, Api]
) -> None:
    sre, sre2 = operators
    region = sorted(plane.urls)[1]
    policy = {"regions": None, "kinds": ["evacuate"]}
    assert sre.call("PUT", "/v1/practice/approval-policy", json=policy).status_code == 200
    drill = {"kind": "evacuate", "region": region, "hold_s": 1.0, "reason": "practice",
             "guards": LOOSE_GUARDS}  # fmt: skip
    refused = sre.call("POST", "/v1/drills", json=drill)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "approval_required"
    r = sre.call("POST", "/v1/practice/runs", json=drill)
    assert r.status_code == 201, r.text
    run = r.json()
    assert (run["status"], run["requested_by"]) == ("awaiting_approval", "sre-1")
    own = sre.call("POST", f"/v1/practice/runs/{run['run_id']}/approve")
    assert own.status_code == 403, own.text
    assert own.json()["error"]["code"] == "self_approval"
    # nor with a second key the requester minted for themselves, or one minted from that
    minted = _new_operator(sre, "sre-1-spare")
    for key in (minted, _new_operator(minted, "sre-1-spare-2")):
        mine = key.call("POST", f"/v1/practice/runs/{run['run_id']}/approve")
        assert mine.status_code == 403, mine.text
        assert mine.json()["error"]["code"] == "self_approval"
        assert "one line of descent" in mine.json()["error"]["message"], mine.text
    approved = run_convplane("practice", "approve", run["run_id"], "--url", sre2.urls[0],
                             "--key", sre2.key)  # fmt: skip
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert "approved by sre-2" in approved.stdout

    def closed() -> dict[str, Any] | None:
        runs = sre.call("GET", "/v1/practice").json()["runs"]
        mine = next(r for r in runs if r["run_id"] == run["run_id"])
        return mine if mine["status"] in ("ran", "skipped") else None

    done = _until("the approved run's start", closed)
    why = [e for e in _calendar(sre) if e["run_id"] == run["run_id"]]
    assert done["status"] == "ran", why
    ended = _until("the drill's end", lambda: _drill_ended(sre, done["drill_id"]))
    assert ended["verdict"] == "passed", ended
    assert ended["guards"] == LOOSE_GUARDS  # asked for with the run, kept through approval
    audit = [(e["action"], e["by"]) for e in _audit(sre)]
    assert ("practice.request", "sre-1") in audit and ("practice.approve", "sre-2") in audit
    calendar = run_convplane("practice", "calendar", "--url", sre.urls[0], "--key", sre.key)
    assert calendar.returncode == 0 and run["run_id"] in calendar.stdout, calendar.stderr
    assert sre.call("PUT", "/v1/practice/approval-policy", json={}).status_code == 200


def test_a_key_may_drill_only_inside_its_blast_radius(
    plane: Plane, operators: tuple[Api, Api]
) -> None:
    sre, sre2 = operators
    inside, outside = sorted(plane.urls)[:2]
    scope = {"regions": [inside], "kinds": None}
    assert sre.call("PUT", "/v1/practice/scopes/sre-2", json=scope).status_code == 200
    drill = {"kind": "region-loss", "hold_s": 1.0, "reason": "scope", "dry_run": True}
    refused = sre2.call("POST", "/v1/drills", json={**drill, "region": outside})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "outside_blast_radius"
    assert sre2.call("POST", "/v1/drills", json={**drill, "region": inside}).status_code == 200
    assert sre.call("POST", "/v1/drills", json={**drill, "region": outside}).status_code == 200
    widen = sre2.call("PUT", "/v1/practice/scopes/sre-2", json={"regions": None})
    assert widen.status_code == 403 and "may not change scopes" in widen.text, widen.text


def test_an_outcome_alarm_aborts_a_practice_drill(plane: Plane, operators: tuple[Api, Api]) -> None:
    sre, _ = operators
    drill = {"kind": "evacuate", "region": sorted(plane.urls)[-1], "hold_s": 60.0,
             "reason": "long practice"}  # fmt: skip
    deadline = time.monotonic() + WAIT_S
    while True:  # preflight refuses while the last drill's region fails back: asked again
        r = sre.call("POST", "/v1/practice/runs", json=drill)
        assert r.status_code == 201, r.text
        if r.json()["status"] == "ran" or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    run = r.json()
    assert run["status"] == "ran", [(e["outcome"], e["reason"]) for e in _calendar(sre)[:4]]
    fired = {"firing": True, "reason": "TTFT p99 over its SLO"}
    assert sre.call("PUT", "/v1/practice/alerts/ttft", json=fired).status_code == 200
    ended = _until("the drill's abort", lambda: _drill_ended(sre, run["drill_id"]))
    assert ended["verdict"] == "aborted", ended
    assert "outcome alarm: alert 'ttft' firing: TTFT p99 over its SLO" in ended["abort_reason"]
    cleared = {"firing": False, "reason": "resolved"}
    assert sre.call("PUT", "/v1/practice/alerts/ttft", json=cleared).status_code == 200


PRACTICE_OPERATIONS = (
    "practice_overview",
    "practice_calendar",
    "put_schedule",
    "delete_schedule",
    "request_practice_run",
    "approve_practice_run",
    "set_practice_alert",
    "set_approval_policy",
    "set_key_scope",
)


def test_schemathesis_finds_no_failure_in_practice_operations(plane: Plane, tmp_path: Path) -> None:
    """Last in the module: what it writes (schedules, alerts, policies) may start drills."""
    for key in ("viewer_api_key", "operator_api_key"):
        (tmp_path / key).mkdir()
        output = run_schemathesis(
            plane,
            plane.info[key],
            tmp_path / key,
            *(arg for op in PRACTICE_OPERATIONS for arg in ("--include-operation-id", op)),
            "--phases",
            "examples,coverage,fuzzing",
        )
        assert_all_passed(output, "Examples", "Coverage", "Fuzzing")
