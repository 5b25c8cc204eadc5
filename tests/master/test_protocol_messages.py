"""Every message in hopsmgr.protocol goes to JSON text and back unchanged, and the user requests are
refused naming the field; the schemas that check them are the ones the OpenAPI document shows."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr import protocol
from hopsmgr.master.openapi import openapi_document
from hopsmgr.protocol import (
    Heartbeat,
    HeartbeatReply,
    Progress,
    Submission,
    TokenRequest,
    WireError,
    parse_heartbeat,
    parse_heartbeat_reply,
    parse_submission,
    parse_token_request,
)
from tests.helpers.wire import through_json

ids = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
text = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=30)


@settings(max_examples=40, deadline=None)
@given(
    command=st.lists(text, min_size=1, max_size=4).filter(lambda c: c[0] != ""),
    gpus=st.lists(st.integers(1, 64), min_size=1, max_size=4, unique=True),
    batch=st.integers(1, 1024),
    work=st.floats(min_value=1.0, max_value=1e12, allow_nan=False),
    by_samples=st.booleans(),
    tenant=st.none() | ids,
    env=st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(lambda k: not k.startswith("HOPS_")),
        text,
        max_size=3,
    ),
    launcher=st.sampled_from(["plain", "torchrun"]),
)
def test_submission_round_trips(
    command: list[str], gpus: list[int], batch: int, work: float, by_samples: bool, tenant: str | None,
    env: dict[str, str], launcher: str,
) -> None:  # fmt: skip
    sub = parse_submission(
        Submission(
            command=tuple(command),
            gpus=tuple(gpus),
            batch_size=batch,
            iterations=None if by_samples else work,
            samples=work if by_samples else None,
            tenant=tenant,
            env=env,
            launcher=launcher,
            workdir="/srv/x",
        ).to_json()
    )
    assert sub.name == command[0].rsplit("/", 1)[-1][:128]  # the default name is filled in
    assert through_json(sub, parse_submission) == sub


def test_token_request_progress_and_reply_round_trip() -> None:
    token = TokenRequest("ana", "vision", admin=True)
    assert through_json(token, parse_token_request) == token
    reply = HeartbeatReply(
        epoch=3, interval_s=0.5, ack=("a-1",), stop=("a-2",), calibrate=True, extra={"k": "v"}
    )
    assert through_json(reply, parse_heartbeat_reply) == reply
    progress = Progress(iteration=3, samples=96.0, samples_per_s=12.5, time=1.0, mode="profile")
    assert through_json(progress, lambda v: protocol.PROGRESS.check(v, "progress")) == progress
    beat = Heartbeat(
        "n1", "v100", 2, "nvml", "/w", running=(protocol.RunningAttempt("a-1", "j-1", progress),)
    )
    assert through_json(beat, parse_heartbeat) == beat


BASE = {"command": ["python", "train.py"], "gpus": [1], "batch_size": 8, "iterations": 10}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"env": {"HOPS_MODE": "run"}}, "env.HOPS_MODE"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
        ({"env": {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}}, "env.CUDA_DEVICE_ORDER"),
        ({"workdir": "/a/.."}, "workdir"),
        ({"workdir": "a"}, "workdir"),
        ({"gpus": [2, 2]}, "gpus"),
        ({"command": ["", "x"]}, "command[0]"),
        ({"samples": 5}, "iterations"),
        ({"launcher": "mpi"}, "launcher"),
        ({"iterations": 10**400}, "iterations"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_submissions_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(WireError) as caught:
        parse_submission({**BASE, **change})
    assert caught.value.field == field


def test_the_document_shows_the_schemas_the_api_checks_with() -> None:
    doc = openapi_document()
    body = doc["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == protocol.SUBMISSION.json_schema()
    assert body["properties"]["env"]["propertyNames"]["not"] == {
        "pattern": "^(?:HOPS_|CUDA_VISIBLE_DEVICES$|CUDA_DEVICE_ORDER$)"
    }
    beat = doc["paths"]["/api/v1/agents/heartbeat"]["post"]["requestBody"]["content"]["application/json"]
    assert beat["schema"] == protocol.HEARTBEAT.json_schema()
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    links = doc["paths"]["/api/v1/jobs"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in links.values()} == {
        "showJob",
        "cancelJob",
        "jobLogs",
        "explainJob",
    }
    job = doc["paths"]["/api/v1/jobs/{job}"]["get"]["parameters"][0]["schema"]
    assert job["pattern"] == f"^(?:{protocol.JOB_ID_PATTERN})$"


def test_a_heartbeats_progress_reaches_the_machine_with_its_iteration_time() -> None:
    # the master measures a job's rate from the iteration time (hopsmgr.control.nodes), so the
    # heartbeat's progress must carry it into the machine's RunReport
    from hopsmgr.master.heartbeats import _run_report

    progress = Progress(
        iteration=40, samples=960.0, samples_per_s=64.0, time=1.0, mode="run", iteration_s=0.5
    )
    beat = Heartbeat(
        "n1", "v100", 2, "nvml", "/w", running=(protocol.RunningAttempt("a-1", "j-1", progress),)
    )
    (run,) = through_json(beat, parse_heartbeat).running
    report = _run_report(run.attempt, run.progress)
    assert (report.attempt_id, report.iteration, report.iteration_s, report.measuring) == (
        "a-1",
        40.0,
        0.5,
        True,
    )
    assert _run_report("a-2", replace(progress, mode="profile")).measuring is False
    assert report.work_counted is False  # an older runtime: each iteration counted as one
    # a runtime of protocol 3 reports its work (iterations at the smallest GPU count): that is done
    worked = replace(progress, work=80.0)
    (run,) = through_json(
        replace(beat, running=(protocol.RunningAttempt("a-1", "j-1", worked),)), parse_heartbeat
    ).running
    report = _run_report(run.attempt, run.progress)
    assert (report.iteration, report.work_counted) == (80.0, True)
