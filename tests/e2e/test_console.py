"""The console in a real browser: headless Chromium (Debian's, ``tests.e2e.browser``) on a real
local plane (``convplane up``: 3 node processes, SQLite replicas, 16 shards).

A viewer sees a running drill and the server refuses its abort (the page shows the 403); an
operator watching a page served by the drill's target sees that region go down (the page reads
from a survivor meanwhile), aborts the drill from the page and sees the region come back; a page
whose own node is killed keeps updating from the other regions. Screenshots of each state are
written to ``tests/artifacts/console/`` (git-ignored; the paths are printed); a failed test's
report ends with what its page showed (banners, source, top bar, audit rows), a screenshot of
it, and the tails of the node logs.

Waits poll what the page shows under a generous bound; nothing asserts a duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By

from tests.e2e.browser import chromium
from tests.e2e.conftest import CALL_FAILED
from tests.e2e.plane import REPO_ROOT, Plane, start_plane, stop_plane

ARTIFACTS = REPO_ROOT / "tests" / "artifacts" / "console"
#: the operators' dashboard the plane's nodes are configured with: the page links it
DASHBOARD_URL = "https://grafana.example.test/d/convplane"
#: how long the page may take to show a state (drills detect, fail over and restore in seconds;
#: the bound is for a loaded CI machine)
PAGE_WAIT_S = 120.0
#: drills the tests abort hold long enough never to end by themselves first
LONG_HOLD_S = 300.0
KILL_HOLD_S = 8.0
TERMINAL = {"done", "aborted", "failed"}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    proc, plane = start_plane(
        tmp_path_factory.mktemp("console-plane"), env={"CONVPLANE_DASHBOARD_URL": DASHBOARD_URL}
    )
    try:
        yield plane
    finally:
        stop_plane(proc)


@pytest.fixture
def downloads(tmp_path: Path) -> Path:
    return tmp_path / "downloads"


@pytest.fixture
def browser(
    request: pytest.FixtureRequest, plane: Plane, downloads: Path
) -> Iterator[webdriver.Chrome]:
    with chromium(downloads) as driver:
        yield driver
        if request.node.stash.get(CALL_FAILED, False):
            page = Console(driver, plane, served_by="")  # reads what is shown, never signs in
            shot = page.screenshot(f"failed-{request.node.name}")
            print(f"--- the page when the test failed (screenshot {shot}) ---\n{page.account()}")
            print(plane.log_tails(lines=300))


# --- the plane, over HTTP ------------------------------------------------------------------------


def operator_call(plane: Plane, method: str, path: str, **kw: Any) -> httpx.Response:
    """The first region that answers (a drill's target may be cut off or killed)."""
    headers = {"Authorization": f"Bearer {plane.info['operator_api_key']}"}
    for url in plane.urls.values():
        try:
            r = httpx.request(method, url + path, headers=headers, timeout=10.0, **kw)
        except httpx.HTTPError:
            continue
        if r.status_code < 500:
            return r
    raise AssertionError(f"no region answered {method} {path}")


def wait_for(what: str, condition: Callable[[], bool], bound_s: float = PAGE_WAIT_S) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {bound_s:.0f} s: {what}")
        time.sleep(0.25)


def all_regions_up(plane: Plane) -> bool:
    r = operator_call(plane, "GET", "/v1/regions")
    placement = operator_call(plane, "GET", "/v1/placement").json()
    up = all(region["status"] == "up" for region in r.json()["regions"])
    return up and not placement["down"] and not placement["evacuated"]


def drill(plane: Plane, drill_id: str) -> dict[str, Any]:
    """The control shard's leader answers drill reads; while that shard is between leaders every
    region answers 503, and the read is retried."""
    body: dict[str, Any] = {}

    def answered() -> bool:
        try:
            r = operator_call(plane, "GET", f"/v1/drills/{drill_id}")
        except AssertionError:  # every region answered 503
            return False
        assert r.status_code == 200, r.text
        body.update(r.json())
        return True

    wait_for(f"an answer for drill {drill_id}", answered)
    return body


def start_drill(plane: Plane, kind: str, region: str, hold_s: float) -> str:
    wait_for("every region up before the drill", lambda: all_regions_up(plane))
    # These tests look at the page, not at the guards: loose ones, so a loaded machine's slow
    # canaries do not end the drill under the test (a CI run's did: 'restoring' mid-test).
    guards = {"max_rto_s": 600, "max_error_ratio": 1.0, "max_ack_p99_ms": 600_000}
    body = {"kind": kind, "region": region, "hold_s": hold_s, "reason": "console e2e",
            "guards": guards}  # fmt: skip
    r = operator_call(plane, "POST", "/v1/drills", json=body)
    assert r.status_code == 201, r.text
    drill_id: str = r.json()["drill_id"]
    return drill_id


def end_drill(plane: Plane, drill_id: str) -> None:
    """Abort it if it still runs (cleanup), and wait for every region to be back."""
    if drill(plane, drill_id)["phase"] not in TERMINAL:
        operator_call(plane, "POST", f"/v1/drills/{drill_id}/abort", json={"reason": "cleanup"})
    wait_for(f"drill {drill_id} ended", lambda: drill(plane, drill_id)["phase"] in TERMINAL)
    wait_for("every region back up", lambda: all_regions_up(plane))


# --- the page ------------------------------------------------------------------------------------


class Console:
    def __init__(self, driver: webdriver.Chrome, plane: Plane, served_by: str) -> None:
        self.driver = driver
        self.plane = plane
        self.served_by = served_by

    def sign_in(self, key: str) -> None:
        self.driver.get(self.plane.urls[self.served_by] + "/console")
        self.driver.find_element(By.ID, "key").send_keys(key)
        self.driver.find_element(By.ID, "signin").click()
        wait_for("the regions table filled", lambda: len(self.region_statuses()) == 3)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def region_statuses(self) -> dict[str, str]:
        statuses: dict[str, str] = self.js(
            "return Object.fromEntries([...document.querySelectorAll('#regions tr[data-region]')]"
            ".map((tr) => [tr.dataset.region, tr.dataset.status]))"
        )
        return statuses

    def text(self, element_id: str) -> str:
        text: str = self.js("return document.getElementById(arguments[0]).textContent", element_id)
        return text

    def active_drill(self) -> tuple[str, str] | None:
        found: list[str] | None = self.js(
            "const t = document.querySelector('#drill .title');"
            "return t ? [t.dataset.drill, t.dataset.phase] : null"
        )
        return None if found is None else (found[0], found[1])

    def cells_placed_on(self, region: str) -> int:
        count: int = self.js(
            'return document.querySelectorAll(`#grid .cell[data-region="${arguments[0]}"]`).length',
            region,
        )
        return count

    def all_banners(self) -> list[tuple[str, str]]:
        """(kind, text) of every banner shown, newest first."""
        shown: list[list[str]] = self.js(
            "return [...document.querySelectorAll('#banners .banner')]"
            ".map((b) => [b.dataset.kind, b.querySelector('.text').textContent])"
        )
        return [(kind, text) for kind, text in shown]

    def banners(self, kind: str) -> list[str]:
        return [text for shown_kind, text in self.all_banners() if shown_kind == kind]

    def account(self) -> str:
        """What the page shows, for a failed test's report (its banners say why an action was
        refused or never answered)."""
        return (
            f"banners {self.all_banners()}\nsource {self.text('source')!r}\n"
            f"top bar {self.text('topbar')!r}\naudit rows {sorted(self.audit_actions())}"
        )

    def click(self, selector: str) -> None:
        """A user's click (retried if the page rebuilt the button just then)."""
        for _ in range(20):
            try:
                self.driver.find_element(By.CSS_SELECTOR, selector).click()
                return
            except (StaleElementReferenceException, WebDriverException):
                time.sleep(0.1)
        raise AssertionError(f"could not click {selector}")

    def audit_actions(self) -> set[str]:
        actions: list[str] = self.js(
            "return [...document.querySelectorAll('#audit tr[data-action]')]"
            ".map((tr) => tr.dataset.action)"
        )
        return set(actions)

    def region_tags(self, region: str) -> str:
        tags: str = self.js(
            'return document.querySelector(`#regions tr[data-region="${arguments[0]}"]`)'
            ".children[1].textContent",
            region,
        )
        return tags

    def confirm(self, reason: str | None = None) -> None:
        wait_for(
            "the confirmation dialog",
            lambda: bool(self.js("return document.getElementById('confirm').open")),
        )
        if reason is not None:
            field = self.driver.find_element(By.ID, "confirm-reason")
            field.clear()
            field.send_keys(reason)
        self.click("#confirm-ok")

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        print(f"console screenshot: {path}")
        return path


def operator_page(plane: Plane, browser: webdriver.Chrome, served_by: str) -> Console:
    """An operator signed in on ``served_by``'s page, once every region is up."""
    wait_for("every region up", lambda: all_regions_up(plane))
    page = Console(browser, plane, served_by=served_by)
    page.sign_in(plane.info["operator_api_key"])
    return page


# --- the tests -----------------------------------------------------------------------------------


def test_a_viewer_sees_the_drill_and_the_server_refuses_its_abort_and_halt(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    target = "eu-west"
    drill_id = start_drill(plane, "region-loss", target, LONG_HOLD_S)
    try:
        page = Console(browser, plane, served_by="us-east")
        page.sign_in(plane.info["viewer_api_key"])
        assert "viewer" in page.text("who")
        link = browser.find_element(By.ID, "dashboard-link")
        assert link.is_displayed() and link.get_attribute("href") == DASHBOARD_URL
        wait_for("the drill shown as running", lambda: page.active_drill() is not None)
        assert page.active_drill() in {(drill_id, "injecting"), (drill_id, "holding")}
        wait_for(f"{target} shown down", lambda: page.region_statuses()[target] == "down")
        page.screenshot("viewer-drill-running")

        page.click("#abort-drill")
        page.confirm()
        wait_for("a 403 shown", lambda: any("403" in t for t in page.banners("forbidden")))
        page.click("#halt-toggle")
        page.confirm()
        wait_for("a second 403", lambda: len(page.banners("forbidden")) == 2)
        page.click('#regions tr[data-region="ap-south"] button[data-action="evacuate"]')
        page.confirm()
        wait_for("a third 403", lambda: len(page.banners("forbidden")) == 3)
        refusals = page.banners("forbidden")
        assert all("403 forbidden" in t and "read-only" in t for t in refusals), refusals
        page.screenshot("viewer-abort-refused")

        # the server changed nothing: the drill still runs, the halt is off, nothing moved or
        # was audited
        still = drill(plane, drill_id)
        assert still["phase"] in {"injecting", "holding"}, still.get("abort_reason")
        assert operator_call(plane, "GET", "/v1/admin/halt").json()["on"] is False
        assert operator_call(plane, "GET", "/v1/placement").json()["evacuated"] == []
        audit = operator_call(plane, "GET", "/v1/audit").json()["entries"]
        assert [e["action"] for e in audit if e["by"] == "sre-viewer"] == []
    finally:
        end_drill(plane, drill_id)


def test_a_tenant_key_is_turned_away_with_the_servers_answer(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    page = Console(browser, plane, served_by="us-east")
    browser.get(plane.urls["us-east"] + "/console")
    browser.find_element(By.ID, "key").send_keys(plane.info["api_key"])
    page.click("#signin")
    wait_for("the refusal shown", lambda: bool(page.banners("forbidden")))
    assert "403" in page.banners("forbidden")[0] and "tenant key" in page.banners("forbidden")[0]
    assert page.js("return document.getElementById('main').hidden") is True
    assert page.js("return sessionStorage.length") == 0  # the refused key is not kept
    assert plane.info["api_key"] not in browser.current_url


def test_an_operator_on_the_drilled_regions_page_sees_it_go_down_aborts_and_sees_it_back(
    plane: Plane, browser: webdriver.Chrome, downloads: Path
) -> None:
    target = "us-east"
    page = Console(browser, plane, served_by=target)  # the page's own node is the target
    page.sign_in(plane.info["operator_api_key"])
    wait_for("every region up", lambda: set(page.region_statuses().values()) == {"up"})
    assert page.cells_placed_on(target) > 0
    page.screenshot("operator-all-up")

    drill_id = start_drill(plane, "region-loss", target, LONG_HOLD_S)
    try:
        wait_for(f"{target} shown down", lambda: page.region_statuses()[target] == "down")
        wait_for("its shards placed elsewhere", lambda: page.cells_placed_on(target) == 0)
        # the target's own view is the cut-off side's: the page reads from a survivor
        assert page.text("source").startswith("state from ")
        assert not page.text("source").startswith(f"state from {target}")
        page.screenshot("operator-region-down")

        page.click("#abort-drill")
        page.confirm("stopped from the console test")
        wait_for("the abort accepted", lambda: bool(page.banners("ok")))
        wait_for("no drill running", lambda: page.active_drill() is None)
        wait_for(f"{target} shown up again", lambda: page.region_statuses()[target] == "up")
        wait_for("its shards back", lambda: page.cells_placed_on(target) > 0)
        row = page.js(
            'const tr = document.querySelector(`#drills tr[data-drill="${arguments[0]}"]`);'
            "return tr ? tr.textContent : null",
            drill_id,
        )
        assert row is not None and "aborted" in row
        page.click(f'#drills tr[data-drill="{drill_id}"] button')
        wait_for(
            "its report shown",
            lambda: (
                "aborted"
                in str(
                    page.js(
                        'const box = document.querySelector(`#report [data-report="${arguments[0]}"]`);'
                        "return box && box.textContent",
                        drill_id,
                    )
                )
            ),
        )
        wait_for(
            "the abort in the page's audit log",
            lambda: bool(
                page.js("return document.querySelector('#audit tr[data-action=\"drill.abort\"]')")
            ),
        )
        page.screenshot("operator-region-back")
        page.click(f'#report [data-report="{drill_id}"] button')  # Download HTML report
        report = downloads / f"drill-{drill_id}.html"
        wait_for("the HTML report downloaded", report.exists)
        assert drill_id in report.read_text() and "aborted" in report.read_text()
    finally:
        end_drill(plane, drill_id)
    body = drill(plane, drill_id)
    assert body["verdict"] == "aborted" and "stopped from the console test" in body["abort_reason"]


def test_a_page_whose_own_node_is_killed_keeps_updating_from_the_other_regions(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    target = "eu-west"
    page = Console(browser, plane, served_by=target)
    page.sign_in(plane.info["viewer_api_key"])
    drill_id = start_drill(plane, "kill", target, KILL_HOLD_S)
    try:
        wait_for(
            f"{target} unreachable from the page",
            lambda: (
                "no answer"
                in str(
                    page.js(
                        'const tr = document.querySelector(`#regions tr[data-region="${arguments[0]}"]`);'
                        "return tr && tr.querySelector('[data-field=reach]').textContent",
                        target,
                    )
                )
            ),
        )
        wait_for(f"{target} shown down", lambda: page.region_statuses()[target] == "down")
        assert f"this page's node {target} not used" in page.text("source")
        page.screenshot("kill-own-node-down")
        wait_for("the drill over", lambda: page.active_drill() is None)
        wait_for(f"{target} shown up again", lambda: page.region_statuses()[target] == "up")
        page.screenshot("kill-own-node-back")
    finally:
        end_drill(plane, drill_id)
    assert drill(plane, drill_id)["verdict"] is not None


#: the page's own fetch, wrapped: the next ``arguments[0]`` POSTs of the halt switch are answered
#: as the server answers when the control shard's quorum is lost for a moment (a loaded test
#: run's lift of the halt met exactly this, and the page gave up at once), ``retryable`` as
#: ``arguments[1]``
REFUSE_HALT_POSTS = """
const original = window.fetch;
let refusals = arguments[0];
const retryable = arguments[1];
window.fetch = (url, init) => {
  if (refusals > 0 && init && init.method === "POST" && String(url).endsWith("/v1/admin/halt")) {
    refusals -= 1;
    const error = {code: "no_quorum", retryable,
                   message: "shard 16: too few replicas answer to confirm leadership"};
    return Promise.resolve(new Response(JSON.stringify({error}), {
      status: 503, headers: {"Content-Type": "application/json", "Retry-After": "0.5"}}));
  }
  return original(url, init);
};
"""


def test_an_action_every_region_refuses_as_retryable_is_sent_again_until_accepted(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    page = operator_page(plane, browser, served_by="eu-west")
    wait_for("the halt shown off", lambda: page.text("halt-badge") == "halt off")

    # refused by every region, not retryable: the page says so and stops
    page.js(REFUSE_HALT_POSTS, 3, False)
    page.click("#halt-toggle")
    page.confirm("refused, not retryable")
    wait_for("the refusal shown", lambda: any("no_quorum" in b for b in page.banners("error")))
    assert page.banners("warn") == [] and page.banners("ok") == []

    # refused by every region twice over, retryable: sent again until a region accepts it
    page.js(REFUSE_HALT_POSTS, 6, True)
    page.click("#halt-toggle")
    page.confirm("accepted on the third round")
    wait_for("the halt shown on", lambda: page.text("halt-badge").startswith("HALT ON"))
    assert "accepted on the third round" in page.text("halt-badge")
    assert [b for b in page.banners("ok") if b.startswith("halt: accepted by")]
    assert len([b for b in page.banners("warn") if "sending it again" in b]) == 2
    r = operator_call(plane, "DELETE", "/v1/admin/halt", params={"reason": "test over"})
    assert r.status_code == 200, r.text
    wait_for("the halt shown off again", lambda: page.text("halt-badge") == "halt off")
    halts = [e for e in operator_call(plane, "GET", "/v1/audit?limit=1000").json()["entries"]
             if e["action"] == "halt.on"]  # fmt: skip
    assert [e["reason"] for e in halts] == ["accepted on the third round"]  # nothing refused landed


def test_an_operator_halts_evacuates_and_restores_from_the_page(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    page = operator_page(plane, browser, served_by="us-east")
    page.click("#halt-toggle")
    page.confirm("incident: no drills")
    wait_for("the halt shown on", lambda: page.text("halt-badge").startswith("HALT ON"))
    assert "incident: no drills" in page.text("halt-badge")
    page.click('#regions tr[data-region="ap-south"] button[data-action="evacuate"]')
    page.confirm("evacuated by the console test")
    wait_for("ap-south shown evacuated", lambda: "evacuated" in page.region_tags("ap-south"))
    wait_for("no shard placed on ap-south", lambda: page.cells_placed_on("ap-south") == 0)
    page.screenshot("operator-halt-and-evacuate")

    page.click('#regions tr[data-region="ap-south"] button[data-action="restore"]')
    page.confirm()
    wait_for(
        "ap-south no longer evacuated", lambda: "evacuated" not in page.region_tags("ap-south")
    )
    page.click("#halt-toggle")
    page.confirm()
    wait_for("the halt shown off", lambda: page.text("halt-badge") == "halt off")
    wanted = {"halt.on", "region.evacuate", "region.restore", "halt.off"}
    wait_for("the four actions in the page's audit log", lambda: wanted <= page.audit_actions())
    page.screenshot("operator-audit")
    audit = operator_call(plane, "GET", "/v1/audit?limit=1000").json()["entries"]
    evacuate = [e for e in audit if e["action"] == "region.evacuate"]
    assert [(e["by"], e["role"], e["target"], e["reason"]) for e in evacuate] == [
        ("sre", "operator", "ap-south", "evacuated by the console test")
    ]


def test_a_viewer_sees_each_regions_readiness_as_the_api_answers_it(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    """The readiness panel shows the control leader's last evaluation: every region's status
    and score as ``GET /v1/readiness`` answers them, and the plane's in the panel's title."""
    page = Console(browser, plane, served_by="eu-west")
    page.sign_in(plane.info["viewer_api_key"])

    def shown() -> dict[str, tuple[str, int]]:
        rows: list[list[Any]] = page.js(
            "return [...document.querySelectorAll('#readiness tr[data-region]')]"
            ".map((tr) => [tr.dataset.region, tr.dataset.status, Number(tr.dataset.score)])"
        )
        return {region: (status, score) for region, status, score in rows}

    def answered() -> dict[str, Any]:
        body: dict[str, Any] = operator_call(plane, "GET", "/v1/readiness").json()
        return body

    wait_for("the readiness rows", lambda: len(shown()) == 3)
    wait_for(
        "the page showing the API's evaluation",
        lambda: shown() == {r["region"]: (r["status"], r["score"]) for r in answered()["regions"]},
    )
    body = answered()
    assert page.text("readiness-meta").startswith(
        f"plane {body['status'].replace('_', ' ')} (score {body['score']})"
    )
    assert set(shown()) == set(plane.urls)
    page.screenshot("viewer-readiness")


def test_the_practice_calendar_shows_a_skip_and_its_reason(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    fired = {"firing": True, "reason": "console test alert"}
    assert operator_call(plane, "PUT", "/v1/practice/alerts/console", json=fired).status_code == 200
    every_day = [f"{d} 00:00-24:00" for d in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")]
    schedule = {"region": "eu-west", "kind": "evacuate", "windows": every_day, "hold_s": 1.0,
                "min_interval_s": 3600, "retry_after_skip_s": 3600}  # fmt: skip
    put = operator_call(plane, "PUT", "/v1/practice/schedules/console", json=schedule)
    assert put.status_code == 200, put.text
    page = operator_page(plane, browser, served_by="eu-west")

    def skip_shown() -> bool:
        rows = page.js(
            "return [...document.querySelectorAll('#practice tr[data-outcome=skipped]')]"
            ".map((r) => r.textContent)"
        )
        return any("alert 'console' firing: console test alert" in row for row in rows)

    try:
        wait_for("the skip and its reason in the practice calendar", skip_shown)
        page.screenshot("practice-calendar")
    finally:
        operator_call(plane, "DELETE", "/v1/practice/schedules/console")
        cleared = {"firing": False, "reason": "console test over"}
        operator_call(plane, "PUT", "/v1/practice/alerts/console", json=cleared)


def _operator_key(plane: Plane, name: str) -> str:
    """A new operator key the administrator (the cluster-file operator key) creates: keys in
    two lines of descent, so one may approve what the other asks for."""
    body = {"tenant_id": name, "role": "operator", "reason": f"console operator {name}"}
    r = operator_call(plane, "POST", "/v1/admin/keys", json=body)
    assert r.status_code == 201, r.text
    key: str = r.json()["api_key"]
    return key


def _practice(plane: Plane) -> dict[str, Any]:
    r = operator_call(plane, "GET", "/v1/practice")
    assert r.status_code == 200, r.text
    overview: dict[str, Any] = r.json()
    return overview


def test_a_second_operator_approves_a_run_and_edits_a_schedule_from_the_page(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    asker, approver = _operator_key(plane, "console-asker"), _operator_key(plane, "console-ok")
    policy = {"regions": None, "kinds": ["evacuate"]}
    assert (
        operator_call(plane, "PUT", "/v1/practice/approval-policy", json=policy).status_code == 200
    )
    wait_for("every region up before the run", lambda: all_regions_up(plane))
    run = httpx.post(plane.urls["us-east"] + "/v1/practice/runs", timeout=10.0,
                     headers={"Authorization": f"Bearer {asker}"},
                     json={"kind": "evacuate", "region": "eu-west", "hold_s": 1.0,
                           "reason": "console approval"})  # fmt: skip
    assert run.status_code == 201, run.text
    run_id = run.json()["run_id"]
    assert run.json()["status"] == "awaiting_approval", run.text
    try:
        wait_for("every region up", lambda: all_regions_up(plane))
        page = Console(browser, plane, served_by="us-east")
        page.sign_in(approver)
        row = f'#practice-approvals tr[data-run="{run_id}"]'
        wait_for("the run in the approvals table", lambda: bool(page.js(
            "return document.querySelector(arguments[0]) !== null", row)))  # fmt: skip
        page.screenshot("practice-approval")
        page.click(f'{row} button[data-action="approve"]')
        page.confirm()

        def status() -> str:
            runs = [r for r in _practice(plane)["runs"] if r["run_id"] == run_id]
            return str(runs[0]["status"])

        wait_for("the run approved and started", lambda: status() == "ran")
        done = next(r for r in _practice(plane)["runs"] if r["run_id"] == run_id)
        assert done["approved_by"] == "console-ok", done
        audit = operator_call(plane, "GET", "/v1/audit", params={"limit": 1000}).json()["entries"]
        assert ("practice.approve", "console-ok") in [(e["action"], e["by"]) for e in audit]
        wait_for("the row gone", lambda: not page.js(
            "return document.querySelector(arguments[0]) !== null", row))  # fmt: skip
        ended = lambda: drill(plane, done["drill_id"])["phase"] in TERMINAL  # noqa: E731
        wait_for("the approved run's drill over (hold 1 s)", ended)
        wait_for("every region back up", lambda: all_regions_up(plane))

        # a schedule written, edited and deleted from the form; it needs approval, so it
        # never starts a drill whatever the day
        page.driver.find_element(By.ID, "schedule-id").send_keys("console-weekly")
        wait_for("regions in the form", lambda: page.js(
            "return document.getElementById('schedule-region').options.length") == 3)  # fmt: skip
        page.js("document.getElementById('schedule-region').value = 'ap-south'")
        page.driver.find_element(By.ID, "schedule-windows").send_keys(
            "sat 01:00-02:00, sun 01:00-02:00"
        )
        page.driver.find_element(By.ID, "schedule-approval").click()
        page.click("#schedule-save")

        def schedule() -> dict[str, Any] | None:
            found = [
                s for s in _practice(plane)["schedules"] if s["schedule_id"] == "console-weekly"
            ]
            return found[0] if found else None

        wait_for("the schedule saved", lambda: schedule() is not None)
        saved = schedule()
        assert saved is not None
        assert (saved["region"], saved["kind"], saved["hold_s"], saved["min_interval_s"],
                saved["needs_approval"], saved["by"]) == (
            "ap-south", "evacuate", 60.0, 168 * 3600.0, True, "console-ok")  # fmt: skip
        assert saved["windows"] == ["sat 01:00-02:00", "sun 01:00-02:00"], saved
        # what the form does not show, set through the API: an edit from the page keeps it
        hidden = {"chance": 0.5, "guards": {"max_rto_s": 30.0, "max_error_ratio": 0.5,
                                            "max_ack_p99_ms": 9000.0}}  # fmt: skip
        fields = ("region", "kind", "windows", "hold_s", "min_interval_s", "needs_approval")
        put = operator_call(plane, "PUT", "/v1/practice/schedules/console-weekly",
                            json={**{f: saved[f] for f in fields}, **hidden})  # fmt: skip
        assert put.status_code == 200, put.text
        srow = '#practice-schedules tr[data-schedule="console-weekly"]'
        wait_for("the page showing the API's change", lambda: "chance 50 %" in (page.js(
            "const r = document.querySelector(arguments[0]); return r ? r.textContent : ''",
            srow) or ""))  # fmt: skip
        wait_for("the schedule listed", lambda: bool(page.js(
            "return document.querySelector(arguments[0]) !== null", srow)))  # fmt: skip
        page.click(f'{srow} button[data-action="edit"]')
        hold = page.driver.find_element(By.ID, "schedule-hold")
        hold.clear()
        hold.send_keys("2")
        page.click("#schedule-save")
        wait_for("the edit saved", lambda: (schedule() or {}).get("hold_s") == 2.0)
        edited = schedule()
        assert edited is not None and edited["needs_approval"], edited
        assert edited["windows"] == saved["windows"], edited
        assert (edited["chance"], edited["guards"]) == (0.5, hidden["guards"]), edited
        page.screenshot("practice-schedules")
        page.click(f'{srow} button[data-action="delete"]')
        page.confirm()
        wait_for("the schedule deleted", lambda: schedule() is None)
    finally:
        operator_call(plane, "PUT", "/v1/practice/approval-policy", json={})
        operator_call(plane, "DELETE", "/v1/practice/schedules/console-weekly")


def test_an_operator_sets_the_approval_policy_and_a_keys_blast_radius_from_the_page(
    plane: Plane, browser: webdriver.Chrome
) -> None:
    page = operator_page(plane, browser, served_by="eu-west")
    box = 'input[data-group="{}"][value="{}"]'
    try:
        wait_for("the policy's boxes", lambda: bool(page.js(
            "return document.querySelector(arguments[0]) !== null",
            box.format("policy-kinds", "kill"))))  # fmt: skip
        page.click(box.format("policy-kinds", "kill"))
        page.click(box.format("policy-regions", "ap-south"))
        page.click("#policy-save")
        wanted = {"regions": ["ap-south"], "kinds": ["kill"]}
        wait_for("the policy saved", lambda: _practice(plane)["approval_policy"] == wanted)
        wait_for("the policy shown", lambda: "ap-south, kill" in page.text("policy-now"))

        page.driver.find_element(By.ID, "scope-key").send_keys("console-scoped")
        page.click(box.format("scope-regions", "us-east"))
        page.click(box.format("scope-kinds", "evacuate"))
        page.click("#scope-save")
        scoped = {"regions": ["us-east"], "kinds": ["evacuate"]}
        wait_for("the scope saved",
                 lambda: _practice(plane)["scopes"].get("console-scoped") == scoped)  # fmt: skip
        row = '#practice-scopes tr[data-key="console-scoped"]'
        wait_for("the scope listed", lambda: bool(page.js(
            "return document.querySelector(arguments[0]) !== null", row)))  # fmt: skip
        page.screenshot("practice-policy-and-scopes")
        page.click(f'{row} button[data-action="edit-scope"]')  # the form takes its boxes
        page.click(box.format("scope-kinds", "evacuate"))  # untick: any kind
        page.click("#scope-save")
        widened = {"regions": ["us-east"], "kinds": None}
        wait_for("the scope widened",
                 lambda: _practice(plane)["scopes"].get("console-scoped") == widened)  # fmt: skip
        audit = operator_call(plane, "GET", "/v1/audit", params={"limit": 1000}).json()["entries"]
        actions = {e["action"] for e in audit}
        assert {"practice.policy", "practice.scope"} <= actions, actions
    finally:
        operator_call(plane, "PUT", "/v1/practice/approval-policy", json={})
        operator_call(plane, "PUT", "/v1/practice/scopes/console-scoped", json={})
