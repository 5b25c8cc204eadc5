"""The estimator interface the planner, the priorities and the policies read (a typing Protocol).

`hopsmgr.core.estimator.Estimator` (the Hops three-layer database) implements it; so does the
simulator's ground-truth oracle (`hopsmgr.sim.oracle`). Only reads are here: learning (profiles,
observations) belongs to whoever owns the concrete estimator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from hopsmgr.core.model import Calibration, Config, GpuType, JobId, JobSpec, Server, ServerId


@runtime_checkable
class Estimator(Protocol):
    def has_profile(self, job_id: JobId, gpu_type: GpuType) -> bool:
        """Whether the job has a throughput profile on this GPU type."""
        ...

    def profiled_types(self, job_id: JobId) -> frozenset[GpuType]:
        """The GPU types the job has a profile on."""
        ...

    def per_gpu_rate(self, job: JobSpec, server: Server, gpus_here: int, n_servers: int = 1) -> float | None:
        """Samples/s of one GPU of `job` on `server`, holding `gpus_here` there, over `n_servers` servers."""
        ...

    def config_rate(self, job: JobSpec, config: Config, servers: Mapping[ServerId, Server]) -> float | None:
        """Total samples/s of a configuration (the slowest GPU sets the pace)."""
        ...

    def type_rate(
        self, job: JobSpec, gpu_type: GpuType, reference: Calibration | None = None
    ) -> float | None:
        """Per-GPU samples/s on one GPU of this type (for the job's expected run time)."""
        ...

    def sensitivity(self, job: JobSpec, server: Server, peer: Server) -> float | None:
        """Placement sensitivity rho of the job over two servers."""
        ...
