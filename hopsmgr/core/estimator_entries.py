"""The throughput estimator's entries (hopsmgr.core.estimator) and their persisted form: a profile
with its online data-time clusters, a measured rate of the entity layer, a correction of the type layer;
the rows `Estimator.export_state` writes, and their checked reading back (`parse_*`: ModelError, or the
KeyError/TypeError/ValueError the estimator reports as a malformed state).

Pure core: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from hopsmgr.core.iteration import TimeProfile, iteration_time_of, require, require_count, require_shape
from hopsmgr.core.model import Calibration, GpuType, JobId, Server, ServerId

_SEED_WEIGHT = 20.0  # pseudo-samples a profile is worth when seeding the online data-time clusters
_MAX_WEIGHT = 200.0  # past this total weight the clusters are scaled down, so old samples fade
STATE_VERSION = 1
PROFILE_ROW = ("job", "gpu_type", "profile", "measured_on", "data")
ENTITY_ROW = ("job", "server", "gpus_here", "n_servers", "gpu_type", "rate")
TYPE_ROW = ("job", "gpu_type", "gpus_here", "n_servers", "ratio", "norm_rate")


@dataclass(slots=True)
class DataClusters:
    """Online 2-means over running-mode (Td, Tw) samples, assigned by Td; weights give p_cache."""

    hit_td: float
    hit_tw: float
    miss_td: float
    miss_tw: float
    n_hit: float
    n_miss: float

    @classmethod
    def seed(cls, p: TimeProfile) -> DataClusters:
        w_hit = _SEED_WEIGHT * p.p_cache
        return cls(p.td_hit_s, p.tw_hit_s, p.td_miss_s, p.tw_miss_s, w_hit, _SEED_WEIGHT - w_hit)

    def add(self, td: float, tw: float) -> None:
        if abs(self.miss_td - self.hit_td) <= 1e-12 * max(1.0, abs(self.hit_td)):
            to_hit = td <= self.hit_td  # coincident centres (a stable profile): split around them
        else:
            to_hit = abs(td - self.hit_td) <= abs(td - self.miss_td)
        if to_hit:
            self.n_hit += 1.0
            self.hit_td += (td - self.hit_td) / self.n_hit
            self.hit_tw += (tw - self.hit_tw) / self.n_hit
        else:
            self.n_miss += 1.0
            self.miss_td += (td - self.miss_td) / self.n_miss
            self.miss_tw += (tw - self.miss_tw) / self.n_miss
        total = self.n_hit + self.n_miss
        if total > _MAX_WEIGHT:
            self.n_hit *= _MAX_WEIGHT / total
            self.n_miss *= _MAX_WEIGHT / total

    def apply(self, profile: TimeProfile) -> TimeProfile:
        total = self.n_hit + self.n_miss
        p = min(1.0, self.n_hit / total) if total > 0 else profile.p_cache
        hit, miss = (self.hit_td, self.hit_tw), (self.miss_td, self.miss_tw)
        return replace(
            profile, td_hit_s=hit[0], tw_hit_s=hit[1], td_miss_s=miss[0], tw_miss_s=miss[1], p_cache=p
        )


@dataclass(slots=True)
class ProfileEntry:
    profile: TimeProfile  # as profiled
    measured_on: Calibration
    data: DataClusters
    effective: TimeProfile  # the profile with the running-mode data-time estimate applied
    # export_state's row for this entry, made once and replaced (never changed) when `data` changes:
    # an export of 15,000 profiles built afresh took 0.25 s of the event loop per forecast
    row: dict[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class EntityEntry:
    gpu_type: GpuType
    rate: float  # EWMA of the measured per-GPU samples/s


@dataclass(slots=True)
class TypeEntry:
    ratio: float | None = None  # EWMA of measured / theoretical per-GPU rate
    norm_rate: float | None = None  # EWMA of measured per-GPU rate / compute_factor of the pacing server


def theoretical_rate(
    batch: int, params: float, server: Server, gpus: int, n: int, entry: ProfileEntry
) -> float:
    """The theoretical layer: per-GPU samples/s of the entry's profile on `server`, `gpus` there over `n`
    servers, its times scaled by the server's calibration against the one it was measured on."""
    cal, ref = server.calibration, entry.measured_on
    # allreduce_time without its argument checks: shapes are checked on entry, calibrations on creation.
    if n > 1:
        tc = params / (cal.net_gbps * 1e9)
    else:
        tc = params / (cal.link_gbps * 1e9) * (gpus - 1) / gpus
    scale_c, scale_d = cal.compute_factor / ref.compute_factor, cal.data_factor / ref.data_factor
    return batch / iteration_time_of(entry.effective, tc, scale_c, scale_d)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def profile_row(job_id: JobId, gpu_type: GpuType, entry: ProfileEntry) -> dict[str, Any]:
    entry.row = row(
        PROFILE_ROW, (job_id, gpu_type, *map(_fields_of, (entry.profile, entry.measured_on, entry.data)))
    )
    return entry.row


def _fields_of(value: Any) -> dict[str, Any]:
    # dataclasses.fields() per value was most of an export (44,000 calls at 5,000 jobs: 0.5 s)
    names = _FIELD_NAMES.get(type(value))
    if names is None:
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in fields(value))
    return {name: getattr(value, name) for name in names}


def row(keys: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(keys, values, strict=True))


def parse_spec_row(row: dict[str, Any]) -> tuple[JobId, tuple[int, float]]:
    """A `specs` row: the job and its (batch size, parameter bytes)."""
    require_count("estimator state: batch_size", row["batch_size"])
    require("estimator state: params_bytes", row["params_bytes"], positive=False)
    return row["job"], (row["batch_size"], row["params_bytes"])


def parse_profile_row(row: dict[str, Any]) -> tuple[JobId, GpuType, ProfileEntry]:
    """A `profiles` row: the job, the GPU type and the profile entry with its data-time clusters."""
    profile = TimeProfile(**row["profile"])
    data = DataClusters(**row["data"])
    for f in fields(DataClusters):
        require(f"estimator state: data.{f.name}", getattr(data, f.name), positive=False)
    entry = ProfileEntry(profile, Calibration(**row["measured_on"]), data, data.apply(profile))
    return row["job"], row["gpu_type"], entry


def parse_entity_row(row: dict[str, Any]) -> tuple[JobId, tuple[ServerId, int, int], EntityEntry]:
    """An `entity` row: the job, its (server, gpus_here, n_servers) and the measured rate."""
    job, server, gpus, n, gpu_type, rate = (row[k] for k in ENTITY_ROW)
    require_shape(gpus, n)
    require("estimator state: rate", rate, positive=True)
    return job, (server, gpus, n), EntityEntry(gpu_type, rate)


def parse_type_row(row: dict[str, Any]) -> tuple[JobId, tuple[GpuType, int, int], TypeEntry]:
    """A `type` row: the job, its (GPU type, gpus_here, n_servers) and the type layer's corrections."""
    job, gpu_type, gpus, n, ratio, norm = (row[k] for k in TYPE_ROW)
    require_shape(gpus, n)
    for name, value in (("ratio", ratio), ("norm_rate", norm)):
        if value is not None:
            require(f"estimator state: {name}", value, positive=True)
    return job, (gpu_type, gpus, n), TypeEntry(ratio, norm)
