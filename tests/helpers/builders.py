"""Builders of core values for tests: job specs, views, servers and cluster snapshots with short defaults.

One place instead of a copy in every test file; each takes only what a test varies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hopsmgr.core.model import Calibration, ClusterSnapshot, JobSpec, JobView, RequirementSet, Server


def job_spec(
    job_id: str = "j",
    counts: Sequence[int] = (1,),
    *,
    samples: float = 1e6,
    batch: int = 32,
    submit: float = 0.0,
    **fields: Any,
) -> JobSpec:
    """A job that can run on any of `counts` GPUs, with `samples` of work (other JobSpec fields by name)."""
    return JobSpec(
        job_id,
        RequirementSet.of(counts),
        total_samples=samples,
        batch_size=batch,
        submit_time=submit,
        **fields,
    )


def job_view(job_id: str, *counts: int, **view: Any) -> JobView:
    """A view of a job with default spec (job_spec) that can run on any of `counts` GPUs."""
    return JobView(job_spec(job_id, counts or (1,)), **view)


def server(sid: str, gpu_type: str = "V100", gpus: int = 8, **calibration: float) -> Server:
    """A server of `gpus` GPUs; keyword arguments are its calibration factors."""
    return Server(id=sid, gpu_type=gpu_type, gpus=gpus, calibration=Calibration(**calibration))


def snapshot(servers: Sequence[Server], views: Sequence[JobView], now: float = 0.0) -> ClusterSnapshot:
    """Every server fully free, these jobs, at `now`."""
    return ClusterSnapshot(tuple(servers), {s.id: s.gpus for s in servers}, tuple(views), now)
