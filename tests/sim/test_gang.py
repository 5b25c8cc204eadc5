"""The gang workload (`--workload gang:...`) and reservations with backfill, driven through the simulator."""

from __future__ import annotations

import itertools
import math
import time

import pytest

from hopsmgr.core.model import Calibration, Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.registry import make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.traces import workload_from_spec
from hopsmgr.sim.workload import parse_workload_spec
from tests.helpers.bench import load_bench

WORLD = paper_world(seed=1)


def test_gang_spec_makes_a_flood_of_1_gpu_jobs_with_periodic_big_ones() -> None:
    jobs = workload_from_spec("gang:jobs=40,rate=100,big_every=10,big=16|32", WORLD, seed=3)
    widths = [j.requirements.counts for j in jobs]
    assert [k for k, w in enumerate(widths) if w != (1,)] == [9, 19, 29, 39]
    assert [widths[k] for k in (9, 19, 29, 39)] == [(16,), (32,), (16,), (32,)]
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(jobs))
    assert jobs == workload_from_spec("gang:jobs=40,rate=100,big_every=10,big=16|32", WORLD, seed=3)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("gang:jobs=10", "missing rate"),
        ("gang:jobs=10,rate=5,big=16|x", "big must be positive integers"),
        ("gang:jobs=10,rate=5,big=0", "big must be positive integers"),
        ("gang:jobs=10,rate=5,big_every=0", "big_every must be a positive integer"),
        ("gang:jobs=10,rate=5,wide=3", "unknown key 'wide'"),
    ],
)
def test_bad_gang_specs_name_the_key(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_workload_spec(spec)


def run(reservations: bool) -> Simulation:
    servers = [Server(f"s{k}", "rtx3090", 4, Calibration(), host_model="A", order=k) for k in range(4)]
    jobs = workload_from_spec("gang:jobs=120,rate=60,big_every=15,big=8|16", WORLD, seed=2)
    settings = SchedulerSettings(reservations=reservations, reserve_min_gpus=8, fairshare=False)
    sim = Simulation(
        WORLD, servers, jobs, make_policy("hops", settings), SimOptions(seed=2), time.perf_counter
    )
    return sim


def test_reservations_and_backfill_through_the_simulator() -> None:
    result = run(True).run()
    assert all(r.completed for r in result.jobs)
    assert result.reserved_jobs > 0
    assert result.backfills, "the drained servers took backfill"
    for b in result.backfills:
        assert b.launched_s <= b.left_s
        if b.late:
            assert b.left_s > b.until_s
    off = run(False).run()
    assert off.reserved_jobs == 0 and off.backfills == []


def test_summary_counts_reservations_and_late_backfills() -> None:
    from hopsmgr.sim.runner import summarise

    result = run(True).run()
    row = summarise(result, 0.0)
    assert row["reserved_jobs"] == result.reserved_jobs
    assert row["backfills"] == len(result.backfills)
    assert row["backfills_late"] == sum(1 for b in result.backfills if b.late)


def test_the_gang_bench_takes_scheduler_settings_by_their_toml_keys_and_names_bad_ones() -> None:
    gang = load_bench("gang")
    assert gang.setting("lambda=0.5") == ("lambda_", 0.5)  # the TOML key, as in a cluster file
    assert gang.setting("lambda_=2") == ("lambda_", 2.0)
    assert gang.setting("reservations=true") == ("reservations", True)
    with pytest.raises(SystemExit, match="'nonsense=1' is not KEY=VALUE"):
        gang.setting("nonsense=1")
    with pytest.raises(SystemExit, match=r"lambda = 'abc' is not a float"):
        gang.setting("lambda=abc")
    with pytest.raises(SystemExit, match=r"reservations = 'ture' is not true or false"):
        gang.setting("reservations=ture")
    with pytest.raises(SystemExit, match=r"lambda = '-1': scheduler.lambda_: must be a finite number >= 0"):
        gang.setting("lambda=-1")


def test_the_gang_bench_counts_the_seeds_that_miss_the_big_job_target() -> None:
    gang = load_bench("gang")

    def run(seed: int, ratio: float | None, big: float, jct: float, preemptions: int) -> dict[str, object]:
        return {
            "workload": "gang:jobs=800,rate=60,big_every=40",
            "policy": "hops",
            "seed": seed,
            "lr_ratio_big_to_1gpu": ratio,
            "max_lr_big": big,
            "avg_jct_h": jct,
            "preemptions": preemptions,
        }

    runs = [run(1, 1.5, 3.0, 0.3, 10), run(2, 2.5, 5.0, 0.5, 30), run(3, None, 0.4, 0.4, 20)]
    runs.append({**run(1, 3.0, 3.0, 1.0, 5), "policy": "sia-lr"})
    hops, sia = gang.summarise(runs)
    assert (hops["policy"], hops["runs"], hops["missed"]) == ("hops", 3, 2)  # 2.5, and big jobs waited alone
    assert hops["median_ratio"] == 2.5 and hops["worst_ratio"] == math.inf
    assert hops["mean_avg_jct_h"] == pytest.approx(0.4) and hops["mean_preemptions"] == pytest.approx(20)
    assert (sia["policy"], sia["runs"], sia["missed"]) == ("sia-lr", 1, 1)
    at_target = gang.summarise([run(1, 2.0, 2.0, 0.3, 1), run(2, None, 0.0, 0.3, 1)])[0]
    assert at_target["missed"] == 0  # 2.0 is within the target; no wait at all is no miss
