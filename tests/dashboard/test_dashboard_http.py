"""The dashboard over plain HTTP, as a browser and as a script send it: login and the session cookie's
attributes, bearer tokens, CSRF and cross-site refusals, what each token may see and do, and the
server-sent event stream. A real master with real agents (tests/dashboard/conftest.py)."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tests.dashboard.conftest import Browserish, Dash, job


def login(dash: Dash, user: str) -> Browserish:
    b = dash.browser()
    answer = b.request("POST", "/ui/login", {"token": dash.tokens[user]})
    assert answer.status == 303 and answer.headers["Location"] == "/", answer.text
    return b


def csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF field on the page"
    return match.group(1)


def test_login_gives_a_strict_httponly_cookie_and_pages_need_it(dash: Dash) -> None:
    b = dash.browser()
    assert b.request("GET", "/").status == 303
    assert b.request("GET", "/ui/queue").headers["Location"] == "/ui/login"
    assert b.request("GET", "/ui/events/").status == 401
    bad = b.request("POST", "/ui/login", {"token": "x" * 43})
    assert bad.status == 401 and "unknown token" in bad.text
    assert b.request("POST", "/ui/login", {"token": ""}).status == 400
    answer = b.request("POST", "/ui/login", {"token": dash.tokens["ana"]})
    cookie = answer.headers["Set-Cookie"]
    assert answer.status == 303
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert dash.tokens["ana"] not in cookie  # the cookie names a session, never the token
    page = b.request("GET", "/ui/tenants")
    assert page.status == 200 and "ana · vision · user" in page.text
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    logout = b.request("POST", "/ui/logout", {"csrf": csrf(page.text)})
    assert logout.status == 303 and logout.headers["Location"] == "/ui/login"
    assert b.request("GET", "/ui/tenants").status == 303


def test_a_script_may_send_a_bearer_token(dash: Dash) -> None:
    b = dash.browser()
    page = b.request("GET", "/ui/tenants", headers={"Authorization": f"Bearer {dash.tokens['bo']}"})
    api = dash.api("GET", "/api/v1/tenants", token=dash.tokens["bo"])["tenants"]
    assert page.status == 200 and [t["name"] for t in api] == ["nlp"]
    assert ">nlp<" in page.text and ">vision<" not in page.text
    assert re.search(r"<td>k80 \d+ used, cap 2</td>", page.text), page.text  # the cap per GPU type
    assert 'name="csrf"' not in page.text  # no forms without a session
    denied = b.request("GET", "/ui/queue", headers={"Authorization": "Bearer " + "y" * 43})
    assert denied.status == 401 and "unknown token" in denied.text
    assert b.request("GET", "/ui/queue", headers={"Authorization": "Basic eDp5"}).status == 401


def test_a_user_sees_only_what_the_api_shows_them(dash: Dash) -> None:
    theirs = dash.api("POST", "/api/v1/jobs", job(200_000, "nlp", name="bo-secret"), dash.tokens["bo"])["id"]
    mine = dash.api("POST", "/api/v1/jobs", job(200_000, "vision", name="ana-own"), dash.tokens["ana"])["id"]
    ana = login(dash, "ana")
    for path in ("/", "/ui/queue", "/ui/tenants", "/ui/scheduler"):
        page = ana.request("GET", path)
        assert page.status == 200 and theirs not in page.text and "bo-secret" not in page.text, path
    assert mine in ana.request("GET", "/ui/queue").text
    hidden = ana.request("GET", f"/ui/jobs/{theirs}")
    assert hidden.status == 404 and f"no job {theirs!r}" in html.unescape(hidden.text)
    assert ana.request("GET", f"/ui/jobs/{mine}").status == 200
    bo = login(dash, "bo")
    assert theirs in bo.request("GET", "/ui/queue").text and mine not in bo.request("GET", "/ui/queue").text
    for j, token in ((theirs, "bo"), (mine, "ana")):
        dash.api("POST", f"/api/v1/jobs/{j}/cancel", token=dash.tokens[token])


def test_actions_need_the_csrf_secret_the_same_origin_and_the_apis_permission(dash: Dash) -> None:
    admin = login(dash, "admin")
    page = admin.request("GET", "/")
    secret = csrf(page.text)
    assert admin.request("POST", "/ui/nodes/n2/drain", {}).status == 403
    assert admin.request("POST", "/ui/nodes/n2/drain", {"csrf": "wrong"}).status == 403
    other = admin.request("POST", "/ui/nodes/n2/drain", {"csrf": secret}, {"Origin": "http://evil.example"})
    assert other.status == 403
    assert dash.api("GET", "/api/v1/nodes/n2")["drained"] is False
    done = admin.request("POST", "/ui/nodes/n2/drain", {"csrf": secret})
    assert done.status == 303 and dash.api("GET", "/api/v1/nodes/n2")["drained"] is True
    assert "Undrain" in admin.request("GET", "/").text
    assert admin.request("POST", "/ui/nodes/n2/undrain", {"csrf": secret}).status == 303
    assert dash.api("GET", "/api/v1/nodes/n2")["drained"] is False
    ana = login(dash, "ana")
    refused = ana.request(
        "POST", "/ui/nodes/n2/drain", {"csrf": csrf(ana.request("GET", "/ui/tenants").text)}
    )
    assert refused.status == 403 and "admin" in refused.text
    assert dash.api("GET", "/api/v1/nodes/n2")["drained"] is False
    assert "Drain" not in ana.request("GET", "/").text  # no admin buttons for a user
    # a script cancels with its bearer token (no cookie, so no CSRF secret needed)
    j = dash.api("POST", "/api/v1/jobs", job(200_000, "vision"), dash.tokens["ana"])["id"]
    bearer = {"Authorization": f"Bearer {dash.tokens['ana']}"}
    assert dash.browser().request("POST", f"/ui/jobs/{j}/cancel", {}, bearer).status == 303
    assert dash.api("GET", f"/api/v1/jobs/{j}")["state"] == "CANCELLED"


def test_events_stream_the_page_and_end_with_the_session(dash: Dash) -> None:
    b = login(dash, "ana")
    request = urllib.request.Request(dash.url + "/ui/events/ui/queue")
    with b.opener.open(request, timeout=20) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        lines = []
        while not (lines and lines[-1] == "" and any(x.startswith("event: main") for x in lines)):
            lines.append(stream.readline().decode().rstrip("\n"))
        body = "\n".join(x.removeprefix("data: ") for x in lines if x.startswith("data: "))
        assert "<h1>Queue</h1>" in body
    assert b.request("GET", "/ui/events/ui/nowhere").status == 404


def test_forecasts_reach_the_api_explain_and_the_queue_page(dash: Dash) -> None:
    ana = dash.tokens["ana"]
    # two jobs hold both nodes' two GPUs, a third waits for them (all long: no preemption in the test)
    # (the three are alike: which two the plan starts is its choice)
    ids = [dash.api("POST", "/api/v1/jobs", job(300_000, "vision", [2]), ana)["id"] for _ in range(3)]

    def states() -> dict[str, str]:
        return {j: dash.api("GET", f"/api/v1/jobs/{j}", token=ana)["state"] for j in ids}

    def placed() -> bool:
        return sorted(states().values()) == ["QUEUED", "RUNNING", "RUNNING"]

    dash.cluster.wait(placed, 90, "two jobs running on the four GPUs, one waiting")
    waiting = next(j for j, state in states().items() if state == "QUEUED")

    def forecast() -> Any:
        return dash.api("GET", f"/api/v1/jobs/{waiting}", token=ana)["forecast"]

    placed_at = time.time()

    def fresh() -> bool:  # a forecast made after the two started (one made before says they wait)
        f = forecast()
        return bool(f and f["start_p50"] and f["made"] > placed_at)

    dash.cluster.wait(fresh, 120, "a start forecast")
    f = forecast()
    # the futures plan first when the round loop next ticks (set at each tick, a round ahead)
    due = dash.cluster.master.ctl.next_round_at
    assert due is not None and time.time() - 5 < due <= time.time() + 2 + 0.5
    assert f["futures"] >= 3 and f["start_p10"] <= f["start_p50"] <= f["start_p90"]
    # >=, not >: the futures' greedy plan may start the waiting job at once where the live planner keeps
    # the running ones (their preemption does not pay): the forecasts' known bias, docs/benchmarks.md
    assert f["start_p50"] >= f["made"] and f["finish_p50"] > f["start_p50"]
    assert (
        dash.api("GET", f"/api/v1/jobs/{waiting}/explain", token=ana)["forecast"]["futures"] == f["futures"]
    )
    first = next(
        d["forecast"]
        for d in (dash.api("GET", f"/api/v1/jobs/{j}", token=ana) for j in ids)
        if d["state"] == "RUNNING" and d["forecast"] is not None
    )
    assert first["start_p50"] is None and first["finish_p50"] is not None  # running: only its end
    page = dash.browser().request("GET", "/ui/queue", headers={"Authorization": f"Bearer {ana}"}).text
    row = next(r for r in page.split("<tr>") if f"/ui/jobs/{waiting}" in r)
    assert "in " in row and "P90" in row
    running = next(j for j, state in states().items() if state == "RUNNING")
    what_ifs_answer_and_store_nothing(dash, waiting, running)
    for j in ids:
        dash.api("POST", f"/api/v1/jobs/{j}/cancel", token=ana)


def refused(
    dash: Dash, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    try:
        dash.api(method, path, body, token)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)["error"]
    raise AssertionError(f"{method} {path} was not refused")


def what_ifs_answer_and_store_nothing(dash: Dash, waiting: str, running: str) -> None:
    """`submit --dry-run` and `explain --gpus`, over the API and through the CLI, on a live queue."""
    ana, bo = dash.tokens["ana"], dash.tokens["bo"]
    stored = [j["id"] for j in dash.api("GET", "/api/v1/jobs?limit=1000")["jobs"]]
    dry = dash.api("POST", "/api/v1/forecasts", job(300_000, "vision", [2], name="maybe"), ana)
    assert (dry["tenant"], dry["user"], dry["name"], dry["gpus"]) == ("vision", "ana", "maybe", [2])
    f = dry["forecast"]
    assert f is not None and f["futures"] >= 1, dry  # it borrows the speed of ana's jobs alike
    assert f["made"] <= f["start_p50"] < f["finish_p50"]
    assert f["start_p90"] is None or f["start_p50"] <= f["start_p90"]
    assert [j["id"] for j in dash.api("GET", "/api/v1/jobs?limit=1000")["jobs"]] == stored  # nothing stored
    # checked as a submission is: the same refusals, naming the field
    assert refused(dash, "POST", "/api/v1/forecasts", job(10, "vision", [64]), ana)[1]["field"] == "gpus"
    assert refused(dash, "POST", "/api/v1/forecasts", job(10, "vision"), bo)[:1] == (403,)
    assert refused(dash, "POST", "/api/v1/forecasts", {"gpus": [1]}, ana)[0] == 400
    for path in ("/api/v1/forecasts", "/api/v1/jobs"):  # limits where no account would enforce them
        for limit in ({"mem_mb": 512}, {"cpus": 1.0}):
            code, error = refused(dash, "POST", path, {**job(10, "vision"), **limit}, ana)
            assert (code, error["field"]) == (422, next(iter(limit))), (path, error)
    # the waiting job, had it asked for one GPU: one is free sooner than two
    one = dash.api("GET", f"/api/v1/jobs/{waiting}/explain?gpus=1", token=ana)
    assert one["what_if"]["gpus"] == [1] and one["what_if"]["forecast"]["start_p50"] is not None
    assert dash.api("GET", f"/api/v1/jobs/{waiting}/explain", token=ana)["what_if"] is None
    assert dash.api("GET", f"/api/v1/jobs/{waiting}", token=ana)["gpus"] == [2]  # unchanged
    for gpus, status in (("0", 400), ("2,x", 400), ("64", 422)):
        code, error = refused(dash, "GET", f"/api/v1/jobs/{waiting}/explain?gpus={gpus}", token=ana)
        assert (code, error["field"]) == (status, "gpus"), (gpus, error)
    assert refused(dash, "GET", f"/api/v1/jobs/{running}/explain?gpus=1", token=ana)[0] == 409
    assert refused(dash, "GET", f"/api/v1/jobs/{waiting}/explain?gpus=1", token=bo)[0] == 404
    # the CLI
    env = {"HOPSMGR_URL": dash.url, "HOPSMGR_TOKEN": ana, "PATH": os.environ["PATH"]}
    command = [sys.executable, "-m", "hopsmgr.cli.main"]
    submit = [*command, "submit", "--dry-run", "--gpus", "2", "--batch-size", "16", "--iters", "300000"]
    out = subprocess.run(
        [*submit, "--", "python", "train.py"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert (
        "nothing was submitted" in out.stdout
        and "forecast start:" in out.stdout
        and "sampled futures" in out.stdout
    )
    out = subprocess.run(
        [*command, "explain", waiting, "--gpus", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "with 1 GPUs: start:" in out.stdout, (out.stdout, out.stderr)
    assert [j["id"] for j in dash.api("GET", "/api/v1/jobs?limit=1000")["jobs"]] == stored
