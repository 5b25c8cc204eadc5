"""Property-based fuzzing of job submissions to a running master's HTTP API: mostly valid submissions with
one field perturbed.

One real cluster (master + two emulated agents, as processes; the `api` fixture of tests/fuzz/conftest.py)
serves the module. Hypothesis draws valid submissions (command, gpus, batch size, work, optional fields)
and perturbs at most one field: dropped, its work given twice, an unknown key, junk JSON or a known bad
value, or a tenant the user may not name. A refusal must name the perturbed field (or be a 400/413 for a
body that is not JSON), store nothing and use up no job id; an accepted submission round-trips (GET shows
the same command, gpus, env, ...) and is cancelled at once. Fuzzing every operation with whole random
requests: tests/fuzz/test_api_fuzz.py.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, note
from hypothesis import strategies as st

from tests.fuzz._api_fuzz_helpers import (
    FUZZ,
    JSON,
    PY,
    SUBMIT_KEYS,
    TEXT,
    Api,
    Raw,
    Request,
    check_answer,
    check_unchanged,
    dump,
    job_seq,
)

# -- mostly valid submissions, one field perturbed -------------------------------------------------------------

SAFE_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30)
ENV_KEY = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True).filter(
    lambda k: not k.startswith("HOPS_") and k != "CUDA_VISIBLE_DEVICES"
)
SEGMENT = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00/"), min_size=1, max_size=12
)


@st.composite
def valid_submission(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "command": [PY, "-c", "pass", *draw(st.lists(SAFE_TEXT, max_size=4))],
        # placeable on one GPU type (each type has 2 GPUs here; [3] and [4] would need a mixed placement)
        "gpus": draw(st.sampled_from([[1], [2], [1, 2], [2, 1], [1, 2, 4], [2, 4], [1, 3]])),
        "batch_size": draw(st.integers(1, 1 << 24)),
    }
    work = st.integers(1, 10**12) | st.floats(min_value=1.0, max_value=1e15)
    body[draw(st.sampled_from(["iterations", "samples"]))] = draw(work)
    optional = {
        "name": SAFE_TEXT.filter(lambda s: len(s) <= 128),
        "tenant": st.sampled_from(["vision", "nlp"]),
        "params": st.integers(0, 10**13) | st.floats(min_value=0, max_value=1e13),
        "workdir": st.lists(SEGMENT.filter(lambda s: s != ".."), max_size=4).map(lambda p: "/" + "/".join(p)),
        "env": st.dictionaries(ENV_KEY, SAFE_TEXT, max_size=5),
        "launcher": st.sampled_from(["plain", "torchrun"]),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        body[key] = draw(optional[key])
    return body


BAD_VALUES: dict[str, list[Any]] = {
    "command": [[], [""], "python", [PY, "a\x00b"], [1], [None], [PY] * 1025, [PY, Raw('"\\ud800"')]],
    "gpus": [[], [0], [-1], [1, 1], [4097], [1.0], [True], [64], [5], "1", [1] * 65],
    "batch_size": [0, -1, (1 << 24) + 1, 1.5, "8", None, True, 10**30],
    "iterations": [0, -1, 0.5, 1e-300, 1e16, Raw("NaN"), Raw("Infinity"), Raw("1e999"), "10", None, True],
    "samples": [0, -1, 1e16, Raw("-Infinity"), "10", None, False],
    "name": ["x" * 129, 5, None, ["a"], Raw('"\\ud800"'), Raw('"a\\udfffb"')],
    "tenant": ["a/b", "", "unknown-tenant", "x" * 65, 1, None],
    "params": [-1, 1e14, Raw("NaN"), "1", 1e308],
    "workdir": ["relative", "/a/../b", "/..", "/a/..", "/" + "a" * 1024, 1, None, Raw('"/x\\udc80"')],
    "env": [
        ["A=1"],
        {"A-B": "x"},
        {"HOPS_JOB_ID": "1"},
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"A": 1},
        {"": "x"},
        {"A": Raw('"\\ud800"')},
    ],
    "launcher": ["mpi", "", "PLAIN", None, 1],
}
REQUIRED = ("command", "gpus", "batch_size")


@st.composite
def perturbed_submission(draw: st.DrawFn) -> tuple[dict[str, Any], str | None, str]:
    """(body, the key perturbed or None, token name)."""
    body = draw(valid_submission())
    who = draw(st.sampled_from(["admin", "admin", "bo"]))
    if who == "bo" and body.get("tenant") == "vision":
        return body, "tenant", who  # a user may not name another tenant: 403
    how = draw(st.sampled_from(["none", "none", "drop", "other-work", "unknown", "junk", "bad", "bad"]))
    if how == "drop":
        key = draw(st.sampled_from([*REQUIRED, "work"]))
        if key == "work":
            for work in ("iterations", "samples"):
                body.pop(work, None)
            return body, "iterations", who
        del body[key]
        return body, key, who
    if how == "other-work":
        other = "samples" if "iterations" in body else "iterations"
        body[other] = 10
        return body, "iterations", who
    if how == "unknown":
        key = draw(TEXT.filter(lambda k: k not in SUBMIT_KEYS))
        body[key] = draw(JSON)
        return body, key, who
    if how in ("junk", "bad"):
        key = draw(st.sampled_from(sorted(BAD_VALUES)))
        body[key] = draw(JSON if how == "junk" else st.sampled_from(BAD_VALUES[key]))
        return body, key, who
    return body, None, who


def field_ok(got: str | None, key: str) -> bool:
    keys = ("iterations", "samples") if key in ("iterations", "samples") else (key,)
    return got is not None and any(got == k or got.startswith((k + "[", k + ".")) for k in keys)


@FUZZ
@given(drawn=perturbed_submission())
def test_mostly_valid_submissions_are_refused_by_field_or_round_trip(
    api: Api, drawn: tuple[dict[str, Any], str | None, str]
) -> None:
    body, perturbed, who = drawn
    token = api.tokens[who]
    req = Request("POST", "/api/v1/jobs", "/api/v1/jobs", who, {"Authorization": f"Bearer {token}"}, None)
    req.headers["Content-Type"] = "application/json"
    req.body = dump(body).encode()
    note(f"perturbed={perturbed!r} who={who} body={req.body[:600]!r}")
    before = api.snapshot()
    status, ctype, raw = api.send("POST", "/api/v1/jobs", req.body, req.headers)
    api.hits[f"POST /api/v1/jobs (structured) -> {status}"] += 1
    doc = check_answer(req, status, ctype, raw)
    after = api.snapshot()
    if perturbed is None:
        assert status == 201, doc
    if status != 201:
        check_unchanged(api, before, after)
        error = doc["error"]
        if status == 413 or error["message"].startswith("body is not valid JSON"):
            assert status in (400, 413) and error["field"] is None, doc
        else:
            assert status in (400, 403, 422) and field_ok(error["field"], str(perturbed)), (perturbed, doc)
        return
    job_id = str(doc["id"])
    assert job_seq(job_id) == api.last_seq + 1, f"{job_id} after j-{api.last_seq:06d}: an id was used up"
    api.last_seq = job_seq(job_id)
    check_unchanged(api, before, after, new_job=job_id)
    shown = api.admin("GET", f"/api/v1/jobs/{job_id}")
    assert shown["command"] == body["command"]
    expected = {
        "gpus": sorted(set(body["gpus"])) if perturbed != "gpus" else shown["gpus"],
        "batch_size": body["batch_size"] if perturbed != "batch_size" else shown["batch_size"],
        "name": body.get("name", body["command"][0].rsplit("/", 1)[-1])
        if perturbed != "name"
        else shown["name"],
        "tenant": body.get("tenant", "vision" if who == "admin" else "nlp")
        if perturbed != "tenant"
        else shown["tenant"],
        "env": body.get("env", {}) if perturbed != "env" else shown["env"],
        "workdir": body.get("workdir", "") if perturbed != "workdir" else shown["workdir"],
        "launcher": body.get("launcher", "plain") if perturbed != "launcher" else shown["launcher"],
        "user": "admin" if who == "admin" else "bo",
    }
    assert {k: shown[k] for k in expected} == expected
    cancelled = api.admin("POST", f"/api/v1/jobs/{job_id}/cancel", {})
    assert cancelled["state"] == "CANCELLED"
