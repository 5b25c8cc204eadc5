"""The dashboard's pages rendered from the API's data alone (no master): what they show for the
forecasts' open quantiles."""

from __future__ import annotations

from typing import Any

from hopsmgr.master.access import Principal
from hopsmgr.master.dashboard import pages


def waiting(job_id: str, forecast: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "position": 1,
        "id": job_id,
        "name": "train",
        "tenant": "vision",
        "state": "QUEUED",
        "gpus": [1, 2],
        "latency_ratio": 0.5,
        "est_wait_s": 600.0,
        "forecast": forecast,
    }


def test_the_queue_page_shows_a_forecast_whose_quantiles_are_open() -> None:
    # a P90 the calibration leaves open beside a P50: "open"; a job no future started within its
    # horizon (no P50): "–", where subtracting the time from None broke the page
    now = 1_000_000.0
    open_p90 = {
        "start_p10": now + 60,
        "start_p50": now + 600,
        "start_p90": None,
        "finish_p10": now + 3_600,
        "finish_p50": now + 7_200,
        "finish_p90": None,
        "futures": 1,
        "made": now,
    }
    never = dict(open_p90, start_p10=None, start_p50=None, finish_p10=None, finish_p50=None)
    data = {"jobs": [waiting("j1", open_p90), waiting("j2", never)], "reasons": {}}
    page = pages.queue(data, Principal("ana", "vision"), None, now)
    assert "in 10m 00s <small>P90 open</small>" in page
    assert "in 2h" in page
    assert page.count("in – <small>P90 –</small>") == 2  # j2's start and finish
    # where the forecast says how far the futures looked: past it
    beyond = dict(never, horizon=now + 14 * 86400)
    data = {"jobs": [waiting("j3", beyond)], "reasons": {}}
    page = pages.queue(data, Principal("ana", "vision"), None, now)
    assert page.count("after 14d 00h") == 2, page
    # some futures started it sooner: how many, beside its start
    some = dict(beyond, futures=10, start_within=0.3, start_p10=now + 9000)
    page = pages.queue({"jobs": [waiting("j4", some)], "reasons": {}}, Principal("ana", "vision"), None, now)
    assert "after 14d 00h <small>3 of 10 futures sooner</small>" in page, page


def test_the_queue_page_shows_the_rough_wait_only_where_there_is_no_start_forecast() -> None:
    now = 1_000_000.0
    forecast = {"start_p10": now + 60, "start_p50": now + 120, "start_p90": now + 300, "made": now}
    forecast |= {"finish_p10": None, "finish_p50": None, "finish_p90": None, "futures": 3}
    with_forecast = {**waiting("j1", forecast), "est_wait_s": 7_200.0}
    without = {**waiting("j2", None), "est_wait_s": 7_200.0}
    page = pages.queue(
        {"jobs": [with_forecast, without], "reasons": {}}, Principal("ana", "vision"), None, now
    )
    rows = [r for r in page.split("<tr>") if "/ui/jobs/" in r]
    assert "2h" not in rows[0] and "2h" in rows[1], rows


def cells(row: str) -> list[str]:
    return [c.split(">")[-1] for c in row.split("</td>")[:-1]]


def test_the_job_pages_throughput_shows_what_it_holds_before_it_is_measured_there() -> None:
    # a placement over two servers just started: no measurement yet, its estimate has a row of its own
    job = {"gpus": [2], "placement": {"k80": 1, "v100": 1}}
    explained = {"estimates": {"v100": 500.0}, "placement_estimate": 977.6}
    html = pages._throughput(job, explained)
    rows = {cells(r)[0]: cells(r) for r in html.split("<tr>")[2:]}
    assert rows["k80×1, v100×1"] == ["k80×1, v100×1", "–", "–", "0", "–", "977.6"], rows
    assert rows["v100×2"][-1] == "500.0"


def test_the_job_pages_throughput_shows_the_detail_per_placement_and_ended_jobs_keep_it() -> None:
    # the API's throughput per placement as it is (an ended job: no estimate now, what was expected
    # kept); a placement measured has no second row from the per-node estimates
    job = {
        "gpus": [1, 2],
        "placement": {"n1": 2},
        "throughput": [
            {"placement": {"n1": 2}, "measurements": 4, "measured_last": 181.0, "measured_mean": 180.5,
             "expected_last": 190.0, "estimate_now": 182.0},
            {"placement": {"n2": 1}, "measurements": 2, "measured_last": 95.0, "measured_mean": 94.0,
             "expected_last": None, "estimate_now": None},
        ],
    }  # fmt: skip
    explained = {"estimates": {"n1": 100.0, "n2": 97.0, "n3": 50.0}, "placement_estimate": 182.0}
    html = pages._throughput(job, explained)
    rows = {cells(r)[0]: cells(r) for r in html.split("<tr>")[2:]}
    assert rows == {
        "n1×2": ["n1×2", "181.0", "180.5", "4", "190.0", "182.0"],
        "n2×1": ["n2×1", "95.0", "94.0", "2", "–", "–"],
        "n1×1": ["n1×1", "–", "–", "0", "–", "100.0"],
        "n3×1": ["n3×1", "–", "–", "0", "–", "50.0"],
    }, rows


def test_the_tenants_page_shows_guarantees_and_caps_per_gpu_type() -> None:
    tenant = {
        "guaranteed_gpus_by_type": {"v100": 2},
        "cap_gpus_by_type": {"v100": 4, "k80": 0},
        "used_gpus_by_type": {"v100": 3},
    }
    assert pages._per_type(tenant) == "k80 0 used, cap 0; v100 3 used, guaranteed 2, cap 4"
    assert pages._per_type({"guaranteed_gpus_by_type": {}, "cap_gpus_by_type": {}}) == "–"
