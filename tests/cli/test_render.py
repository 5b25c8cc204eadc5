"""Rendering of sample API answers (docs/api.md) as tables and `key: value` text."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from hopsmgr.cli import render


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


RUNNING: dict[str, Any] = {
    "id": "j-000001", "name": "resnet", "tenant": "vision", "user": "ana", "state": "RUNNING",
    "gpus": [1, 2, 4], "submitted": 1796035200.0, "placement": {"node-a": 2}, "position": None,
    "priority": 1.8, "latency_ratio": 1.8, "est_wait_s": None, "progress": 0.42,
    "attempts": 2, "restarts": 1, "reason": None,
}  # fmt: skip
QUEUED: dict[str, Any] = RUNNING | {
    "id": "j-000002", "name": "bert-large", "tenant": "nlp", "state": "QUEUED", "gpus": [8],
    "submitted": 1796035300.0, "placement": {}, "position": 1, "latency_ratio": 2.345,
    "est_wait_s": 200, "progress": 0.0,
}  # fmt: skip


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (45, "45s"), (200, "3m20s"), (3700, "1h01m"), (90000, "1d01h"), (59.6, "1m00s")],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert render.duration(seconds) == text


def test_queue_table_puts_queued_jobs_first_by_position() -> None:
    assert render.queue_table([RUNNING, QUEUED]).splitlines() == [
        "POS  ID        NAME        USER  TENANT  STATE    GPUS   PLACEMENT  LR    EST.WAIT  START.P50/P90  PROGRESS",
        "1    j-000002  bert-large  ana   nlp     QUEUED   8      -          2.35  3m20s     -              0%",
        "-    j-000001  resnet      ana   vision  RUNNING  1,2,4  node-a:2   1.80  -         -              42%",
    ]


def test_queue_table_shows_start_forecasts_of_waiting_jobs_only() -> None:
    # a job that started keeps the forecast made while it waited until the next forecast: its start
    # quantiles are history, not a forecast
    forecast = {"start_p50": 1000.0 + 60, "start_p90": 1000.0 + 300, "made": 1000.0}
    queued, running = QUEUED | {"forecast": forecast}, RUNNING | {"forecast": forecast}
    lines = render.queue_table([queued, running]).splitlines()
    assert "1m00s/5m00s" in lines[1] and "1m00s" not in lines[2]
    # beside a start forecast, the rough EST.WAIT (3m20s here) is not shown: it only contradicted it
    assert "3m20s" not in lines[1] and "3m20s" in render.queue_table([QUEUED]).splitlines()[1]


def test_an_open_p90_beside_a_p50_is_shown_open_and_no_p50_as_a_dash() -> None:
    opened = {"start_p10": 1000.0, "start_p50": 1060.0, "start_p90": None, "made": 1000.0}
    never = {"start_p10": None, "start_p50": None, "start_p90": None, "made": 1000.0}
    assert render.forecast_span(opened, "start") == "1m00s/open"
    assert render.forecast_span(never, "start") == "-/-"
    # where the answer says how far the futures looked, a quantile none of them reached is past it
    beyond = never | {"horizon": 1000.0 + 14 * 86400}
    assert render.forecast_span(beyond, "start") == ">14d00h/>14d00h"
    assert render.forecast_span(opened | {"horizon": 1000.0 + 14 * 86400}, "start") == "1m00s/open"


def test_explain_says_a_start_no_future_reached_is_past_the_horizon_and_a_running_job_has_none() -> None:
    now = time.time()
    beyond = {"start_p10": None, "start_p50": None, "start_p90": None, "finish_p50": None,
              "finish_p90": None, "futures": 3, "made": now, "horizon": now + 14 * 86400 + 1800}  # fmt: skip
    line = render.explain_text({"id": "j", "state": "QUEUED", "forecast": beyond})
    assert "forecast start: not within 14d00h (in none of 3 sampled futures" in line, line
    assert "forecast end:   not within 14d00h" in line, line
    running = render.explain_text({"id": "j", "state": "RUNNING", "forecast": beyond})
    assert "forecast start: -" in running and "forecast end:   not within 14d" in running, running
    # where the answer says how many futures started it sooner (too few for a P50: a bimodal outcome)
    some = beyond | {"futures": 10, "start_within": 0.3, "start_p10": now + 9000}
    line = render.explain_text({"id": "j", "state": "QUEUED", "forecast": some})
    assert "not within 14d00h (7 of 10 sampled futures; the other 3 started it sooner, P10 2h30m)" in line
    none = render.explain_text({"id": "j", "state": "QUEUED", "forecast": beyond | {"start_within": 0.0}})
    assert "not within 14d00h (in none of 3 sampled futures within their horizon)" in none, none


def test_explain_counts_a_forecasts_waits_from_now_also_without_its_made() -> None:
    # an answer with no `made` (an older master) counted from 1970
    now = time.time()
    soon = {"start_p10": now + 50, "start_p50": now + 65, "start_p90": now + 125}
    line = render.explain_text({"id": "j", "forecast": soon})
    assert "forecast start: in 1m0" in line and "made" not in line, line


def test_queue_table_empty_has_headers_only() -> None:
    assert render.queue_table([]).startswith("POS  ID  NAME")


def test_job_detail(utc: None) -> None:
    detail = RUNNING | {
        "command": ["python", "train.py", "--lr", "0.1"], "env": {"A": "1 2"}, "workdir": "/srv",
        "launcher": "plain", "batch_size": 32, "total_samples": 1000000, "done_samples": 420000,
        "history": [
            {"time": 1796035200.0, "kind": "submit", "state": "PENDING", "message": "submitted by ana"},
            {"time": 1796035260.0, "kind": "launch", "state": "RUNNING", "message": "node-a:2"},
        ],
        "attempts": [
            {"id": 1, "placement": {"node-a": 1}, "profiling": True, "started": 1796035210.0,
             "ended": 1796035250.0, "end_reason": "profiled", "exit_code": 0},
            {"id": 2, "placement": {"node-a": 2}, "profiling": False, "started": 1796035260.0,
             "ended": None, "end_reason": None, "exit_code": None},
        ],
    }  # fmt: skip
    lines = render.job_detail(detail).splitlines()
    assert "submitted:     2026-11-30T10:40:00+00:00" in lines
    assert "attempts:      2 (1 restarts)" in lines
    assert "command:       python train.py --lr 0.1" in lines
    assert "env:           A='1 2'" in lines
    assert lines[lines.index("history:") + 1 :][:3] == [
        "  TIME                       KIND    STATE    MESSAGE",
        "  2026-11-30T10:40:00+00:00  submit  PENDING  submitted by ana",
        "  2026-11-30T10:41:00+00:00  launch  RUNNING  node-a:2",
    ]
    assert lines[-2:] == [
        "  1   node-a:1   yes        2026-11-30T10:40:10+00:00  2026-11-30T10:40:50+00:00  profiled    0",
        "  2   node-a:2   no         2026-11-30T10:41:00+00:00  -                          -           -",
    ]


def test_explain_marks_the_chosen_configuration(utc: None) -> None:
    doc = {
        "id": "j-000002", "state": "QUEUED", "position": 1, "priority": 2.345, "latency_ratio": 2.345,
        "in_window": True, "window": 4, "sensitivity": 1.2, "may_span": False,
        "candidates": [{"config": "rtx3090x8", "rate": 120.5, "value": 2.1},
                       {"config": "v100x8", "rate": 98.0, "value": 1.7}],
        "chosen": "rtx3090x8", "unplaceable": None,
        "quota": {"tenant": "nlp", "guaranteed_gpus": 8, "cap_gpus": 16, "used_gpus": 8, "borrowed_gpus": 0},
        "round": {"time": 1796035300.0, "kind": "periodic", "method": "ilp", "proven": True},
    }  # fmt: skip
    text = render.explain_text(doc)
    assert "  queue position: 1" in text
    assert "in the service window (the window holds 4 jobs, running ones included)" in text
    # a waiting job's position counts waiting jobs only; the window counts the running ones it holds
    outside = render.explain_text({**doc, "position": 2, "in_window": False, "window": 3})
    assert "outside it (the window holds 3 jobs, running ones included)" in outside
    assert "  quota:          tenant nlp: uses 8 GPUs, guaranteed 8, cap 16, borrowed 0\n" in text
    per_type = {
        "cap_gpus_by_type": {"v100": 4},
        "guaranteed_gpus_by_type": {"k80": 2},
        "used_gpus_by_type": {"v100": 3},
    }
    capped = render.explain_text({**doc, "quota": {**doc["quota"], **per_type}})
    assert "borrowed 0; guaranteed per type k80 0/2; cap per type v100 3/4\n" in capped
    assert "  last round:     2026-11-30T10:41:40+00:00 (periodic, ilp, proven optimal)" in text
    assert text.splitlines()[-3:] == [
        "       CONFIG     RATE    VALUE",
        "    *  rtx3090x8  120.50  2.100",
        "       v100x8     98.00   1.700",
    ]


def test_nodes_table() -> None:
    nodes = [
        {"id": "node-a", "gpu_type": "rtx3090", "gpus": 8, "health": "HEALTHY", "drained": False,
         "emulated": True, "calibration": {"compute_factor": 1.05, "source": "measured"}, "last_beat_s": 2.0,
         "free_gpus": 6, "running": [{"job": "j-000001", "attempt": 2, "gpus": 2},
                                     {"job": "j-000003", "attempt": 1, "gpus": 1}]},
        {"id": "node-b", "gpu_type": "v100", "gpus": 4, "health": "SUSPECT", "drained": True,
         "emulated": False, "calibration": {}, "last_beat_s": 40.0, "free_gpus": 4, "running": []},
    ]  # fmt: skip
    assert render.nodes_table(nodes).splitlines() == [
        "ID      TYPE     GPUS  FREE  HEALTH   DRAINED  EMULATED  CALIBRATION      RUNNING",
        "node-a  rtx3090  8     6     HEALTHY  no       yes       1.05 (measured)  j-000001,j-000003",
        "node-b  v100     4     4     SUSPECT  yes      no        -                -",
    ]


def test_tenants_table() -> None:
    tenant = {"name": "vision", "guaranteed_gpus": 16, "cap_gpus": None, "weight": 1.0, "used_gpus": 8,
              "borrowed_gpus": 0, "queued": 3, "running": 2, "usage_ref_gpu_h": 12.5, "usage_share": 0.25,
              "fairshare_factor": 5.66, "usage_history": [{"time": 1796035300.0, "ref_gpu_h": 12.5}]}  # fmt: skip
    assert render.tenants_table([tenant]).splitlines() == [
        "TENANT  GUARANTEED  CAP  WEIGHT  USED  BORROWED  QUEUED  RUNNING  USE(REF-GPU-H)  SHARE  FACTOR",
        "vision  16          -    1       8     0         3       2        12.50           0.25   5.66",
    ]


def test_usage_history_text(utc: None) -> None:
    tenants = [
        {"name": "vision", "usage_history": [{"time": 1796035300.0, "ref_gpu_h": 12.5}]},
        {"name": "nlp"},
    ]
    lines = render.usage_history_text(tenants).splitlines()
    assert lines[0] == "vision:" and lines[1] == "  2026-11-30T10:41:40+00:00  12.50 ref-GPU-h"
    assert lines[2:] == ["nlp:", "  (no samples yet)"]


def test_cluster_text(utc: None) -> None:
    doc = {"gpus": 12, "gpus_by_type": {"rtx3090": 8, "v100": 4}, "used_gpus": 2, "idle_gpus": 10,
           "pending": 0, "queued": 1, "running": 1, "nodes": {"HEALTHY": 1, "SUSPECT": 1}, "raqlr": 1.5,
           "epoch": 3, "last_round": {"time": 1796035300.0, "method": "ilp"}, "version": "0.1.0"}  # fmt: skip
    assert render.cluster_text(doc).splitlines() == [
        "gpus:         12",
        "gpus_by_type: rtx3090=8, v100=4",
        "used_gpus:    2",
        "idle_gpus:    10",
        "pending:      0",
        "queued:       1",
        "running:      1",
        "nodes:        HEALTHY=1, SUSPECT=1",
        "raqlr:        1.50",
        "epoch:        3",
        "last_round:   2026-11-30T10:41:40+00:00 method=ilp",
        "version:      0.1.0",
    ]


def test_tenants_table_lists_guarantees_and_caps_per_gpu_type_below() -> None:
    tenants = [
        {
            "name": "vision",
            "cap_gpus_by_type": {"v100": 2, "k80": 0},
            "guaranteed_gpus_by_type": {"v100": 1},
            "used_gpus_by_type": {"v100": 1},
        },
        {"name": "nlp", "cap_gpus_by_type": {}, "guaranteed_gpus_by_type": {}},
    ]
    lines = render.tenants_table(tenants).splitlines()
    assert lines[-5:] == [
        "guarantees per GPU type (used / guarantee):",
        "  vision: v100 1 / 1",
        "",
        "caps per GPU type (used / cap):",
        "  vision: k80 0 / 0, v100 1 / 2",
    ]
    assert not any("per GPU type" in line for line in render.tenants_table(tenants[1:]).splitlines())
