"""Issue 13's targets in one command: one candidate (a policy and [scheduler] settings) against each.

Runs the candidate on every scenario the issue's targets name, beside the baselines they compare it
with, and prints a scoreboard: each target, what was measured (per seed, trace or rate) and whether it
is met. The scenarios:

  paper  configs/sim/paper-512.toml, 500 jobs at 100/h, seeds 1-3, against Sia-LR and Gavel-LR:
         average JCT <= 0.75x the better baseline's; makespan below both; max latency ratio <= 1/10 of
         either's (printed beside it: the floor each job's 60-s profiling run sets on it); preemptions
         no more than Sia-LR's; under 1 idle GPU per round while work waits (`frags_per_waiting_round`,
         the stricter reading; HOPS.md's `frags_per_round` is printed too);
  gavel  Gavel's reference traces d1-d3 (../shared/data/gavel/reference/, `--gavel-compat`, seed 0, on
         the clusters of that README): average JCT <= 0.8x Gavel's own best policy's, and our `gavel`
         baseline within 10% of Gavel's own max_min_fairness_perf (the baseline's fidelity);
  sweep  paper-512, 500 jobs, seed 1, at 30/100/300/1200 per hour: the lead over Sia-LR (1 - JCT / Sia-LR's
         JCT) grows with the rate (met when its least-squares slope against the log of the rate is
         positive and the lead at every higher rate is above the lowest rate's: one run per rate, so
         a step down between two higher rates is allowed);
  gang   configs/sim/paper-64.toml, `gang:jobs=800,rate=R,big_every=40` at 60 and 100/h, seeds 1-10
         (bench/gang.py's runs): the big jobs' worst latency ratio within 2x the 1-GPU jobs' on every
         run, and under 5% of backfilled attempts delaying a reservation on every run that backfilled
         (with nothing backfilled, e.g. reservations off, that target does not apply).

A target is met only where it holds on every seed, trace and run. The baselines do not depend on the
candidate: `--baselines FILE` keeps their rows (keyed by scenario, seed and policy) and reuses them,
so that a second candidate runs only its own simulations. Example:

    python bench/targets.py --policy hops --set critical_path=true --baselines bench/results/baselines.json \
        --json bench/results/targets-critical-path.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hopsmgr.config import ClusterConfig
from hopsmgr.core.priority import expected_run_s
from hopsmgr.sim import runner
from hopsmgr.sim.outcome import true_context
from hopsmgr.sim.simstate import SimOptions, job_truths

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # gang.py beside this script (when loaded by the tests)

import gang  # noqa: E402

GAVEL_REFERENCE = ROOT.parent / "shared" / "data" / "gavel" / "reference"
# Gavel's README: V100:P100:K80 GPU counts and GPUs per server of each reference run
GAVEL_CLUSTERS = {
    "d1": "v100=1x4,p100=1x4,k80=1x4",
    "d2": "v100=3x2,p100=3x2,k80=3x2",
    "d3": "v100=2x4,p100=2x4,k80=2x4",
}
SCENARIOS = ("paper", "gavel", "sweep", "gang")

JCT_SHARE = 0.75  # of the better of Sia-LR's and Gavel-LR's average JCT
MAX_LR_SHARE = 0.1
GAVEL_SHARE = 0.8  # of Gavel's own best policy's average JCT
FIDELITY = 0.1
IDLE_PER_ROUND = 1.0
BACKFILL_LATE_SHARE = 0.05
# the candidate's figures per run kept in the JSON
RUN_FIELDS = ("avg_jct_h", "makespan_h", "max_lr", "preemptions", "migrations", "max_lr_big", "max_lr_1gpu")


@dataclass(frozen=True)
class Params:
    """The scenarios' sizes: the issue's by default; smaller ones only for the tests' smoke run."""

    paper_cluster: str = "configs/sim/paper-512.toml"
    paper_jobs: int = 500
    paper_rate: float = 100.0
    seeds: tuple[int, ...] = (1, 2, 3)
    sweep_rates: tuple[float, ...] = (30.0, 300.0, 1200.0)
    gavel_traces: tuple[str, ...] = ("d1", "d2", "d3")
    gang_cluster: str = "configs/sim/paper-64.toml"
    gang_jobs: int = 800
    gang_rates: tuple[float, ...] = (60.0, 100.0)
    gang_seeds: tuple[int, ...] = tuple(range(1, 11))
    gang_big_every: int = 40


@dataclass(frozen=True)
class Target:
    """One target's verdict: `met` is None where it does not apply (nothing it speaks of happened)."""

    name: str
    measured: str
    met: bool | None


def with_settings(cluster: ClusterConfig, overrides: dict[str, Any]) -> ClusterConfig:
    """`cluster` with these [scheduler] settings changed."""
    return replace(cluster, scheduler=replace(cluster.scheduler, **overrides)) if overrides else cluster


def paper_run(
    params: Params, rate: float, seed: int, policy: str, overrides: dict[str, Any]
) -> dict[str, Any]:
    """One run of the paper scenario at `rate` (`runner.summarise`'s row)."""
    cluster = with_settings(runner.parse_cluster(str(ROOT / params.paper_cluster)), overrides)
    world = runner.make_world("paper", cluster, seed, None)
    workload = runner.load_workload(
        world, f"poisson:jobs={params.paper_jobs},rate={rate:g}", None, None, seed
    )
    spec = runner.RunSpec(cluster, world, workload, (policy,), seed=seed)
    t0 = time.perf_counter()
    return runner.summarise(runner.run_policy(spec, policy), time.perf_counter() - t0)


def gavel_run(trace: str, policy: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """One run of a Gavel reference trace in `--gavel-compat` mode on its cluster, seed 0."""
    cluster = with_settings(runner.parse_cluster(GAVEL_CLUSTERS[trace]), overrides)
    world = runner.make_world(None, cluster, 0, None, variation=False)
    workload = runner.load_workload(world, None, str(GAVEL_REFERENCE / f"{trace}.trace"), "gavel", 0)
    spec = runner.RunSpec(cluster, world, workload, (policy,), seed=0, gavel_compat=True)
    t0 = time.perf_counter()
    return runner.summarise(runner.run_policy(spec, policy), time.perf_counter() - t0)


def gavel_reference() -> dict[str, dict[str, float]]:
    """Gavel's own simulator's average JCT (h) per trace and policy."""
    data = json.loads((GAVEL_REFERENCE / "results.json").read_text())
    return {t: {p: float(r["avg_jct_h"]) for p, r in v["policies"].items()} for t, v in data.items()}


class Runs:
    """The scenarios' runs, each made once: the candidate's (asked for as "candidate") always, the
    baselines' (asked for by policy name) from the cache where it has them."""

    def __init__(self, params: Params, policy: str, overrides: dict[str, Any], cache: dict[str, Any]) -> None:
        self.params, self.policy, self.overrides, self.cache = params, policy, overrides, cache
        self.candidate: dict[str, Any] = {}

    def _paper_key(self, rate: float, seed: int, policy: str) -> str:
        p = self.params
        return f"paper/{p.paper_cluster}/jobs={p.paper_jobs},rate={rate:g}/seed={seed}/{policy}"

    def _kept(self, runs: dict[str, Any], key: str, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`runs[key]`, made (and printed) the first time it is asked for."""
        if key not in runs:
            runs[key] = make()
            print_run(key, runs[key])
        return dict(runs[key])

    def paper(self, rate: float, seed: int, policy: str) -> dict[str, Any]:
        name, overrides, runs = self._whose(policy)
        key = self._paper_key(rate, seed, name)
        return self._kept(runs, key, lambda: paper_run(self.params, rate, seed, name, overrides))

    def gavel(self, trace: str, policy: str) -> dict[str, Any]:
        name, overrides, runs = self._whose(policy)
        return self._kept(runs, f"gavel/{trace}/{name}", lambda: gavel_run(trace, name, overrides))

    def _whose(self, policy: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """The policy, settings and store of "candidate" or of a baseline named by its policy."""
        if policy == "candidate":
            return self.policy, self.overrides, self.candidate
        return policy, {}, self.cache

    def gang(self, rate: float, seed: int) -> dict[str, Any]:
        p = self.params
        spec = f"gang:jobs={p.gang_jobs},rate={rate:g},big_every={p.gang_big_every}"
        row = gang.one_run(str(ROOT / p.gang_cluster), spec, seed, self.policy, self.overrides)
        self.candidate[f"gang/{spec}/seed={seed}/{self.policy}"] = row
        print(
            f"  {spec} seed {seed}: big jobs' worst LR {row['max_lr_big']:.2f}, 1-GPU jobs' "
            f"{row['max_lr_1gpu']:.2f}, backfills {row['backfills']} (late {row['backfills_late']}), "
            f"{row['wall_s']:.0f} s",
            flush=True,
        )
        return row


def print_run(key: str, row: dict[str, Any]) -> None:
    print(
        f"  {key}: JCT {row['avg_jct_h']:.3f} h, makespan {row['makespan_h']:.2f} h, max LR "
        f"{row['max_lr']:.2f}, preemptions {row['preemptions']}, moves {row['migrations']}, "
        f"{row['wall_s']:.0f} s",
        flush=True,
    )


def joined(items: list[int]) -> str:
    *most, last = map(str, items)
    return f"{', '.join(most)} and {last}" if most else last


def per_seed(values: Sequence[float | None], digits: int = 3) -> str:
    return " / ".join("-" if v is None else f"{v:.{digits}f}" for v in values)


def share(value: float, of: float) -> float:
    """value / of, infinite where `of` is 0 (a baseline that waited or ran for nothing)."""
    return value / of if of > 0 else math.inf


def profiling_floor(params: Params, seed: int) -> float:
    """The lowest worst latency ratio any scheduler that profiles each job before its first run can
    reach on the paper scenario: a job's wait includes its profiling run (`SimOptions.profile_s`), so
    no job's ratio is below that run over its expected run time (the records' own formula, with the
    world's true speeds)."""
    cluster = runner.parse_cluster(str(ROOT / params.paper_cluster))
    world = runner.make_world("paper", cluster, seed, None)
    workload = runner.load_workload(
        world, f"poisson:jobs={params.paper_jobs},rate={params.paper_rate:g}", None, None, seed
    )
    jobs = job_truths(world, workload, restart_costs=True)
    context = true_context(world, cluster.servers, jobs, 0.0)
    shortest = min(expected_run_s(job.spec, context) for job in jobs)
    return SimOptions().profile_s / shortest


def paper_targets(runs: Runs) -> list[Target]:
    """The five paper-512 targets, each judged on every seed."""
    p = runs.params
    rows = [
        (
            runs.paper(p.paper_rate, s, "candidate"),
            runs.paper(p.paper_rate, s, "sia-lr"),
            runs.paper(p.paper_rate, s, "gavel-lr"),
        )
        for s in p.seeds
    ]
    jct = [share(c["avg_jct_h"], min(sia["avg_jct_h"], gav["avg_jct_h"])) for c, sia, gav in rows]
    makespan = [share(c["makespan_h"], min(sia["makespan_h"], gav["makespan_h"])) for c, sia, gav in rows]
    lr = [share(c["max_lr"], min(sia["max_lr"], gav["max_lr"])) for c, sia, gav in rows]
    allowed = [MAX_LR_SHARE * min(sia["max_lr"], gav["max_lr"]) for _, sia, gav in rows]
    floor = [profiling_floor(p, s) for s in p.seeds]
    out_of_reach = [s for s, f, a in zip(p.seeds, floor, allowed, strict=True) if f > a]
    pre = [(c["preemptions"], sia["preemptions"]) for c, sia, _ in rows]
    idle = [c["frags_per_waiting_round"] for c, _, _ in rows]
    per_round = [c["frags_per_round"] for c, _, _ in rows]
    return [
        Target(
            "paper avg JCT <= 0.75x the better baseline",
            f"{per_seed(jct)}x",
            all(x <= JCT_SHARE for x in jct),
        ),
        Target(
            "paper makespan below both baselines",
            f"{per_seed(makespan)}x the shorter",
            all(x < 1 for x in makespan),
        ),
        Target(
            "paper max LR <= 1/10 of either baseline's",
            f"{per_seed(lr)}x the lower; allowed {per_seed(allowed, 2)}, the profiling run alone gives "
            f"{per_seed(floor, 2)}"
            + (
                f" (out of reach on seed{'s' if len(out_of_reach) > 1 else ''} {joined(out_of_reach)})"
                if out_of_reach
                else ""
            ),
            all(x <= MAX_LR_SHARE for x in lr),
        ),
        Target(
            "paper preemptions <= Sia-LR's",
            " / ".join(f"{c} vs {s}" for c, s in pre),
            all(c <= s for c, s in pre),
        ),
        Target(
            "paper < 1 idle GPU per round while work waits",
            f"{per_seed(idle, 2)} (every round: {per_seed(per_round, 2)})",
            all(x is None or x < IDLE_PER_ROUND for x in idle),  # None: no round had work waiting
        ),
    ]


def gavel_targets(runs: Runs) -> list[Target]:
    """Gavel's traces: the candidate against Gavel's own best policy, our gavel against its own
    max_min_fairness_perf (on d1 that policy dropped 2 of the 100 jobs and averages over the 98 left)."""
    reference = gavel_reference()
    traces = runs.params.gavel_traces
    shares = [share(runs.gavel(t, "candidate")["avg_jct_h"], min(reference[t].values())) for t in traces]
    fidelity = [
        share(runs.gavel(t, "gavel")["avg_jct_h"], reference[t]["max_min_fairness_perf"]) for t in traces
    ]
    return [
        Target(
            "Gavel traces avg JCT <= 0.8x Gavel's best",
            f"{per_seed(shares)}x",
            all(x <= GAVEL_SHARE for x in shares),
        ),
        Target(
            "our gavel within 10% of Gavel's max_min_fairness_perf",
            f"{per_seed(fidelity)}x",
            all(abs(x - 1) <= FIDELITY for x in fidelity),
        ),
    ]


def sweep_targets(runs: Runs) -> list[Target]:
    """The lead over Sia-LR at each rate, seed 1 (the paper scenario's first seed)."""
    p = runs.params
    rates = sorted({*p.sweep_rates, p.paper_rate})
    seed = p.seeds[0]
    leads = [
        1 - share(runs.paper(r, seed, "candidate")["avg_jct_h"], runs.paper(r, seed, "sia-lr")["avg_jct_h"])
        for r in rates
    ]
    slope = _slope([math.log(r) for r in rates], leads)
    grows = slope > 0 and all(lead > leads[0] for lead in leads[1:])
    measured = " / ".join(f"{lead:+.1%} at {rate:g}/h" for rate, lead in zip(rates, leads, strict=True))
    return [
        Target(
            "sweep lead over Sia-LR grows with the rate", f"{measured} (slope {slope:+.3f} per e-fold)", grows
        )
    ]


def _slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var > 0 else 0.0


def gang_targets(runs: Runs) -> list[Target]:
    """The gang scenario: the big-job target on every run; the backfill target on every run that
    backfilled (it does not apply where nothing was backfilled, e.g. with reservations off)."""
    p = runs.params
    rows = [runs.gang(r, s) for r in p.gang_rates for s in p.gang_seeds]
    summary = gang.summarise(rows)
    missed = sum(r["missed"] for r in summary)
    worst = max(r["worst_ratio"] for r in summary)
    backfilled = [r for r in rows if r["backfills"]]
    late = sum(r["backfills_late"] for r in backfilled)
    shares = [r["backfills_late"] / r["backfills"] for r in backfilled]
    return [
        Target(
            "gang big jobs' worst LR <= 2x the 1-GPU jobs'",
            f"missed on {missed} of {len(rows)} runs (worst ratio {worst:.2f})",
            missed == 0,
        ),
        Target(
            "gang < 5% of backfills delay a reservation",
            f"{late} of {sum(r['backfills'] for r in backfilled)} late, worst run {max(shares):.1%}"
            if backfilled
            else "no backfills: does not apply",
            all(x < BACKFILL_LATE_SHARE for x in shares) if backfilled else None,
        ),
    ]


SCORERS: dict[str, Callable[[Runs], list[Target]]] = {
    "paper": paper_targets,
    "gavel": gavel_targets,
    "sweep": sweep_targets,
    "gang": gang_targets,
}


def scoreboard(runs: Runs, scenarios: tuple[str, ...]) -> list[Target]:
    """Every target of these scenarios, in SCENARIOS' order."""
    return [target for name in scenarios for target in SCORERS[name](runs)]


def flat_row(label: str, targets: list[Target], runs: Runs, wall_s: float) -> dict[str, Any]:
    """The run as one flat object: per target its figures and whether it is met (None: it does not
    apply), how many of those that apply are met, and the candidate's runs' main figures."""
    out: dict[str, Any] = {"label": label, "policy": runs.policy, "wall_s": round(wall_s, 1)}
    out.update({f"set_{k}": v for k, v in runs.overrides.items()})
    out["targets_met"] = sum(t.met is True for t in targets)
    out["targets_applying"] = sum(t.met is not None for t in targets)
    out["targets"] = len(targets)
    for t in targets:
        out[f"met: {t.name}"] = t.met
        out[f"measured: {t.name}"] = t.measured
    for key, row in runs.candidate.items():
        for field in RUN_FIELDS:
            if field in row:
                out[f"{key} {field}"] = row[field]
    return out


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"{option}: {text!r} is not a comma-separated list of numbers") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", default="hops", help="one of " + ", ".join(runner.POLICY_NAMES))
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a [scheduler] setting"
    )
    parser.add_argument("--label", help="the row's name (default: the policy and its settings)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="a subset of " + ",".join(SCENARIOS))
    parser.add_argument("--baselines", type=Path, help="the baselines' rows: read if there, written back")
    parser.add_argument("--json", type=Path, help="write the scoreboard here (one flat object)")
    for field, value in Params().__dict__.items():  # the smoke run's smaller sizes
        flag = "--" + field.replace("_", "-")
        shown = (
            ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in value)
            if isinstance(value, tuple)
            else value
        )
        parser.add_argument(flag, default=None, help=f"default {shown}")
    args = parser.parse_args(argv)
    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        raise SystemExit(f"--scenarios: {args.scenarios!r}: give some of {', '.join(SCENARIOS)}")
    if args.policy not in runner.POLICY_NAMES:
        raise SystemExit(f"--policy: {args.policy!r} unknown (known: {', '.join(runner.POLICY_NAMES)})")
    params = _params(args)
    overrides = dict(gang.setting(item) for item in args.set)
    label = args.label or " ".join([args.policy, *args.set])
    cache = _read_baselines(args.baselines)
    runs = Runs(params, args.policy, overrides, cache)
    t0 = time.perf_counter()
    try:
        targets = scoreboard(runs, scenarios)
    except runner.SimInputError as exc:  # a size or cluster the simulator refuses, named as it reads it
        raise SystemExit(f"targets: {exc}") from None
    finally:
        if args.baselines is not None:
            args.baselines.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    wall = time.perf_counter() - t0
    applying = sum(t.met is not None for t in targets)
    met = sum(t.met is True for t in targets)
    print(f"\n{label}: {met} of the {applying} targets that apply met, of {len(targets)} ({wall:.0f} s)")
    for t in targets:
        mark = "n/a" if t.met is None else "met" if t.met else "   "
        print(f"  [{mark}] {t.name}: {t.measured}")
    if args.json is not None:
        args.json.write_text(json.dumps(flat_row(label, targets, runs, wall), indent=1) + "\n")
    return 0


def _read_baselines(path: Path | None) -> dict[str, Any]:
    """The kept baselines' rows, or an exit naming the file (which is then left as it was)."""
    if path is None or not path.exists():
        return {}
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--baselines: cannot read {str(path)!r}: {exc}") from None
    if not (isinstance(cache, dict) and all(isinstance(row, dict) for row in cache.values())):
        raise SystemExit(f"--baselines: {str(path)!r} is not an object of runs keyed by scenario")
    return cache


def _params(args: argparse.Namespace) -> Params:
    """The sizes given on the command line, checked: lists not empty, numbers finite and positive."""
    changed: dict[str, Any] = {}
    for field, default in Params().__dict__.items():
        text = getattr(args, field)
        if text is None:
            continue
        option = "--" + field.replace("_", "-")
        if isinstance(default, tuple):
            items = [x.strip() for x in text.split(",") if x.strip()]
            if not items:
                raise SystemExit(f"{option}: {text!r} is empty")
            changed[field] = (
                tuple(items)
                if isinstance(default[0], str)
                else tuple(_number(x, type(default[0]), option) for x in items)
            )
        elif isinstance(default, str):
            changed[field] = text
        else:
            changed[field] = _number(text, type(default), option)
    params = replace(Params(), **changed)
    for option, path in (("--paper-cluster", params.paper_cluster), ("--gang-cluster", params.gang_cluster)):
        if not (ROOT / path).is_file():
            raise SystemExit(f"{option}: no such file {path!r} (paths are relative to {ROOT})")
    unknown = [t for t in params.gavel_traces if t not in GAVEL_CLUSTERS]
    if unknown:
        raise SystemExit(f"--gavel-traces: {', '.join(unknown)} unknown (known: {', '.join(GAVEL_CLUSTERS)})")
    return params


def _number(text: str, kind: type, option: str) -> Any:
    """A positive finite int or float, or an exit naming the option and the value."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0) or (kind is int and value != int(value)):
        name = "a positive integer" if kind is int else "a positive number"
        raise SystemExit(f"{option}: {text!r} is not {name}")
    return int(value) if kind is int else value


if __name__ == "__main__":
    raise SystemExit(main())
