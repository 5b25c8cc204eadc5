"""The HTTP client and the commands against a real (tiny, canned) aiohttp master on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from aiohttp import web

from hopsmgr.cli import commands
from hopsmgr.cli.client import ApiClient, ApiError, MasterUnreachable

from .conftest import GOOD_TOKEN, FakeMaster, Result, Seen


def auth(url: str) -> list[str]:
    return ["--url", url, "--token", GOOD_TOKEN]


def test_get_sends_bearer_and_repeats_list_params(master: FakeMaster) -> None:
    doc = ApiClient(master.url + "/", GOOD_TOKEN).get(
        "/api/v1/jobs", {"tenant": "vision", "state": ["QUEUED", "RUNNING"], "user": None}
    )
    assert [j["id"] for j in doc["jobs"]] == ["j-000001", "j-000002"]
    seen = master.requests[0]
    assert seen.headers["Authorization"] == f"Bearer {GOOD_TOKEN}"
    assert (seen.method, seen.path) == ("GET", "/api/v1/jobs")
    assert seen.query == [("tenant", "vision"), ("state", "QUEUED"), ("state", "RUNNING")]


def test_post_sends_json_body(master: FakeMaster) -> None:
    doc = ApiClient(master.url, GOOD_TOKEN).post(
        "/api/v1/tokens", {"user": "ana", "tenant": "v", "admin": False}
    )
    assert doc["token"] == "new-secret"
    assert master.requests[0].body == {"user": "ana", "tenant": "v", "admin": False}
    assert master.requests[0].headers["Content-Type"] == "application/json"


def test_error_body_becomes_api_error_with_field(master: FakeMaster) -> None:
    client = ApiClient(master.url, GOOD_TOKEN)
    with pytest.raises(ApiError) as info:
        client.post("/api/v1/jobs", {"command": ["x"], "gpus": [64], "batch_size": 1, "iterations": 1})
    assert (info.value.status, info.value.field) == (422, "gpus")
    assert str(info.value) == "gpus: the cluster has 32 GPUs, the job asks for 64"


def test_error_without_field_and_non_json_error(master: FakeMaster) -> None:
    with pytest.raises(ApiError) as info:
        ApiClient(master.url, "wrong").get("/api/v1/jobs")
    assert (info.value.status, info.value.field, str(info.value)) == (401, None, "missing or unknown token")
    with pytest.raises(ApiError) as info:
        ApiClient(master.url, GOOD_TOKEN).get("/broken")
    assert info.value.status == 500 and "HTTP 500" in str(info.value)


def test_connection_refused_is_a_clear_message(refused_url: str) -> None:
    with pytest.raises(MasterUnreachable) as info:
        ApiClient(refused_url, GOOD_TOKEN).get("/api/v1/jobs")
    assert str(info.value).startswith(f"cannot reach the master at {refused_url}: ")
    assert info.value.status == 0


def test_timeout_is_a_clear_message(master: FakeMaster) -> None:
    with pytest.raises(MasterUnreachable, match="no answer from the master"):
        ApiClient(master.url, GOOD_TOKEN, timeout=0.2).get("/slow")


def test_submit_prints_only_the_id(cli: Callable[..., Result], master: FakeMaster) -> None:
    code, out, err = cli(
        "submit", *auth(master.url), "--gpus", "2-8", "--batch-size", "32", "--iters", "500",
        "--env", "NCCL_DEBUG=INFO", "--", "python", "train.py", "--epochs", "3",
    )  # fmt: skip
    assert (code, out, err) == (0, "j-000007\n", "")
    assert master.requests[0].body == {
        "command": ["python", "train.py", "--epochs", "3"],
        "gpus": [2, 4, 6, 8],
        "batch_size": 32,
        "iterations": 500,
        "env": {"NCCL_DEBUG": "INFO"},
    }


@pytest.mark.parametrize(
    ("options", "command", "warned"),
    [
        ((), (".venv/bin/python", "train.py"), True),  # resolved in the attempt directory: not found
        (("--workdir", "/srv/lab"), (".venv/bin/python", "train.py"), False),
        ((), ("/usr/bin/python3", "train.py"), False),
        ((), ("python", "train.py"), False),  # looked up on PATH
    ],
)
def test_submit_warns_of_a_relative_command_path_without_workdir(
    cli: Callable[..., Result],
    master: FakeMaster,
    options: tuple[str, ...],
    command: tuple[str, ...],
    warned: bool,
) -> None:
    code, out, err = cli(
        "submit", *auth(master.url), "--gpus", "1", "--batch-size", "8", "--iters", "10", *options, "--", *command
    )  # fmt: skip
    assert (code, out) == (0, "j-000007\n")
    assert ("warning: '.venv/bin/python' is a relative path and no --workdir" in err) is warned
    assert master.requests[0].body["command"] == list(command)  # submitted all the same


def test_submit_json_prints_the_api_answer(cli: Callable[..., Result], master: FakeMaster) -> None:
    code, out, _ = cli("submit", *auth(master.url), "--json", "--gpus", "4", "--batch-size", "8",
                       "--samples", "100", "--", "x")  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["id"] == "j-000007" and doc["state"] == "PENDING" and doc["gpus"] == [4]


def test_api_error_exits_1_with_field(cli: Callable[..., Result], master: FakeMaster) -> None:
    code, out, err = cli(
        "submit", *auth(master.url), "--gpus", "64", "--batch-size", "8", "--iters", "1", "--", "x"
    )
    assert (code, out) == (1, "")
    assert err == "error: gpus: the cluster has 32 GPUs, the job asks for 64\n"
    code, _, err = cli("cancel", *auth(master.url), "j-404")
    assert code == 1 and err == "error: id: no job j-404\n"


def test_unreachable_master_exits_1(cli: Callable[..., Result], refused_url: str) -> None:
    code, out, err = cli("nodes", "--url", refused_url, "--token", "t")
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot reach the master at {refused_url}: ")


def test_queue_default_states_and_all(cli: Callable[..., Result], master: FakeMaster) -> None:
    code, out, _ = cli("queue", *auth(master.url), "--tenant", "vision")
    assert code == 0
    assert out.splitlines()[0].split() == ["POS", "ID", "NAME", "USER", "TENANT", "STATE", "GPUS", "PLACEMENT",
                                           "LR", "EST.WAIT", "START.P50/P90", "PROGRESS"]  # fmt: skip
    assert out.splitlines()[1].split()[:2] == ["1", "j-000002"]
    states = [v for k, v in master.requests[0].query if k == "state"]
    assert states == ["PENDING", "PROFILING", "QUEUED", "LAUNCHING", "RUNNING", "CHECKPOINTING"]
    assert ("tenant", "vision") in master.requests[0].query
    cli("queue", *auth(master.url), "--all")
    assert master.requests[1].query == []
    cli("queue", *auth(master.url), "--all", "--user", "ana")
    assert master.requests[2].query == [("user", "ana")]


def test_queue_json_is_the_raw_answer(cli: Callable[..., Result], master: FakeMaster) -> None:
    code, out, _ = cli("queue", *auth(master.url), "--json")
    assert code == 0
    assert [j["id"] for j in json.loads(out)["jobs"]] == ["j-000001", "j-000002"]


def test_logs_tail_and_cancel_and_token(cli: Callable[..., Result], master: FakeMaster) -> None:
    master.log_polls = 3
    code, out, _ = cli("logs", *auth(master.url), "j-000001", "--tail", "14")
    assert (code, out) == (0, "2\nstep 3\ndone\n")
    assert master.requests[0].query == [("tail", "14")]
    code, out, _ = cli("cancel", *auth(master.url), "j-000001")
    assert (code, out) == (0, "j-000001: CANCELLED\n")
    # several ids: each is cancelled in turn, one refused does not stop the others (exit 1), twice is once
    master.requests.clear()
    code, out, err = cli("cancel", *auth(master.url), "j-000001", "j-404", "j-000002", "j-000001")
    assert (code, out) == (1, "j-000001: CANCELLED\nj-000002: CANCELLED\n")
    assert err == "error: id: no job j-404\n"
    assert [r.path for r in master.requests] == [
        f"/api/v1/jobs/{j}/cancel" for j in ("j-000001", "j-404", "j-000002")
    ]
    # --json: one job's answer as it is, several as one list (the refused one left out)
    code, out, _ = cli("cancel", *auth(master.url), "--json", "j-000001")
    assert code == 0 and json.loads(out)["id"] == "j-000001"
    code, out, _ = cli("cancel", *auth(master.url), "--json", "j-000001", "j-404", "j-000002")
    assert code == 1 and [d["id"] for d in json.loads(out)] == ["j-000001", "j-000002"]
    code, out, _ = cli("token", "create", *auth(master.url), "--user", "bo", "--tenant", "nlp", "--admin")
    assert (code, out) == (0, "new-secret\n")
    assert master.requests[-1].body == {"user": "bo", "tenant": "nlp", "admin": True}


def test_logs_follow_prints_only_new_output_until_the_job_ends(
    cli: Callable[..., Result], master: FakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "FOLLOW_INTERVAL_S", 0.01)
    code, out, err = cli("logs", *auth(master.url), "j-000001", "-f")
    assert (code, err) == (0, "")
    assert out == "step 1\nstep 2\nstep 3\ndone\n"
    assert master.log_polls == 5  # the last read follows the COMPLETED state


def test_logs_follow_ctrl_c_exits_0(
    cli: Callable[..., Result], master: FakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands.time, "sleep", interrupt)
    code, out, _ = cli("logs", *auth(master.url), "j-000001", "--follow")
    assert (code, out) == (0, "step 1\n")


@pytest.mark.parametrize(
    ("argv", "method", "path", "first_line"),
    [
        (["show", "j-000001"], "GET", "/api/v1/jobs/j-000001", "id:            j-000001"),
        (["explain", "j/1"], "GET", "/api/v1/jobs/j%2F1/explain", "job j/1"),
        (
            ["nodes"],
            "GET",
            "/api/v1/nodes",
            "ID      TYPE  GPUS  FREE  HEALTH  DRAINED  EMULATED  CALIBRATION  RUNNING",
        ),
        (["drain", "node-b"], "POST", "/api/v1/nodes/node-b/drain", "node-b: drained"),
        (["undrain", "node-b"], "POST", "/api/v1/nodes/node-b/undrain", "node-b: not drained"),
        (
            ["quota"],
            "GET",
            "/api/v1/tenants",
            "TENANT  GUARANTEED  CAP  WEIGHT  USED  BORROWED  QUEUED  RUNNING  USE(REF-GPU-H)  SHARE  FACTOR",
        ),
        (["cluster"], "GET", "/api/v1/cluster", "gpus:         4"),
    ],
)
def test_read_and_node_commands(
    cli: Callable[..., Result], master: FakeMaster, argv: list[str], method: str, path: str, first_line: str
) -> None:
    code, out, err = cli(*argv, *auth(master.url))
    assert (code, err) == (0, ""), err
    assert out.splitlines()[0] == first_line
    seen = master.requests[0]
    assert (seen.method, seen.headers.get("Authorization")) == (method, f"Bearer {GOOD_TOKEN}")
    assert seen.path == path.replace("%2F", "/")


class FakeStandby(FakeMaster):
    """A standby master: every API call answers 503 naming `leader` (as hopsmgr.master.standby does)."""

    leader: str = ""

    async def refuse(self, request: web.Request) -> web.Response:
        self.requests.append(Seen(request.method, request.path, [], dict(request.headers), None))
        body = {"error": {"status": 503, "field": None, "message": "standby"}, "leader": self.leader}
        return web.json_response(body, status=503)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.refuse)
        return app


def test_several_urls_a_standby_sends_the_request_to_the_leader(master: FakeMaster) -> None:
    standby = FakeStandby()
    standby.leader = master.url
    standby.start()
    try:
        client = ApiClient(f"{standby.url},{master.url}", GOOD_TOKEN)
        doc = client.post("/api/v1/tokens", {"user": "ana", "tenant": "v", "admin": False})
        assert doc["token"] == "new-secret" and client.url == master.url
        assert [r.path for r in standby.requests] == ["/api/v1/tokens"]
        assert master.requests[0].body == {"user": "ana", "tenant": "v", "admin": False}
    finally:
        standby.stop()


def test_several_urls_an_unreachable_master_is_skipped(master: FakeMaster, refused_url: str) -> None:
    client = ApiClient(f"{refused_url},{master.url}", GOOD_TOKEN)
    assert [j["id"] for j in client.get("/api/v1/jobs")["jobs"]] == ["j-000001", "j-000002"]
    assert client.url == master.url


def test_several_urls_none_answers_is_a_clear_error(refused_url: str) -> None:
    with pytest.raises(MasterUnreachable, match="cannot reach the master at"):
        ApiClient(f"{refused_url},{refused_url}", GOOD_TOKEN).get("/api/v1/jobs")
