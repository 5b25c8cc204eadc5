"""Tests of the lower bound on the average JCT (bench/jct_bound.py) and the best-case rates it reads
(hopsmgr.sim.bestrates): no real placement beats the rates, no simulated run beats the bound, and the
bound is tight where the answer is known."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hopsmgr.cli.main import main as hopsmgr_main
from hopsmgr.core.model import RequirementSet
from hopsmgr.sim.bestrates import BestRates, group_of, splits
from hopsmgr.sim.engine import job_key
from hopsmgr.sim.paperworld import PaperWorld
from hopsmgr.sim.runner import parse_cluster
from hopsmgr.sim.truth import job_factor
from hopsmgr.sim.workload import WorkloadJob

ROOT = Path(__file__).resolve().parents[2]
PAPER_16 = str(ROOT / "configs" / "sim" / "paper-16.toml")
PAPER_512 = str(ROOT / "configs" / "sim" / "paper-512.toml")


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jct_bound", ROOT / "bench" / "jct_bound.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_splits_are_every_multiset_once() -> None:
    assert sorted(splits(4, 8, 4)) == [(1, 1, 1, 1), (2, 1, 1), (2, 2), (3, 1), (4,)]
    assert sorted(splits(10, 8, 2)) == [(5, 5), (6, 4), (7, 3), (8, 2)]
    assert list(splits(17, 8, 2)) == []


def test_no_placement_in_a_group_beats_its_best_case_rate() -> None:
    cluster = parse_cluster(PAPER_512)
    world = PaperWorld(seed=3)
    table = BestRates(world, cluster.servers)
    rng = random.Random(5)
    for _ in range(300):
        model = rng.choice(world.models()).name
        group = rng.choice(sorted(table.groups))
        servers = rng.sample(table.groups[group], rng.randint(1, 3))
        parts = [(s, rng.randint(1, s.gpus)) for s in servers]
        count = sum(g for _, g in parts)
        assert world.true_rate(model, parts) <= table.rate(model, group, count) * (1 + 1e-12)
    # with no per-server variation it is reached: the best split of the count over identical servers
    nominal = PaperWorld(seed=3, per_server_sigma=0.0)
    exact = BestRates(nominal, cluster.servers)
    servers_c = exact.groups["rtx3090/C"]
    placed = [
        nominal.true_rate("ResNet50", list(zip(servers_c, split, strict=False)))
        for split in splits(12, 8, len(servers_c))
    ]
    assert exact.rate("ResNet50", "rtx3090/C", 12) == pytest.approx(max(placed), rel=1e-12)


def test_a_placement_across_groups_runs_no_faster_than_its_shares_of_each_groups_rate() -> None:
    """The relaxation lets a job hold GPUs of several groups at once, each at its group's hull: that
    covers mixed-type placements (and same-type ones over two host models) only if this holds."""
    cluster = parse_cluster(PAPER_512)
    world = PaperWorld(seed=3)
    table = BestRates(world, cluster.servers)
    rng = random.Random(9)
    servers = list(cluster.servers)
    checked = 0
    while checked < 300:
        model = rng.choice(world.models()).name
        chosen = rng.sample(servers, rng.randint(2, 4))
        parts = [(s, rng.randint(1, s.gpus)) for s in chosen]
        by_group: dict[str, int] = {}
        for server, gpus in parts:
            by_group[group_of(server)] = by_group.get(group_of(server), 0) + gpus
        if len(by_group) < 2:
            continue
        count = sum(by_group.values())
        covered = sum(g / count * table.rate(model, group, count) for group, g in by_group.items())
        assert world.true_rate(model, parts) <= covered
        checked += 1


def test_the_bound_of_one_job_alone_is_its_best_run() -> None:
    jct_bound = load()
    figures = jct_bound.bound(
        parse_cluster(PAPER_16), "poisson:jobs=1,rate=10", 1, jct_bound.slot_grid(20.0, 0.25, 4.0, 0.05)
    )
    assert figures["bound_avg_jct_h"] == pytest.approx(figures["avg_best_run_h"], rel=1e-6)


def test_two_jobs_that_each_need_the_whole_server_are_bound_by_running_one_after_the_other() -> None:
    """Best run T each: run in turn they end at T and 2T (average 1.5 T); shared, both end at 2T. The
    relaxation's answer is 1.5 T, up to the slot grid (it can only be lower)."""
    jct_bound = load()
    cluster = parse_cluster("rtx3090=1x8")
    world = PaperWorld(seed=1)
    table = BestRates(world, cluster.servers)
    rate = table.rate("ResNet50", "rtx3090/", 8)
    jobs = [WorkloadJob(f"j{i}", 0.0, "ResNet50", RequirementSet((8,)), rate * 3600.0, 64) for i in range(2)]
    runs_h = [
        job.total_samples / (rate * job_factor(1, "ResNet50", job_key(job.job_id))) / 3600 for job in jobs
    ]
    edges = jct_bound.slot_grid(6.0, 0.05, 0.0, 0.05)
    figures = jct_bound.solve([jct_bound.job_bound(table, job) for job in jobs], table.capacity(), edges)
    shorter, longer = sorted(runs_h)
    assert figures["bound_avg_jct_h"] <= (shorter + (shorter + longer)) / 2 + 1e-6
    assert figures["bound_avg_jct_h"] >= (shorter + (shorter + longer)) / 2 - 0.06
    assert figures["bound_avg_jct_h"] > 1.4 * figures["avg_best_run_h"]


def test_no_simulated_run_beats_the_bound(tmp_path: Path) -> None:
    workload, out = "poisson:jobs=12,rate=20", tmp_path / "run"
    code = hopsmgr_main(
        [
            "simulate",
            "--cluster",
            PAPER_16,
            "--workload",
            workload,
            "--policies",
            "hops,hops-srtf-lr,sia-lr",
            "--seed",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    runs = json.loads((out / "results.json").read_text(encoding="utf-8"))["policies"]
    bound_json = tmp_path / "bound.json"
    assert (
        load().main(["--cluster", PAPER_16, "--workload", workload, "--seed", "4", "--json", str(bound_json)])
        == 0
    )
    figures = json.loads(bound_json.read_text(encoding="utf-8"))
    assert figures["avg_best_run_h"] < figures["bound_avg_jct_h"]
    for name, row in runs.items():
        assert row["avg_jct_h"] > figures["bound_avg_jct_h"], name


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--workload", "gang:jobs=5,rate=10"], "--workload"),
        (["--workload", "poisson:jobs=5,rate=10", "--slot-h", "0"], "--slot-h"),
        (["--workload", "poisson:jobs=5,rate=10", "--cluster", "nonsense"], "--cluster"),
    ],
)
def test_bad_arguments_are_named(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--cluster": PAPER_16, "--seed": "1"}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        base[flag] = value
    args = [item for pair in base.items() for item in pair]
    assert load().main(args) == 2
    assert named in capsys.readouterr().err
