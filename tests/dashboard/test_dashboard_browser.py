"""The dashboard in a real headless browser: Debian's chromium (/usr/bin/chromium) driven by Playwright,
never a downloaded browser, against a real master with agents (tests/dashboard/conftest.py).

Login through the form; every page shows what the API says to the same token; a job submitted through
the API appears on the open queue page without a reload; a user cannot see another tenant's job; an
admin drains and undrains a node and cancels a job with the buttons; no page logs a console error; the
layout fits a phone's width. Screenshots of every page go to `tmp_path / "screenshots"`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.conftest import Dash, job

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


class Tab:
    """One logged-in browser context and page, collecting console errors and page errors."""

    def __init__(self, browser: Any, dash: Dash, user: str, shots: Path, width: int = 1280) -> None:
        self.dash = dash
        self.shots = shots
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(20_000)
        self.page.on(
            "console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None
        )
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.goto(dash.url + "/")
        assert self.page.url.endswith("/ui/login")
        self.page.fill("input[name=token]", dash.tokens[user])
        self.page.click("button[type=submit]")
        self.page.wait_for_url(dash.url + "/")

    def open(self, path: str, shot: str) -> Any:
        self.page.goto(self.dash.url + path)
        self.page.wait_for_selector("#live.on")  # the event stream is connected
        self.page.screenshot(path=str(self.shots / f"{shot}.png"), full_page=True)
        return self.page

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    return folder


def texts(page: Any, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_inner_texts()]


def test_pages_show_what_the_api_says_and_a_submission_appears_live(
    browser: Any, dash: Dash, shots: Path
) -> None:
    ana = dash.tokens["ana"]
    tab = Tab(browser, dash, "ana", shots)
    page = tab.open("/", "cluster")
    for node in dash.api("GET", "/api/v1/nodes", token=ana)["nodes"]:
        card = page.locator(f"#node-{node['id']}")
        assert node["health"] in card.inner_text()
        assert card.locator("li.gpu").count() == node["gpus"]
        assert ("emulated devices" in card.inner_text()) == node["emulated"]
    assert page.locator("button", has_text="Drain").count() == 0  # a user gets no admin buttons

    page = tab.open("/ui/queue", "queue-before")
    page.evaluate("window.notReloaded = true")
    submitted = dash.api("POST", "/api/v1/jobs", job(300_000, "vision", [1], "live-one"), ana)["id"]
    page.wait_for_selector(f"table.queue a[href='/ui/jobs/{submitted}']")
    assert page.evaluate("window.notReloaded") is True  # it came by the event stream, not a reload
    page.screenshot(path=str(shots / "queue-after.png"), full_page=True)
    waiting = dash.api("GET", "/api/v1/jobs?state=PENDING&state=PROFILING&state=QUEUED", token=ana)["jobs"]
    shown = set(texts(page, "table.queue tbody td:nth-child(2)"))
    assert {j["id"] for j in waiting} <= shown | {"nothing"} and submitted in shown

    page = tab.open("/ui/tenants", "tenants")
    rows = texts(page, "table.tenants tbody td:first-child")
    assert rows == [t["name"] for t in dash.api("GET", "/api/v1/tenants", token=ana)["tenants"]] == ["vision"]

    page = tab.open("/ui/scheduler", "scheduler")
    # a round may land between the page and the API call (fragment plans follow the submission): then
    # the page is loaded again until both show the same latest round
    deadline = time.monotonic() + 10
    while True:
        last = dash.api("GET", "/api/v1/cluster", token=ana)["last_round"]
        shown_facts = page.locator("dl.facts").inner_text()
        if (last is not None and last["method"] in shown_facts) or time.monotonic() > deadline:
            break
        page.wait_for_timeout(200)
        page.reload()
    assert last is not None and last["method"] in shown_facts

    done = dash.api("POST", "/api/v1/jobs", job(40, "vision", [1], "short"), ana)["id"]
    page = tab.open(f"/ui/jobs/{done}", "job")
    page.wait_for_selector("h1 .s-completed", timeout=90_000)  # live: the page follows the job to its end
    detail = dash.api("GET", f"/api/v1/jobs/{done}", token=ana)
    page.wait_for_function(
        "n => document.querySelectorAll('table.attempts tbody tr').length === n", arg=len(detail["attempts"])
    )
    logs = dash.api("GET", f"/api/v1/jobs/{done}/logs", token=ana)["log"]
    assert "final checksum" in logs
    page.wait_for_function("() => document.getElementById('log').textContent.includes('final checksum')")
    assert page.locator("svg.timeline rect").count() == len(detail["attempts"])
    page.screenshot(path=str(shots / "job-done.png"), full_page=True)
    dash.api("POST", f"/api/v1/jobs/{submitted}/cancel", token=ana)
    tab.close()
    assert not tab.errors, tab.errors
    assert {p.name for p in shots.iterdir()} >= {"cluster.png", "queue-after.png", "job-done.png"}


def test_a_user_cannot_see_another_tenants_job(browser: Any, dash: Dash, shots: Path) -> None:
    theirs = dash.api("POST", "/api/v1/jobs", job(300_000, "nlp", [1], "bo-private"), dash.tokens["bo"])["id"]
    tab = Tab(browser, dash, "ana", shots)
    for path in ("/ui/queue", "/"):  # waiting or running: ana sees neither its id nor its name
        page = tab.open(path, "ana" + path.replace("/", "-"))
        assert theirs not in page.content() and "bo-private" not in page.content()
    before = len(tab.errors)
    answer = page.goto(dash.url + f"/ui/jobs/{theirs}")
    assert answer.status == 404 and "no job" in page.locator("main").inner_text()
    expected = tab.errors[before:]  # the browser logs the 404 itself: the one error this test wants
    assert all("status of 404" in x for x in expected), expected
    del tab.errors[before:]
    page.screenshot(path=str(shots / "ana-other-tenant-job.png"))
    bo = Tab(browser, dash, "bo", shots)
    assert "bo-private" in bo.open(f"/ui/jobs/{theirs}", "bo-job").locator("h1").inner_text()
    dash.api("POST", f"/api/v1/jobs/{theirs}/cancel", token=dash.tokens["bo"])
    tab.close()
    bo.close()
    assert not tab.errors and not bo.errors, tab.errors + bo.errors


def test_an_admin_drains_a_node_and_cancels_a_job(browser: Any, dash: Dash, shots: Path) -> None:
    tab = Tab(browser, dash, "admin", shots)
    page = tab.open("/", "admin-cluster")
    page.locator("#node-n2 button", has_text="Drain").click()
    page.wait_for_selector("#node-n2 .badge.drained")
    assert dash.api("GET", "/api/v1/nodes/n2")["drained"] is True
    page.screenshot(path=str(shots / "admin-drained.png"), full_page=True)
    page.locator("#node-n2 button", has_text="Undrain").click()
    page.wait_for_selector("#node-n2 button:text('Drain')")
    assert dash.api("GET", "/api/v1/nodes/n2")["drained"] is False
    victim = dash.api("POST", "/api/v1/jobs", job(300_000, "nlp", [1], "to-cancel"), dash.tokens["bo"])["id"]
    page = tab.open(f"/ui/jobs/{victim}", "admin-job")
    page.locator("button", has_text="Cancel job").click()
    page.wait_for_selector("h1 .s-cancelled")
    assert dash.api("GET", f"/api/v1/jobs/{victim}")["state"] == "CANCELLED"
    tab.close()
    assert not tab.errors, tab.errors


def test_pages_fit_a_phones_width(browser: Any, dash: Dash, shots: Path) -> None:
    tab = Tab(browser, dash, "admin", shots, width=390)
    for path, name in (
        ("/", "phone-cluster"),
        ("/ui/queue", "phone-queue"),
        ("/ui/scheduler", "phone-scheduler"),
    ):
        page = tab.open(path, name)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, (path, overflow)
    tab.close()
    assert not tab.errors, tab.errors
