"""bench/targets.py: issue 13's scoreboard. Each target's verdict at and past its boundary (from rows
given to it, so no simulation runs), Gavel's reference clusters as its README gives them, a short real
run end to end whose baselines are kept and reused, and bad arguments named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.sim import runner
from tests.helpers.bench import load_bench

targets = load_bench("targets")
SMALL = targets.Params(
    paper_jobs=12, paper_rate=20.0, seeds=(1, 2), sweep_rates=(60.0,), gavel_traces=("d1",)
)


def row(
    jct: float, makespan: float = 10.0, max_lr: float = 1.0, preemptions: int = 0, idle: float = 0.0
) -> dict[str, Any]:
    return {
        "avg_jct_h": jct,
        "makespan_h": makespan,
        "max_lr": max_lr,
        "preemptions": preemptions,
        "migrations": 0,
        "frags_per_waiting_round": idle,
        "frags_per_round": idle / 2,
        "wall_s": 0.0,
    }


def given(
    candidate: dict[str, dict[str, Any]], baselines: dict[str, dict[str, Any]], params: Any = SMALL
) -> Any:
    """A Runs whose rows are all given: keys are `rate/seed/policy` (paper) or `trace/policy` (gavel)."""
    runs = targets.Runs(params, "hops", {}, {})

    def key(short: str) -> str:
        parts = short.split("/")
        if len(parts) == 3:
            return runs._paper_key(float(parts[0]), int(parts[1]), parts[2])
        return f"gavel/{parts[0]}/{parts[1]}"

    runs.candidate.update({key(k): v for k, v in candidate.items()})
    runs.cache.update({key(k): v for k, v in baselines.items()})
    return runs


def paper_verdicts(seed2: dict[str, Any]) -> dict[str, bool]:
    sia, gav = row(2.0, makespan=10.0, max_lr=40.0, preemptions=100), row(3.0, makespan=12.0, max_lr=20.0)
    runs = given(
        {"20/1/hops": row(1.5, makespan=9.0, max_lr=2.0, preemptions=100), "20/2/hops": seed2},
        {"20/1/sia-lr": sia, "20/1/gavel-lr": gav, "20/2/sia-lr": sia, "20/2/gavel-lr": gav},
    )
    return {t.name: t.met for t in targets.paper_targets(runs)}


def test_each_paper_target_is_met_at_its_boundary_on_every_seed() -> None:
    verdicts = paper_verdicts(row(1.5, makespan=9.99, max_lr=2.0, preemptions=100, idle=0.99))
    assert all(verdicts.values()), verdicts


@pytest.mark.parametrize(
    ("seed2", "missed"),
    [
        (row(1.51, makespan=9.0, max_lr=2.0, preemptions=100), "paper avg JCT <= 0.75x the better baseline"),
        (row(1.5, makespan=10.0, max_lr=2.0, preemptions=100), "paper makespan below both baselines"),
        (row(1.5, makespan=9.0, max_lr=2.01, preemptions=100), "paper max LR <= 1/10 of either baseline's"),
        (row(1.5, makespan=9.0, max_lr=2.0, preemptions=101), "paper preemptions <= Sia-LR's"),
        (
            row(1.5, makespan=9.0, max_lr=2.0, preemptions=100, idle=1.0),
            "paper < 1 idle GPU per round while work waits",
        ),
    ],
)
def test_one_seed_past_a_paper_target_misses_it_and_only_it(seed2: dict[str, Any], missed: str) -> None:
    verdicts = paper_verdicts(seed2)
    assert [name for name, met in verdicts.items() if not met] == [missed]


def test_the_sweep_lead_must_grow_with_the_rate_as_a_trend() -> None:
    def verdict(leads: dict[float, float]) -> bool:
        candidate = {f"{r:g}/1/hops": row(2.0 * (1 - lead)) for r, lead in leads.items()}
        baselines = {f"{r:g}/1/sia-lr": row(2.0) for r in leads}
        runs = given(
            candidate, baselines, replace(SMALL, seeds=(1,), sweep_rates=tuple(r for r in leads if r != 20.0))
        )
        (target,) = targets.sweep_targets(runs)
        return bool(target.met)

    assert verdict({20.0: 0.02, 60.0: 0.05, 200.0: 0.05})
    assert verdict({20.0: 0.02, 60.0: 0.08, 200.0: 0.06})  # one step down, the trend still up
    assert not verdict({20.0: 0.05, 60.0: 0.08, 200.0: 0.03})  # lower at the highest rate than the lowest
    assert not verdict(
        {20.0: 0.05, 60.0: 0.03, 200.0: 0.06, 600.0: 0.07}
    )  # a trend up, but a dip below the start
    assert not verdict({20.0: 0.02, 60.0: 0.12, 200.0: 0.03, 600.0: 0.03})  # up at the lowest end only
    assert not verdict({20.0: 0.05, 60.0: 0.05, 200.0: 0.05})  # flat: no growth


def test_gavel_targets_read_gavel_s_own_results(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = targets.gavel_reference()
    best = min(reference["d1"].values())
    mmf = reference["d1"]["max_min_fairness_perf"]
    met = given({"d1/hops": row(0.8 * best)}, {"d1/gavel": row(1.0999 * mmf)})
    assert [t.met for t in targets.gavel_targets(met)] == [True, True]
    missed = given({"d1/hops": row(0.81 * best)}, {"d1/gavel": row(0.89 * mmf)})
    assert [t.met for t in targets.gavel_targets(missed)] == [False, False]
    above = given({"d1/hops": row(0.8 * best)}, {"d1/gavel": row(1.11 * mmf)})
    assert [t.met for t in targets.gavel_targets(above)] == [True, False]  # fidelity holds both ways

    # the candidate is held to Gavel's best policy, our gavel to max_min_fairness_perf, whichever is best
    monkeypatch.setattr(
        targets, "gavel_reference", lambda: {"d1": {"max_min_fairness_perf": 10.0, "other": 5.0}}
    )
    assert [t.met for t in targets.gavel_targets(given({"d1/hops": row(4.0)}, {"d1/gavel": row(10.5)}))] == [
        True,
        True,
    ]
    assert [t.met for t in targets.gavel_targets(given({"d1/hops": row(4.1)}, {"d1/gavel": row(5.0)}))] == [
        False,
        False,
    ]


def test_a_gavel_trace_runs_on_its_cluster_in_gavel_compatible_mode() -> None:
    result = targets.gavel_run("d1", "fifo", {})
    assert result["jobs"] == result["completed"] == 100


def gang_row(big: float, small: float, backfills: int = 0, late: int = 0) -> dict[str, Any]:
    return {
        "policy": "hops",
        "workload": "gang",
        "max_lr_big": big,
        "max_lr_1gpu": small,
        "lr_ratio_big_to_1gpu": big / small if small > 0 else None,
        "backfills": backfills,
        "backfills_late": late,
        "avg_jct_h": 1.0,
        "preemptions": 0,
        "wall_s": 0.0,
    }


def test_gang_targets_count_misses_per_run_and_judge_backfill_only_where_there_was_some(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def verdicts(rows: list[dict[str, Any]]) -> list[bool | None]:
        feed = iter(rows)
        monkeypatch.setattr(targets.gang, "one_run", lambda *args: next(feed))
        params = targets.Params(gang_rates=(60.0,), gang_seeds=tuple(range(1, len(rows) + 1)))
        return [t.met for t in targets.gang_targets(targets.Runs(params, "hops", {}, {}))]

    assert verdicts([gang_row(2.0, 1.0), gang_row(0.5, 0.3)]) == [True, None]  # nothing backfilled
    assert verdicts([gang_row(2.0, 1.0), gang_row(0.61, 0.3)]) == [False, None]  # one run of two misses
    assert verdicts([gang_row(1, 1, backfills=100, late=4), gang_row(1, 1, backfills=21, late=1)]) == [
        True,
        True,
    ]
    # 5 of 200 late in all (2.5%), but 1 of 20 (5%) on one run: the target is judged run by run
    assert verdicts([gang_row(1, 1, backfills=180, late=4), gang_row(1, 1, backfills=20, late=1)]) == [
        True,
        False,
    ]


def test_gavel_clusters_are_those_of_gavel_s_readme() -> None:
    reference = json.loads((targets.GAVEL_REFERENCE / "results.json").read_text())
    for trace, spec in targets.GAVEL_CLUSTERS.items():
        cluster = runner.parse_cluster(spec)
        counts = [int(x) for x in reference[trace]["cluster"].split(":")]  # V100:P100:K80
        per_server = [int(x) for x in reference[trace]["gpus_per_server"].split(":")]
        for gpu_type, count, gpus in zip(("v100", "p100", "k80"), counts, per_server, strict=True):
            servers = [s for s in cluster.servers if s.gpu_type == gpu_type]
            assert sum(s.gpus for s in servers) == count, trace
            assert {s.gpus for s in servers} == {gpus}, trace


def test_a_short_run_end_to_end_keeps_and_reuses_its_baselines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    baselines, out = tmp_path / "baselines.json", tmp_path / "targets.json"
    small = [
        "--paper-cluster", "configs/sim/paper-16.toml", "--paper-jobs", "10", "--paper-rate", "20", "--seeds", "1",
        "--sweep-rates", "60", "--gang-jobs", "40", "--gang-big-every", "20", "--gang-seeds", "1", "--gang-rates", "60",
    ]  # fmt: skip
    args = ["--scenarios", "paper,sweep,gang", *small, "--baselines", str(baselines), "--json", str(out)]
    assert targets.main(args) == 0
    kept = json.loads(baselines.read_text())
    assert sorted(k.rsplit("/", 1)[1] for k in kept) == ["gavel-lr", "sia-lr", "sia-lr"]
    first = json.loads(out.read_text())
    assert first["targets"] == 8 and first["policy"] == "hops"
    assert first["targets_met"] <= first["targets_applying"] <= 8

    capsys.readouterr()
    seen: list[tuple[str, float]] = []
    run_policy = runner.run_policy

    def recording(spec: runner.RunSpec, name: str) -> Any:
        seen.append((name, spec.cluster.scheduler.lr_hysteresis))
        return run_policy(spec, name)

    monkeypatch.setattr(runner, "run_policy", recording)
    assert targets.main([*args, "--set", "lr_hysteresis=0"]) == 0
    assert seen and all(value == 0.0 for _, value in seen)  # every candidate run, the gang's too
    assert {name for name, _ in seen} == {"hops"}  # no baseline ran again
    printed = capsys.readouterr().out
    assert "sia-lr:" not in printed  # the baselines came from the file
    assert json.loads(baselines.read_text()) == kept
    second = json.loads(out.read_text())
    assert second["set_lr_hysteresis"] == 0.0 and second["label"] == "hops lr_hysteresis=0"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--scenarios", "paper,bogus"], "--scenarios: 'paper,bogus': give some of"),
        (["--scenarios="], "--scenarios: '': give some of"),
        (["--policy", "bogus"], "--policy: 'bogus' unknown"),
        (["--gavel-traces", "d9"], "--gavel-traces: d9 unknown"),
        (["--gavel-traces="], "--gavel-traces: '' is empty"),
        (["--seeds="], "--seeds: '' is empty"),
        (["--seeds", "1,x"], "--seeds: 'x' is not a positive integer"),
        (["--seeds", "1.5"], "--seeds: '1.5' is not a positive integer"),
        (["--seeds", "nan"], "--seeds: 'nan' is not a positive integer"),
        (["--paper-jobs", "many"], "--paper-jobs: 'many' is not a positive integer"),
        (["--paper-rate", "-1"], "--paper-rate: '-1' is not a positive number"),
        (["--sweep-rates", "inf"], "--sweep-rates: 'inf' is not a positive number"),
        (["--paper-cluster", "nowhere.toml"], "--paper-cluster: no such file 'nowhere.toml'"),
        (["--set", "nonsense=1"], "--set: 'nonsense=1' is not KEY=VALUE"),
    ],
)
def test_bad_arguments_are_named(args: list[str], named: str) -> None:
    with pytest.raises(SystemExit, match=named):
        targets.main(args)


def test_no_run_beats_the_profiling_floor_of_the_worst_latency_ratio() -> None:
    """The floor the max-LR target is judged against holds for every policy that profiles first, and
    is reached only by a job that runs at once after its profile."""
    params = targets.Params(paper_cluster="configs/sim/paper-16.toml", paper_jobs=16, paper_rate=30.0)
    for seed in (1, 2):
        floor = targets.profiling_floor(params, seed)
        assert floor > 0
        for policy in ("hops", "hops-srtf-lr", "sia-lr", "gavel-lr", "fifo"):
            row = targets.paper_run(params, params.paper_rate, seed, policy, {})
            assert row["max_lr"] >= floor - 1e-9, (seed, policy, row["max_lr"], floor)
    # three jobs hours apart on an idle cluster each start right after their profile: the worst ratio is
    # the shortest job's, and equals the floor
    apart = replace(params, paper_jobs=3, paper_rate=0.2)
    for seed in (1, 2, 3):
        row = targets.paper_run(apart, apart.paper_rate, seed, "hops", {})
        assert row["max_lr"] == pytest.approx(targets.profiling_floor(apart, seed), rel=1e-6)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"paper/x": 3}'])
def test_a_bad_baselines_file_is_named_and_left_as_it_was(tmp_path: Path, text: str) -> None:
    baselines = tmp_path / "baselines.json"
    baselines.write_text(text)
    with pytest.raises(SystemExit, match=r"--baselines: .*baselines\.json"):
        targets.main(["--scenarios", "paper", "--baselines", str(baselines)])
    assert baselines.read_text() == text


def test_seed_lists_read_as_prose() -> None:
    assert [targets.joined(x) for x in ([1], [1, 3], [1, 2, 3])] == ["1", "1 and 3", "1, 2 and 3"]
