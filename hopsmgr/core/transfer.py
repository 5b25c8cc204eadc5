"""[ours] The planner's view of the estimator, with a prior for GPU types a job was never profiled on.

A job is profiled on the GPU types that have idle GPUs when it arrives; a type busy then is profiled
later only while the job still waits, because a running job gets no profiling runs. A job placed
before its run on a busy type (a fragment plan starts it at once) therefore had no estimate there for
the rest of its life: configurations on that type were never generated, and it stayed on slower GPUs
while the faster ones idled (docs/results.md, the 64-GPU paper world at light load: 16 RTX 3090s idle
for five hours beside an 8-GPU job on Titan Xps).

`TransferEstimates` answers what the estimator answers and, where it knows nothing (no profile on
the server's type), the estimator's `transfer_rate`: the job's own profile on another type, its
compute and update times scaled by the ratio the other live jobs profiled on both types show. A
configuration that spans GPU types is not offered on such a prior (its batch split by speed needs the
estimator's own rates at launch). What the job then measures there replaces the prior (entity and type
layers). The priorities (expected run times: `type_rate`) and the baselines do not use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hopsmgr.core.estimates import Estimator
from hopsmgr.core.estimator import placement_sensitivity
from hopsmgr.core.model import Calibration, Config, GpuType, JobId, JobSpec, Server, ServerId, spans_types

TransferRate = Callable[[JobSpec, Server, int, int], "float | None"]


class TransferEstimates:
    """An `Estimator` (the protocol) over `inner`, filling unknown GPU types with `transfer`."""

    def __init__(self, inner: Estimator, transfer: TransferRate) -> None:
        self.inner = inner
        self._transfer = transfer

    def has_profile(self, job_id: JobId, gpu_type: GpuType) -> bool:
        return self.inner.has_profile(job_id, gpu_type)

    def profiled_types(self, job_id: JobId) -> frozenset[GpuType]:
        return self.inner.profiled_types(job_id)

    def type_rate(
        self, job: JobSpec, gpu_type: GpuType, reference: Calibration | None = None
    ) -> float | None:
        return self.inner.type_rate(job, gpu_type, reference)

    def per_gpu_rate(self, job: JobSpec, server: Server, gpus_here: int, n_servers: int = 1) -> float | None:
        rate = self.inner.per_gpu_rate(job, server, gpus_here, n_servers)
        if rate is None:
            rate = self._transfer(job, server, gpus_here, n_servers)
        return rate

    def config_rate(self, job: JobSpec, config: Config, servers: Mapping[ServerId, Server]) -> float | None:
        if all(self.inner.has_profile(job.id, servers[sid].gpu_type) for sid, _ in config.parts):
            return self.inner.config_rate(job, config, servers)
        if spans_types(config, servers):
            return None
        n = len(config.parts)
        slowest: float | None = None
        for sid, gpus in config.parts:
            rate = self.per_gpu_rate(job, servers[sid], gpus, n)
            if rate is None:
                return None
            slowest = rate if slowest is None else min(slowest, rate)
        return None if slowest is None else slowest * config.gpus

    def sensitivity(self, job: JobSpec, server: Server, peer: Server) -> float | None:
        return placement_sensitivity(self.per_gpu_rate, job, server, peer)


def with_transfer(estimator: Estimator) -> Estimator:
    """`estimator` with the transfer prior when it has one (`Estimator.transfer_rate`), else itself."""
    transfer = getattr(estimator, "transfer_rate", None)
    if transfer is None or isinstance(estimator, TransferEstimates):
        return estimator
    return TransferEstimates(estimator, transfer)
