"""Synthetic workloads for the simulator: the Hops paper's Poisson generator and the workload-spec parser.

`poisson_workload` follows the paper's simulation (HOPS.md 9): Poisson arrivals, a model drawn uniformly
from the world's models, a requirement set from `REQUIREMENT_MENU` (1-16 GPUs, up to 8 choices, rigid
jobs too, power-of-two heavy) and a duration class from `DURATION_CLASSES`. A class fixes the job's GPU
time, drawn log-uniformly within the class bounds; GPU time is measured on the reference: the world's
true rate at the job's smallest GPU count on nominal servers of the middle GPU type (`reference_rate`),
so total_samples = GPU-hours x 3600 / R1 x reference rate(R1).

| class | GPU-hours on the reference | share | | requirement sets                           | share |
|-------|----------------------------|-------|-|--------------------------------------------|-------|
| S     | 0.1 - 1                    | 40 %  | | rigid {1} {2} {4} {8}                      | 29 %  |
| M     | 1 - 10                     | 30 %  | | pairs {1,2} {2,4} {4,8} {8,16}             | 27 %  |
| L     | 10 - 50                    | 20 %  | | {1,2,4} {2,4,8} {4,8,16} {1,2,3,4}         | 32 %  |
| XL    | 50 - 100                   | 10 %  | | {1,2,4,8} {1..8} {2,4..16} {1,2,4..12,16}  | 12 %  |

(The two tables sit side by side only to save space; the shares of sets are before the class filter.)
The set is drawn from the part of the menu that suits the class (`_fits_class`: L jobs ask for at
least 2 GPUs, XL jobs for at least 4, S jobs for at most 8), so GPU time and width are correlated.
The class mix (most jobs short, a long tail carrying most of the GPU time) is not given by the paper;
ours is chosen so that its 512-GPU scenario (500 jobs at 100/h) keeps the cluster as congested as the
paper reports (average waits near an hour under the baselines). Each
aspect (arrivals, models, sets, classes, tenants) draws from its own `random.Random` seeded from `seed`,
so the workload is deterministic per seed and changing one aspect does not shift the others.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from hopsmgr.core.model import JobSpec, RequirementSet
from hopsmgr.sim.truth import World

# (class, share, GPU-hours low, GPU-hours high)
DURATION_CLASSES: tuple[tuple[str, float, float, float], ...] = (
    ("S", 0.40, 0.1, 1.0),
    ("M", 0.30, 1.0, 10.0),
    ("L", 0.20, 10.0, 50.0),
    ("XL", 0.10, 50.0, 100.0),
)
# (GPU counts, share)
REQUIREMENT_MENU: tuple[tuple[tuple[int, ...], float], ...] = (
    ((1,), 0.14),
    ((2,), 0.06),
    ((4,), 0.05),
    ((8,), 0.04),
    ((1, 2), 0.10),
    ((2, 4), 0.08),
    ((4, 8), 0.06),
    ((8, 16), 0.03),
    ((1, 2, 4), 0.10),
    ((2, 4, 8), 0.10),
    ((4, 8, 16), 0.06),
    ((1, 2, 3, 4), 0.06),
    ((1, 2, 4, 8), 0.05),
    ((1, 2, 3, 4, 5, 6, 7, 8), 0.03),
    ((2, 4, 6, 8, 10, 12, 14, 16), 0.02),
    ((1, 2, 4, 6, 8, 10, 12, 16), 0.02),
)


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job of a workload: what arrives when, with which model, requirement set and total work.

    `priority_weight` and `slo` carry Gavel trace columns (1.0 and None elsewhere; `slo` as in the file).
    """

    job_id: str
    arrival_s: float
    model: str
    requirements: RequirementSet
    total_samples: float
    batch_size: int
    tenant: str = "default"
    duration_class: str = ""
    priority_weight: float = 1.0
    slo: float | None = None


def duration_class(gpu_hours: float) -> str:
    """S (< 1 GPU-hour), M (1-10), L (10-50) or XL (>= 50)."""
    for name, _, _, high in DURATION_CLASSES[:-1]:
        if gpu_hours < high:
            return name
    return DURATION_CLASSES[-1][0]


def reference_gpu_type(world: World, gpu_types: Sequence[str] = ()) -> str:
    """The middle of `gpu_types` (default: all of the world's types) in the world's slow-to-fast order."""
    known = world.gpu_types()
    if not gpu_types:
        return known[len(known) // 2]
    lower = {t.lower() for t in gpu_types}
    unknown = sorted(lower - set(known))
    if unknown:
        raise ValueError(f"unknown GPU type(s) {unknown} for the {world.name} world (known: {list(known)})")
    ordered = [t for t in known if t in lower]
    return ordered[len(ordered) // 2]


def reference_gpu_hours(world: World, job: WorkloadJob, gpu_type: str | None = None) -> float:
    """GPU-hours of `job` at its smallest GPU count on the world's reference servers."""
    gpus = job.requirements.minimum
    return job.total_samples / world.reference_rate(job.model, gpus, gpu_type) * gpus / 3600.0


def to_job_spec(job: WorkloadJob, world: World) -> JobSpec:
    """The `JobSpec` a user would submit for `job` (parameter size and restart cost from the world)."""
    model = world.model(job.model)
    return JobSpec(
        id=job.job_id,
        requirements=job.requirements,
        total_samples=job.total_samples,
        batch_size=job.batch_size,
        tenant=job.tenant,
        name=job.model,
        model=job.model,
        params_bytes=model.params_bytes,
        submit_time=job.arrival_s,
        restart_s=model.restart_s,
    )


def _weighted(rng: random.Random, items: Sequence[tuple[object, float]]) -> int:
    """Index of an item drawn with probability proportional to its weight."""
    return rng.choices(range(len(items)), weights=[w for _, w in items])[0]


def _fits_class(duration: str, counts: tuple[int, ...]) -> bool:
    """Longer jobs ask for more GPUs (as in Philly and the paper's mix, where a >50 GPU-hour job still
    finishes within the makespan): L jobs need at least 2 GPUs, XL jobs at least 4; S jobs at most 8."""
    if duration == "XL":
        return min(counts) >= 4
    if duration == "L":
        return min(counts) >= 2
    if duration == "S":
        return max(counts) <= 8
    return True


def _check_jobs_and_rate(jobs: object, rate_per_hour: object) -> None:
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 0:
        raise ValueError(f"jobs must be a non-negative integer, got {jobs!r}")
    if not (isinstance(rate_per_hour, (int, float)) and math.isfinite(rate_per_hour) and rate_per_hour > 0):
        raise ValueError(f"rate_per_hour must be a positive number, got {rate_per_hour!r}")


def poisson_workload(
    world: World,
    jobs: int,
    rate_per_hour: float,
    seed: int,
    tenants: Sequence[str] = ("default",),
    gpu_types: Sequence[str] = (),
) -> list[WorkloadJob]:
    """`jobs` jobs with Poisson arrivals at `rate_per_hour` (the first at t = 0), as the module describes.

    `gpu_types` names the cluster's GPU types (default: all of the world's): the middle one is the
    reference type on which the duration classes are measured.
    """
    _check_jobs_and_rate(jobs, rate_per_hour)
    if not tenants or any(not t for t in tenants):
        raise ValueError(f"tenants must be a non-empty list of non-empty names, got {list(tenants)!r}")
    ref_type = reference_gpu_type(world, gpu_types)
    models = world.models()
    streams = {a: random.Random(f"{seed}:{a}") for a in ("arrivals", "models", "sets", "classes", "tenants")}
    out: list[WorkloadJob] = []
    now = 0.0
    for i in range(jobs):
        if i:
            now += streams["arrivals"].expovariate(rate_per_hour / 3600.0)
        model = models[streams["models"].randrange(len(models))]
        rng = streams["classes"]
        name, _, low, high = DURATION_CLASSES[_weighted(rng, [(c, c[1]) for c in DURATION_CLASSES])]
        menu = [entry for entry in REQUIREMENT_MENU if _fits_class(name, entry[0])]
        counts = menu[_weighted(streams["sets"], menu)][0]
        requirements = RequirementSet(counts)
        gpu_hours = math.exp(rng.uniform(math.log(low), math.log(high)))
        r1 = requirements.minimum
        total = gpu_hours * 3600.0 / r1 * world.reference_rate(model.name, r1, ref_type)
        out.append(
            WorkloadJob(
                job_id=f"j{i:05d}",
                arrival_s=now,
                model=model.name,
                requirements=requirements,
                total_samples=total,
                batch_size=model.batch_size,
                tenant=tenants[streams["tenants"].randrange(len(tenants))],
                duration_class=name,
            )
        )
    return out


# [ours] The gang scenario (issue 13): GPU-hours of the flood's 1-GPU jobs (class S) and of the big jobs.
GANG_SMALL_GPU_HOURS = (0.1, 1.0)
GANG_BIG_GPU_HOURS = (8.0, 64.0)


def gang_workload(
    world: World,
    jobs: int,
    rate_per_hour: float,
    seed: int,
    big_every: int = 40,
    big: Sequence[int] = (16, 32),
    tenants: Sequence[str] = ("default",),
) -> list[WorkloadJob]:
    """A flood of short rigid 1-GPU jobs with a rigid big gang job every `big_every`-th arrival, its
    width cycling through `big` (16, 32, 16, ...): the workload where a big job waits behind small
    ones that always fit first. Poisson arrivals at `rate_per_hour`; GPU-hours log-uniform within
    GANG_SMALL_GPU_HOURS and GANG_BIG_GPU_HOURS on the reference type (as in `poisson_workload`)."""
    _check_jobs_and_rate(jobs, rate_per_hour)
    if not isinstance(big_every, int) or big_every < 1:
        raise ValueError(f"big_every must be a positive integer, got {big_every!r}")
    if not big or any(not isinstance(n, int) or n < 1 for n in big):
        raise ValueError(f"big must be GPU counts >= 1, got {list(big)!r}")
    ref_type = reference_gpu_type(world)
    models = world.models()
    streams = {a: random.Random(f"{seed}:gang:{a}") for a in ("arrivals", "models", "hours", "tenants")}
    out: list[WorkloadJob] = []
    now = 0.0
    for i in range(jobs):
        if i:
            now += streams["arrivals"].expovariate(rate_per_hour / 3600.0)
        model = models[streams["models"].randrange(len(models))]
        is_big = (i + 1) % big_every == 0
        width = big[((i + 1) // big_every - 1) % len(big)] if is_big else 1
        low, high = GANG_BIG_GPU_HOURS if is_big else GANG_SMALL_GPU_HOURS
        gpu_hours = math.exp(streams["hours"].uniform(math.log(low), math.log(high)))
        total = gpu_hours * 3600.0 / width * world.reference_rate(model.name, width, ref_type)
        out.append(
            WorkloadJob(
                job_id=f"j{i:05d}",
                arrival_s=now,
                model=model.name,
                requirements=RequirementSet((width,)),
                total_samples=total,
                batch_size=model.batch_size,
                tenant=tenants[streams["tenants"].randrange(len(tenants))],
                duration_class=duration_class(gpu_hours),
            )
        )
    return out


# value kinds: "count" positive integer, "int" non-negative integer, "rate" positive number, "names" a|b
_SPEC_KEYS: dict[str, dict[str, str]] = {
    "poisson": {"jobs": "count", "rate": "rate", "seed": "int", "tenants": "names", "gpu_types": "names"},
    "gang": {
        "jobs": "count",
        "rate": "rate",
        "seed": "int",
        "big_every": "count",
        "big": "counts",
        "tenants": "names",
    },
    "gavel": {"path": "str", "tenant": "str"},
    "philly": {"path": "str", "seed": "int", "limit": "count"},
    "tiresias": {"path": "str", "seed": "int"},
}
_REQUIRED = {
    "poisson": ("jobs", "rate"),
    "gang": ("jobs", "rate"),
    "gavel": ("path",),
    "philly": ("path",),
    "tiresias": ("path",),
}
_WHAT = {
    "count": "a positive integer",
    "int": "a non-negative integer",
    "rate": "a positive number",
    "names": "names separated by '|'",
    "counts": "positive integers separated by '|'",
    "str": "non-empty",
}


def _spec_value(spec: str, key: str, text: str, kind: str) -> object:
    value: object = text
    try:
        if kind in ("count", "int"):
            value = number = int(text)
            ok = number > 0 or (kind == "int" and number == 0)
        elif kind == "rate":
            value = rate = float(text)
            ok = math.isfinite(rate) and rate > 0
        elif kind == "counts":
            value = counts = tuple(int(t) for t in text.split("|") if t.strip())
            ok = bool(counts) and all(n > 0 for n in counts)
        elif kind == "names":
            value = names = tuple(t.strip() for t in text.split("|") if t.strip())
            ok = bool(names)
        else:
            ok = bool(text)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"workload spec {spec!r}: {key} must be {_WHAT[kind]}, got {text!r}")
    return value


def parse_workload_spec(spec: str) -> dict[str, object]:
    """'poisson:jobs=500,rate=100' -> {'kind': 'poisson', 'jobs': 500, 'rate': 100.0}.

    Kinds and keys: poisson (jobs, rate; optional seed, tenants=a|b, gpu_types=x|y), gang (jobs, rate;
    optional seed, big_every, big=16|32, tenants=a|b), gavel (path; optional
    tenant), philly (path; optional seed, limit), tiresias (path; optional seed). A path may not contain ','.
    A malformed spec raises ValueError naming the offending part.
    """
    kind, sep, rest = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in _SPEC_KEYS:
        raise ValueError(f"workload spec {spec!r}: unknown kind {kind!r} (known: {', '.join(_SPEC_KEYS)})")
    out: dict[str, object] = {"kind": kind}
    for part in (p.strip() for p in rest.split(",")) if sep and rest.strip() else ():
        key, eq, text = part.partition("=")
        key, text = key.strip(), text.strip()
        if not eq or not key:
            raise ValueError(f"workload spec {spec!r}: part {part!r} is not key=value")
        if key not in _SPEC_KEYS[kind]:
            known = ", ".join(_SPEC_KEYS[kind])
            raise ValueError(f"workload spec {spec!r}: unknown key {key!r} for {kind} (known: {known})")
        if key in out:
            raise ValueError(f"workload spec {spec!r}: key {key!r} given twice")
        out[key] = _spec_value(spec, key, text, _SPEC_KEYS[kind][key])
    missing = [k for k in _REQUIRED[kind] if k not in out]
    if missing:
        raise ValueError(f"workload spec {spec!r}: missing {', '.join(missing)}")
    return out
