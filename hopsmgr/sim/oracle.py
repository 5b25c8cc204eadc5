"""An estimator that knows the ground truth: the `--gavel-compat` assumption.

Gavel's own simulator gives every policy the measured throughputs. With this estimator every policy
(Hops included) sees the world's true rates instead of learning them, so results can be set beside
Gavel's published numbers. It implements the estimator interface the planner and policies read
(`hopsmgr.core.estimates.Estimator`); it still derives from the concrete estimator only because the
simulator's engine and runner are typed with that class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import Calibration, Config, GpuType, JobId, JobSpec, Server, ServerId
from hopsmgr.sim.truth import World


class OracleEstimator(Estimator):
    def __init__(
        self, world: World, servers: Mapping[ServerId, Server], job_keys: Mapping[JobId, int]
    ) -> None:
        super().__init__()
        self.world = world
        self.servers = dict(servers)
        self.job_keys = dict(job_keys)
        self.types = frozenset(s.gpu_type for s in servers.values())
        self._rates: dict[JobId, dict[tuple[tuple[ServerId, int], ...], float]] = {}

    def _true(self, job: JobSpec, parts: tuple[tuple[ServerId, int], ...]) -> float:
        per_job = self._rates.setdefault(job.id, {})
        rate = per_job.get(parts)
        if rate is None:
            rate = self.world.true_rate(
                job.model, [(self.servers[s], g) for s, g in parts], self.job_keys.get(job.id, 0)
            )
            per_job[parts] = rate
        return rate

    def add_profile(
        self, job_id: JobId, gpu_type: GpuType, profile: TimeProfile, measured_on: Calibration
    ) -> None:
        return None

    def has_profile(self, job_id: JobId, gpu_type: GpuType) -> bool:
        return gpu_type in self.types

    def profiled_types(self, job_id: JobId) -> frozenset[GpuType]:
        return self.types

    def per_gpu_rate(self, job: JobSpec, server: Server, gpus_here: int, n_servers: int = 1) -> float | None:
        if n_servers == 1:
            return self._true(job, ((server.id, gpus_here),)) / gpus_here
        # A part of a spanning configuration: the world's rate of that many servers alike.
        peers = [s for s in self.servers.values() if s.gpu_type == server.gpu_type and s.id != server.id]
        parts = ((server.id, gpus_here), *((p.id, gpus_here) for p in peers[: n_servers - 1]))
        if len(parts) < n_servers:
            return None
        return self._true(job, tuple(sorted(parts))) / (gpus_here * n_servers)

    def config_rate(self, job: JobSpec, config: Config, servers: Mapping[ServerId, Server]) -> float | None:
        return self._true(job, config.parts)

    def type_rate(
        self, job: JobSpec, gpu_type: GpuType, reference: Calibration | None = None
    ) -> float | None:
        server = next((s for s in self.servers.values() if s.gpu_type == gpu_type), None)
        return None if server is None else self._true(job, ((server.id, 1),))

    def sensitivity(self, job: JobSpec, server: Server, peer: Server) -> float | None:
        one = self._true(job, ((server.id, 1),))
        two = self._true(job, tuple(sorted(((server.id, 1), (peer.id, 1))))) / 2
        return one / two if two > 0 else None

    def observe(
        self,
        job_id: JobId,
        config: Config,
        servers: Mapping[ServerId, Server],
        samples_per_s: float,
        job: JobSpec | None = None,
    ) -> None:
        return None

    def observe_data_time(self, job_id: JobId, gpu_type: GpuType, td_s: float, tw_s: float) -> None:
        return None

    def forget(self, job_id: JobId) -> None:
        self._rates.pop(job_id, None)

    def export_state(self) -> dict[str, Any]:
        return {"oracle": True}
