"""Synthetic, seeded planning instances: heterogeneous clusters and busy queues.

Used by the planner's tests and bench/planner_scale.py (and handy in a REPL): servers of several GPU
types with per-server calibration variation, jobs with mixed requirement sets and synthetic profiles,
about half of the GPUs held by running jobs. Pure: randomness comes from the `random.Random` passed in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import Calibration, ClusterSnapshot, Config, JobSpec, JobView, RequirementSet, Server

TYPE_SPEED = {"k80": 0.35, "p100": 0.8, "v100": 1.0, "t4": 0.55, "a100": 2.0}
REQUIREMENT_SETS = (
    (1,),
    (1, 2),
    (2,),
    (1, 2, 4),
    (2, 4),
    (4,),
    (2, 4, 8),
    (4, 8),
    (8,),
    (4, 8, 16),
    (1, 2, 3, 4),
)


@dataclass(frozen=True, slots=True)
class Instance:
    snapshot: ClusterSnapshot
    estimator: Estimator


def make_servers(rng: random.Random, gpus: int, types: int = 4) -> list[Server]:
    names = list(TYPE_SPEED)[: max(1, min(types, len(TYPE_SPEED)))]
    servers: list[Server] = []
    total = 0
    k = 0
    while total < gpus:
        gpu_type = names[k % len(names)]
        size = rng.choice((4, 8, 8))
        size = min(size, gpus - total) if gpus - total < 4 else size
        host = rng.choice(("a", "b"))
        cal = Calibration(
            compute_factor=round(rng.lognormvariate(0, 0.05), 3),
            data_factor=round(rng.lognormvariate(0, 0.1) * (1.15 if host == "b" else 1.0), 3),
            link_gbps=24.0 if gpu_type in ("a100", "v100") else 12.0,
            net_gbps=12.5,
            source="hint",
        )
        servers.append(Server(f"{gpu_type}-{k:04d}", gpu_type, size, cal, host_model=host, order=k))
        total += size
        k += 1
    return servers


def make_job(rng: random.Random, k: int, now: float) -> JobSpec:
    reqs = RequirementSet.of(rng.choice(REQUIREMENT_SETS))
    return JobSpec(
        id=f"job-{k:05d}",
        requirements=reqs,
        total_samples=rng.uniform(1e5, 5e7),
        batch_size=rng.choice((32, 64, 128)),
        tenant=rng.choice(("vision", "nlp")),
        params_bytes=rng.choice((25e6, 100e6, 350e6, 1.4e9)),
        submit_time=now - rng.uniform(0, 36_000),
        restart_s=rng.uniform(20, 120),
    )


def profile_for(rng: random.Random, gpu_type: str) -> TimeProfile:
    speed = TYPE_SPEED.get(gpu_type, 1.0)
    tf = rng.uniform(0.02, 0.2) / speed
    return TimeProfile(
        tf_s=tf,
        tb_s=2 * tf,
        tu_s=0.1 * tf,
        td_hit_s=rng.uniform(0.005, 0.05),
        td_miss_s=rng.uniform(0.05, 0.4),
        p_cache=rng.uniform(0.5, 1.0),
        pattern=rng.choice((1, 1, 2)),
    )


def busy_instance(seed: int, gpus: int, queued: int, types: int = 4, busy_fraction: float = 0.5) -> Instance:
    """A busy round: `queued` waiting jobs, running jobs holding about `busy_fraction` of the GPUs."""
    rng = random.Random(seed)
    now = 100_000.0
    servers = make_servers(rng, gpus, types)
    estimator = Estimator()
    present = sorted({s.gpu_type for s in servers})
    reference = Calibration()
    views: list[JobView] = []
    free = {s.id: s.gpus for s in servers}
    held = 0
    k = 0
    # Running jobs first: placed on one server each (or spanning two when large).
    while held < busy_fraction * gpus:
        spec = make_job(rng, k, now)
        k += 1
        gpus_wanted = spec.requirements.minimum
        host = next((s for s in rng.sample(servers, len(servers)) if free[s.id] >= gpus_wanted), None)
        if host is None:
            break
        free[host.id] -= gpus_wanted
        held += gpus_wanted
        for t in present:
            estimator.add_profile(spec.id, t, profile_for(rng, t), reference)
        views.append(
            JobView(
                spec,
                done_samples=spec.total_samples * rng.uniform(0, 0.8),
                waited_s=rng.uniform(0, 3600),
                running_s=(ran := rng.uniform(60, 7200)),
                attempt_s=ran,
                current=Config.single(host.id, gpus_wanted),
            )
        )
    for _ in range(queued):
        spec = make_job(rng, k, now)
        k += 1
        for t in present:
            estimator.add_profile(spec.id, t, profile_for(rng, t), reference)
        views.append(JobView(spec, waited_s=max(0.0, now - spec.submit_time)))
    snapshot = ClusterSnapshot(
        servers=tuple(servers), capacity={s.id: s.gpus for s in servers}, jobs=tuple(views), now=now
    )
    return Instance(snapshot, estimator)
