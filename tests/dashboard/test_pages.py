"""The dashboard's pages rendered from the API's data alone (no master): what they show for the
forecasts' open quantiles."""

from __future__ import annotations

from typing import Any

from hopsmgr.master.controller import Principal
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
    assert page.count("after 14d 0h") == 2, page


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


def test_the_job_pages_throughput_compares_a_larger_count_with_its_own_estimate() -> None:
    # an elastic job measured on 2 GPUs of n1: its estimate there is the one at 2 GPUs (it was empty
    # for any count but the smallest); a count without one falls back to the smallest count's
    job = {"gpus": [1, 2]}
    measured = [
        {"placement": {"n1": 2}, "samples_per_s": 180.0},
        {"placement": {"n2": 1}, "samples_per_s": 95.0},
    ]
    explained = {
        "estimates": {"n1": 100.0, "n2": 97.0},
        "estimates_by_count": {"n1": {"1": 100.0, "2": 190.0}},
    }
    html = pages._throughput(job, measured, explained)
    rows = {r.split("</td>")[0].split(">")[-1]: r for r in html.split("<tr>")[2:]}
    assert "190.0" in rows["n1×2"] and "97.0" in rows["n2×1"], rows


def test_the_job_pages_throughput_has_an_estimate_for_a_placement_over_several_servers() -> None:
    # a placement over two servers of two types has no per-node estimate; the explanation's estimate
    # of the placement the job holds is shown beside it (it was "–"), not beside one it held before
    job = {"gpus": [2], "placement": {"k80": 1, "v100": 1}}
    measured = [
        {"placement": {"p100": 1, "v100": 1}, "samples_per_s": 900.0},
        {"placement": {"v100": 1, "k80": 1}, "samples_per_s": 1009.0},
    ]
    explained = {"estimates": {}, "estimates_by_count": {}, "placement_estimate": 977.6}
    html = pages._throughput(job, measured, explained)
    rows = {r.split("</td>")[0].split(">")[-1]: r for r in html.split("<tr>")[2:]}
    assert "977.6" in rows["k80×1, v100×1"] and "977.6" not in rows["p100×1, v100×1"], rows


def cells(row: str) -> list[str]:
    return [c.split(">")[-1] for c in row.split("</td>")[:-1]]


def test_the_job_pages_throughput_shows_what_it_holds_before_it_is_measured_there() -> None:
    # a placement over two servers just started: no measurement yet, its estimate has a row of its own
    job = {"gpus": [2], "placement": {"k80": 1, "v100": 1}}
    explained = {"estimates": {"v100": 500.0}, "estimates_by_count": {}, "placement_estimate": 977.6}
    html = pages._throughput(job, [], explained)
    rows = {cells(r)[0]: cells(r) for r in html.split("<tr>")[2:]}
    assert rows["k80×1, v100×1"] == ["k80×1, v100×1", "–", "–", "0", "–", "977.6"], rows
    assert rows["v100×2"][-1] == "500.0"


def test_an_ended_jobs_throughput_keeps_what_was_expected_beside_what_was_measured() -> None:
    # the job ended: no estimate now, but each measurement kept the estimator's figure of just before it
    job = {"gpus": [1], "placement": None}
    measured = [
        {"placement": {"n1": 1}, "samples_per_s": 380.0, "estimated_per_s": 508.0},
        {"placement": {"n1": 1}, "samples_per_s": 381.0, "estimated_per_s": 379.8},
        {"placement": {"n2": 1}, "samples_per_s": 190.0, "estimated_per_s": None},
    ]
    html = pages._throughput(job, measured, {"estimates": {}, "estimates_by_count": {}})
    rows = {cells(r)[0]: cells(r) for r in html.split("<tr>")[2:]}
    assert rows["n1×1"] == ["n1×1", "381.0", "380.5", "2", "379.8", "–"], rows
    assert rows["n2×1"][4:] == ["–", "–"]
