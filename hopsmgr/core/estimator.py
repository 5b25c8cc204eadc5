"""Throughput estimator: the Hops three-layer database (HOPS.md 2) over the iteration-time formula of
hopsmgr.core.iteration (HOPS.md 3).

Pure core: no I/O, no clock, no logging. `Estimator.per_gpu_rate` answers samples/s of one GPU of a job
on one server, read top-down from (1) the entity layer: values measured on this very server, (2) the type
layer: a measured/theoretical correction learned on other servers of the GPU type, (3) the theoretical
layer: the profiled time modules fed to the formula, scaled by the server's own calibration. Answers are
cached per job; a job's entries are dropped whenever its profiles or observations change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hopsmgr.core.iteration import (
    TimeProfile,
    is_real,
    iteration_time_of,
    require,
    require_count,
    require_shape,
)
from hopsmgr.core.model import (
    Calibration,
    Config,
    GpuType,
    JobId,
    JobSpec,
    ModelError,
    Server,
    ServerId,
    spans_types,
)

_SEED_WEIGHT = 20.0  # pseudo-samples a profile is worth when seeding the online data-time clusters
_MAX_WEIGHT = 200.0  # past this total weight the clusters are scaled down, so old samples fade
_STATE_VERSION = 1
_PROFILE_ROW = ("job", "gpu_type", "profile", "measured_on", "data")
_ENTITY_ROW = ("job", "server", "gpus_here", "n_servers", "gpu_type", "rate")
_TYPE_ROW = ("job", "gpu_type", "gpus_here", "n_servers", "ratio", "norm_rate")


@dataclass(slots=True)
class _DataClusters:
    """Online 2-means over running-mode (Td, Tw) samples, assigned by Td; weights give p_cache."""

    hit_td: float
    hit_tw: float
    miss_td: float
    miss_tw: float
    n_hit: float
    n_miss: float

    @classmethod
    def seed(cls, p: TimeProfile) -> _DataClusters:
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
class _ProfileEntry:
    profile: TimeProfile  # as profiled
    measured_on: Calibration
    data: _DataClusters
    effective: TimeProfile  # the profile with the running-mode data-time estimate applied
    # export_state's row for this entry, made once and replaced (never changed) when `data` changes:
    # an export of 15,000 profiles built afresh took 0.25 s of the event loop per forecast
    row: dict[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class _EntityEntry:
    gpu_type: GpuType
    rate: float  # EWMA of the measured per-GPU samples/s


@dataclass(slots=True)
class _TypeEntry:
    ratio: float | None = None  # EWMA of measured / theoretical per-GPU rate
    norm_rate: float | None = None  # EWMA of measured per-GPU rate / compute_factor of the pacing server


# (server, batch_size, params_bytes, rate, layer): the first three say what the value was computed for.
_Cached = tuple[Server, int, float, float | None, str]
_Shape = tuple[ServerId, int, int]  # (server, gpus_here, n_servers)


class Estimator:
    """The throughput database of HOPS.md 2: entity, type and theoretical layers, read top-down.

    The entity layer keeps one table keyed (server, gpus_here, n_servers): n_servers == 1 is the
    aggregated table, n_servers > 1 the distributed one. The estimator remembers the batch size and
    parameter size of the last `JobSpec` it saw for each job, so that `observe` (given only a job id) can
    learn the type layer's measured/theoretical correction.
    """

    def __init__(self, ewma_alpha: float = 0.3) -> None:
        if not (is_real(ewma_alpha) and 0.0 < ewma_alpha <= 1.0):
            raise ModelError(f"ewma_alpha must be within (0, 1], got {ewma_alpha!r}")
        self._alpha = float(ewma_alpha)
        self._profiles: dict[JobId, dict[GpuType, _ProfileEntry]] = {}
        self._entity: dict[JobId, dict[_Shape, _EntityEntry]] = {}
        self._types: dict[JobId, dict[tuple[GpuType, int, int], _TypeEntry]] = {}
        self._specs: dict[JobId, tuple[int, float]] = {}  # batch_size, params_bytes
        self._cache: dict[JobId, dict[_Shape, _Cached]] = {}
        # type_rate answers, per job: (gpu_type, reference) -> (batch_size, params_bytes, rate)
        self._type_cache: dict[
            JobId, dict[tuple[GpuType, Calibration | None], tuple[int, float, float | None]]
        ] = {}
        # [ours] cross-type transfer: per ordered pair of GPU types (from, to), over the jobs ever
        # profiled on both (an ended job's stay), the sums of log(nominal compute time on `to` / on `from`) and of the same
        # for the weight update, and their counts (`transfer_rate`)
        self._pairs: dict[tuple[GpuType, GpuType], list[float]] = {}
        self._pairs_version = 0
        self._transfer_cache: dict[JobId, dict[_Shape, tuple[int, Server, int, float, float | None]]] = {}

    def add_profile(
        self, job_id: JobId, gpu_type: GpuType, profile: TimeProfile, measured_on: Calibration
    ) -> None:
        """Store (or replace) a job's profile on a GPU type.

        Replacing a profile reseeds the running-mode data-time estimate from it and drops the type
        layer's corrections for this type (they were relative to the old profile).
        """
        if not isinstance(profile, TimeProfile):
            raise ModelError(f"profile must be a TimeProfile, got {profile!r}")
        if not isinstance(measured_on, Calibration):
            raise ModelError(f"measured_on must be a Calibration, got {measured_on!r}")
        data = _DataClusters.seed(profile)
        self._count_pairs(job_id, -1.0)
        self._profiles.setdefault(job_id, {})[gpu_type] = _ProfileEntry(
            profile, measured_on, data, data.apply(profile)
        )
        self._count_pairs(job_id, 1.0)
        for (t, _, _), entry in self._types.get(job_id, {}).items():
            if t == gpu_type:
                entry.ratio = None
        self._cache.pop(job_id, None)
        self._type_cache.pop(job_id, None)

    def has_profile(self, job_id: JobId, gpu_type: GpuType) -> bool:
        return gpu_type in self._profiles.get(job_id, {})

    def profiled_types(self, job_id: JobId) -> frozenset[GpuType]:
        return frozenset(self._profiles.get(job_id, {}))

    def profile_of(self, job_id: JobId, gpu_type: GpuType) -> tuple[TimeProfile, Calibration] | None:
        """A job's profile on a GPU type as it was added, with the calibration it was measured on."""
        entry = self._profiles.get(job_id, {}).get(gpu_type)
        return None if entry is None else (entry.profile, entry.measured_on)

    def per_gpu_rate(self, job: JobSpec, server: Server, gpus_here: int, n_servers: int = 1) -> float | None:
        """Samples/s per GPU of `job` on `server` with `gpus_here` GPUs there, in a configuration spanning
        `n_servers` servers; None if no layer knows anything."""
        per_job = self._cache.get(job.id)
        if per_job is not None:
            hit = per_job.get((server.id, gpus_here, n_servers))
            if (
                hit is not None
                and (hit[0] is server or hit[0] == server)
                and hit[1] == job.batch_size
                and hit[2] == job.params_bytes
            ):
                return hit[3]
        return self._fill(job, server, gpus_here, n_servers)[3]

    def layer(self, job: JobSpec, server: Server, gpus_here: int, n_servers: int = 1) -> str:
        """Which layer `per_gpu_rate` answers from: "entity", "type", "theoretical" or "unknown"."""
        self.per_gpu_rate(job, server, gpus_here, n_servers)
        return self._cache[job.id][(server.id, gpus_here, n_servers)][4]

    def config_rate(self, job: JobSpec, config: Config, servers: Mapping[ServerId, Server]) -> float | None:
        """Total samples/s of a configuration: the slowest GPU sets the pace of all; on a placement
        that spans GPU types the global batch is split by speed (`rank_shares`), so every GPU gives
        its own rate and the total is their sum (each rate counting the communication of `n` servers)."""
        rates = self._part_rates(job, config, servers)
        if rates is None:
            return None
        if spans_types(config, servers):
            return sum(rate * gpus for rate, gpus in zip(rates, (g for _, g in config.parts), strict=True))
        return min(rates) * config.gpus

    def rank_shares(
        self, job: JobSpec, config: Config, servers: Mapping[ServerId, Server]
    ) -> tuple[float, ...]:
        """Each rank's share of the global batch (ranks in the order of `config.parts`, then by GPU):
        its GPU's estimated rate over the sum; () for a placement of one GPU type or without estimates
        (equal shares)."""
        if not spans_types(config, servers):
            return ()
        rates = self._part_rates(job, config, servers)
        if rates is None:
            return ()
        total = sum(rate * g for rate, (_, g) in zip(rates, config.parts, strict=True))
        if total <= 0:
            return ()
        return tuple(rate / total for rate, (_, g) in zip(rates, config.parts, strict=True) for _ in range(g))

    def _part_rates(
        self, job: JobSpec, config: Config, servers: Mapping[ServerId, Server]
    ) -> list[float] | None:
        n = len(config.parts)
        rates: list[float] = []
        for sid, gpus in config.parts:
            rate = self.per_gpu_rate(job, _lookup(servers, sid), gpus, n)
            if rate is None:
                return None
            rates.append(rate)
        return rates

    def type_rate(
        self, job: JobSpec, gpu_type: GpuType, reference: Calibration | None = None
    ) -> float | None:
        """Per-GPU samples/s on one GPU of this type (for a job's expected run time).

        The mean of the values measured with one GPU on one server of this type, if any; otherwise the
        theoretical value on a server calibrated as `reference` (default: where the profile was measured).
        """
        self._specs[job.id] = (job.batch_size, job.params_bytes)
        per_job = self._type_cache.setdefault(job.id, {})
        hit = per_job.get((gpu_type, reference))
        if hit is not None and hit[0] == job.batch_size and hit[1] == job.params_bytes:
            return hit[2]
        rate = self._type_rate(job, gpu_type, reference)
        per_job[(gpu_type, reference)] = (job.batch_size, job.params_bytes, rate)
        return rate

    def _type_rate(self, job: JobSpec, gpu_type: GpuType, reference: Calibration | None) -> float | None:
        measured = [
            e.rate
            for (_, g, n), e in self._entity.get(job.id, {}).items()
            if g == 1 and n == 1 and e.gpu_type == gpu_type
        ]
        if measured:
            return sum(measured) / len(measured)
        entry = self._profiles.get(job.id, {}).get(gpu_type)
        if entry is None:
            return None
        cal = reference if reference is not None else entry.measured_on
        return job.batch_size / iteration_time_of(
            entry.effective,
            0.0,
            cal.compute_factor / entry.measured_on.compute_factor,
            cal.data_factor / entry.measured_on.data_factor,
        )

    def transfer_rate(self, job: JobSpec, server: Server, gpus_here: int, n_servers: int = 1) -> float | None:
        """[ours] A prior for a GPU type the job has no profile on (it was placed before its profiling
        run there, and a running job is not profiled): its profile on another type with the compute
        and weight-update times scaled by the types' ratios measured on the jobs profiled on both
        (geometric means; jobs that ended count too), then the formula on this server. None when the job has a profile
        on this type (`per_gpu_rate` answers), or no profiled type of it has a ratio to this one.
        The source type is the one whose ratio rests on the most jobs (ties: by name)."""
        profiles = self._profiles.get(job.id)
        if not profiles or server.gpu_type in profiles:
            return None
        shape = (server.id, gpus_here, n_servers)
        per_job = self._transfer_cache.get(job.id)
        hit = None if per_job is None else per_job.get(shape)
        if (
            hit is not None
            and hit[0] == self._pairs_version
            and (hit[1] is server or hit[1] == server)
            and hit[2] == job.batch_size
            and hit[3] == job.params_bytes
        ):
            return hit[4]
        require_shape(gpus_here, n_servers)
        best: tuple[float, GpuType] | None = None
        for source in profiles:
            counts = self._pairs.get((source, server.gpu_type))
            if counts is not None and counts[2] > 0.5 and (best is None or (-counts[2], source) < best):
                best = (-counts[2], source)
        rate: float | None = None
        if best is not None:
            entry = profiles[best[1]]
            sum_c, sum_u, n_c, n_u = self._pairs[(best[1], server.gpu_type)]
            k_c = math.exp(sum_c / n_c)
            k_u = math.exp(sum_u / n_u) if n_u > 0.5 else k_c
            p = entry.effective
            scaled = replace(p, tf_s=p.tf_s * k_c, tb_s=p.tb_s * k_c, tu_s=p.tu_s * k_u)
            moved = _ProfileEntry(scaled, entry.measured_on, entry.data, scaled)
            rate = self._theory(job.batch_size, job.params_bytes, server, gpus_here, n_servers, moved)
        self._transfer_cache.setdefault(job.id, {})[shape] = (
            self._pairs_version,
            server,
            job.batch_size,
            job.params_bytes,
            rate,
        )
        return rate

    def _count_pairs(self, job_id: JobId, sign: float) -> None:
        """Add (sign 1) or take back (sign -1) a job's profiles' contribution to the type ratios."""
        profiles = self._profiles.get(job_id)
        if not profiles or len(profiles) < 2:
            return
        nominal = {}
        for gpu_type, entry in profiles.items():
            c = entry.measured_on.compute_factor
            p = entry.profile
            nominal[gpu_type] = ((p.tf_s + p.tb_s) * c, p.tu_s * c)
        for source, (comp_s, upd_s) in nominal.items():
            for target, (comp_t, upd_t) in nominal.items():
                if source == target or comp_s <= 0 or comp_t <= 0:
                    continue
                counts = self._pairs.setdefault((source, target), [0.0, 0.0, 0.0, 0.0])
                counts[0] += sign * math.log(comp_t / comp_s)
                counts[2] += sign
                if upd_s > 0 and upd_t > 0:
                    counts[1] += sign * math.log(upd_t / upd_s)
                    counts[3] += sign
        self._pairs_version += 1

    def sensitivity(self, job: JobSpec, server: Server, peer: Server) -> float | None:
        """Placement sensitivity rho = per-GPU rate of {server: 1} / per-GPU rate of {server: 1, peer: 1}.

        The denominator follows the slowest-GPU rule over both servers (the paper's definition), so a
        slower peer raises rho; pass `peer=server` for the symmetric estimate that ignores the peer.
        """
        return placement_sensitivity(self.per_gpu_rate, job, server, peer)

    def observe(
        self,
        job_id: JobId,
        config: Config,
        servers: Mapping[ServerId, Server],
        samples_per_s: float,
        *,
        job: JobSpec | None = None,
    ) -> None:
        """Record a measured total throughput of a running configuration.

        Every part gets the per-GPU pace samples_per_s / config.gpus in the entity layer (EWMA); the type
        layer learns measured / theoretical (the theoretical config pace, when the job's spec is known:
        from `job` or the last one seen) and the pace normalised by the slowest compute factor.
        """
        if not (is_real(samples_per_s) and samples_per_s > 0):
            raise ModelError(
                f"observe: samples_per_s must be a positive finite number, got {samples_per_s!r}"
            )
        if job is not None:
            if job.id != job_id:
                raise ModelError(f"observe: job.id {job.id!r} does not match job_id {job_id!r}")
            self._specs[job_id] = (job.batch_size, job.params_bytes)
        parts = [(_lookup(servers, sid), gpus) for sid, gpus in config.parts]
        n = len(parts)
        if spans_types(config, servers):
            self._observe_balanced(job_id, config, servers, samples_per_s, job)
            return
        pace = samples_per_s / config.gpus
        ratio: float | None = None
        spec = self._specs.get(job_id)
        profiles = self._profiles.get(job_id, {})
        if spec is not None and all(s.gpu_type in profiles for s, _ in parts):
            theory = min(self._theory(spec[0], spec[1], s, g, n, profiles[s.gpu_type]) for s, g in parts)
            ratio = pace / theory
        norm = pace / min(s.calibration.compute_factor for s, _ in parts)
        entity = self._entity.setdefault(job_id, {})
        for server, gpus in parts:
            e = entity.get((server.id, gpus, n))
            if e is None:
                entity[(server.id, gpus, n)] = _EntityEntry(server.gpu_type, pace)
            else:
                e.gpu_type, e.rate = server.gpu_type, self._ewma(e.rate, pace)
        types = self._types.setdefault(job_id, {})
        for key in dict.fromkeys((s.gpu_type, g, n) for s, g in parts):
            t = types.setdefault(key, _TypeEntry())
            if ratio is not None:
                t.ratio = self._ewma(t.ratio, ratio)
            t.norm_rate = self._ewma(t.norm_rate, norm)
        self._cache.pop(job_id, None)
        self._type_cache.pop(job_id, None)

    def _observe_balanced(
        self,
        job_id: JobId,
        config: Config,
        servers: Mapping[ServerId, Server],
        samples_per_s: float,
        job: JobSpec | None,
    ) -> None:
        """A placement across GPU types: its GPUs ran at unequal paces (speed-balanced batches), so
        the measured total is split over the parts in proportion to their estimated rates, and only
        the entity layer learns (a type-layer ratio would mix the types' errors into one number)."""
        rates = None if job is None else self._part_rates(job, config, servers)
        if rates is None:
            return
        predicted = sum(r * g for r, (_, g) in zip(rates, config.parts, strict=True))
        if predicted <= 0:
            return
        scale = samples_per_s / predicted
        n = len(config.parts)
        entity = self._entity.setdefault(job_id, {})
        for (sid, gpus), rate in zip(config.parts, rates, strict=True):
            server = _lookup(servers, sid)
            e = entity.get((sid, gpus, n))
            if e is None:
                entity[(sid, gpus, n)] = _EntityEntry(server.gpu_type, rate * scale)
            else:
                e.gpu_type, e.rate = server.gpu_type, self._ewma(e.rate, rate * scale)
        self._cache.pop(job_id, None)
        self._type_cache.pop(job_id, None)

    def observe_data_time(self, job_id: JobId, gpu_type: GpuType, td_s: float, tw_s: float) -> None:
        """A running-mode (Td, Tw) sample: refines the hit/miss means and p_cache of the theoretical layer.

        Samples for a (job, type) without a profile are dropped: there is no theoretical layer to refine.
        """
        require("observe_data_time: td_s", td_s, positive=False)
        require("observe_data_time: tw_s", tw_s, positive=False)
        entry = self._profiles.get(job_id, {}).get(gpu_type)
        if entry is None:
            return
        entry.data.add(float(td_s), float(tw_s))
        entry.effective = entry.data.apply(entry.profile)
        entry.row = None
        self._cache.pop(job_id, None)
        self._type_cache.pop(job_id, None)

    def forget(self, job_id: JobId) -> None:
        """Drop everything known about a job (it ended for good; what its profiles taught about the
        GPU types' ratios stays: `transfer_rate`)."""
        self._profiles.pop(job_id, None)
        self._entity.pop(job_id, None)
        self._types.pop(job_id, None)
        self._specs.pop(job_id, None)
        self._cache.pop(job_id, None)
        self._type_cache.pop(job_id, None)
        self._transfer_cache.pop(job_id, None)

    def prepare_export(self, job_id: JobId) -> None:
        """Make the export rows of `job_id`'s profiles now (an export makes the missing ones; a caller
        that exports rarely but must not stall when it does, the master, makes them as they change)."""
        for gpu_type, entry in self._profiles.get(job_id, {}).items():
            if entry.row is None:
                _profile_row(job_id, gpu_type, entry)

    def export_state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of profiles and observations; `from_state` restores it exactly.
        Read-only: its profile rows are shared with later exports until their entry changes."""
        return {
            "version": _STATE_VERSION,
            "ewma_alpha": self._alpha,
            "specs": [{"job": j, "batch_size": b, "params_bytes": p} for j, (b, p) in self._specs.items()],
            "profiles": [
                e.row or _profile_row(j, t, e)
                for j, per_type in self._profiles.items()
                for t, e in per_type.items()
            ],
            "entity": [
                _row(_ENTITY_ROW, (j, *key, e.gpu_type, e.rate))
                for j, table in self._entity.items()
                for key, e in table.items()
            ],
            "type": [
                _row(_TYPE_ROW, (j, *key, e.ratio, e.norm_rate))
                for j, table in self._types.items()
                for key, e in table.items()
            ],
            "pairs": [[source, target, *counts] for (source, target), counts in self._pairs.items()],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Estimator:
        """Rebuild an estimator from `export_state` output; ModelError if the state is malformed."""
        try:
            return cls._load(state)
        except ModelError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelError(f"estimator state is malformed: {exc!r}") from exc

    @classmethod
    def _load(cls, state: Mapping[str, Any]) -> Estimator:
        if state.get("version") != _STATE_VERSION:
            raise ModelError(f"estimator state: unknown version {state.get('version')!r}")
        est = cls(state["ewma_alpha"])
        for row in state["specs"]:
            require_count("estimator state: batch_size", row["batch_size"])
            require("estimator state: params_bytes", row["params_bytes"], positive=False)
            est._specs[row["job"]] = (row["batch_size"], row["params_bytes"])
        for row in state["profiles"]:
            profile = TimeProfile(**row["profile"])
            data = _DataClusters(**row["data"])
            for f in fields(_DataClusters):
                require(f"estimator state: data.{f.name}", getattr(data, f.name), positive=False)
            entry = _ProfileEntry(profile, Calibration(**row["measured_on"]), data, data.apply(profile))
            est._profiles.setdefault(row["job"], {})[row["gpu_type"]] = entry
        for row in state["entity"]:
            job, server, gpus, n, gpu_type, rate = (row[k] for k in _ENTITY_ROW)
            require_shape(gpus, n)
            require("estimator state: rate", rate, positive=True)
            est._entity.setdefault(job, {})[(server, gpus, n)] = _EntityEntry(gpu_type, rate)
        for row in state["type"]:
            job, gpu_type, gpus, n, ratio, norm = (row[k] for k in _TYPE_ROW)
            require_shape(gpus, n)
            for name, value in (("ratio", ratio), ("norm_rate", norm)):
                if value is not None:
                    require(f"estimator state: {name}", value, positive=True)
            est._types.setdefault(job, {})[(gpu_type, gpus, n)] = _TypeEntry(ratio, norm)
        if "pairs" in state:  # (absent from states exported before the transfer prior)
            for source, target, *counts in state["pairs"]:
                if len(counts) != 4 or not all(is_real(c) for c in counts):
                    raise ModelError(f"estimator state: bad type-pair row {[source, target, *counts]!r}")
                est._pairs[(source, target)] = [float(c) for c in counts]
        else:
            for job in est._profiles:
                est._count_pairs(job, 1.0)
        return est

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else self._alpha * new + (1.0 - self._alpha) * old

    @staticmethod
    def _theory(batch: int, params: float, server: Server, gpus: int, n: int, entry: _ProfileEntry) -> float:
        cal, ref = server.calibration, entry.measured_on
        # allreduce_time without its argument checks: shapes are checked on entry, calibrations on creation.
        if n > 1:
            tc = params / (cal.net_gbps * 1e9)
        else:
            tc = params / (cal.link_gbps * 1e9) * (gpus - 1) / gpus
        scale_c, scale_d = cal.compute_factor / ref.compute_factor, cal.data_factor / ref.data_factor
        return batch / iteration_time_of(entry.effective, tc, scale_c, scale_d)

    def _fill(self, job: JobSpec, server: Server, gpus_here: int, n_servers: int) -> _Cached:
        """Answer a cache miss and cache it. Written flat: a cold 4,096-GPU round asks about 180,000
        of these (the theoretical layer is cheap enough to recompute after an observation)."""
        if not (type(gpus_here) is int and type(n_servers) is int and gpus_here >= 1 and n_servers >= 1):
            require_shape(gpus_here, n_servers)  # raises with the message naming the bad value
        jid, batch, params = job.id, job.batch_size, job.params_bytes
        self._specs[jid] = (batch, params)
        shape = (server.id, gpus_here, n_servers)
        rate: float | None = None
        layer = "unknown"
        entities = self._entity.get(jid)
        entity = None if entities is None else entities.get(shape)
        if entity is not None:
            rate, layer = entity.rate, "entity"
        else:
            profiles = self._profiles.get(jid)
            profile = None if profiles is None else profiles.get(server.gpu_type)
            theory = (
                None
                if profile is None
                else self._theory(batch, params, server, gpus_here, n_servers, profile)
            )
            types = self._types.get(jid)
            typed = None if types is None else types.get((server.gpu_type, gpus_here, n_servers))
            if typed is not None and typed.ratio is not None and theory is not None:
                rate, layer = theory * typed.ratio, "type"
            elif typed is not None and typed.norm_rate is not None:
                rate, layer = typed.norm_rate * server.calibration.compute_factor, "type"
            elif theory is not None:
                rate, layer = theory, "theoretical"
        cached: _Cached = (server, batch, params, rate, layer)
        per_job = self._cache.get(jid)
        if per_job is None:
            self._cache[jid] = {shape: cached}
        else:
            per_job[shape] = cached
        return cached


def _lookup(servers: Mapping[ServerId, Server], sid: ServerId) -> Server:
    server = servers.get(sid)
    if server is None:
        raise ModelError(f"configuration names server {sid!r}, which is not among the given servers")
    return server


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _profile_row(job_id: JobId, gpu_type: GpuType, entry: _ProfileEntry) -> dict[str, Any]:
    entry.row = _row(
        _PROFILE_ROW, (job_id, gpu_type, *map(_fields_of, (entry.profile, entry.measured_on, entry.data)))
    )
    return entry.row


def _fields_of(value: Any) -> dict[str, Any]:
    # dataclasses.fields() per value was most of an export (44,000 calls at 5,000 jobs: 0.5 s)
    names = _FIELD_NAMES.get(type(value))
    if names is None:
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in fields(value))
    return {name: getattr(value, name) for name in names}


def _row(keys: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(keys, values, strict=True))


def placement_sensitivity(
    per_gpu_rate: Callable[[JobSpec, Server, int, int], float | None],
    job: JobSpec,
    server: Server,
    peer: Server,
) -> float | None:
    """`Estimator.sensitivity` over any per-GPU rate (the estimator's own, or the planner's with the
    transfer prior, hopsmgr.core.transfer)."""
    alone = per_gpu_rate(job, server, 1, 1)
    here = per_gpu_rate(job, server, 1, 2)
    there = here if peer.id == server.id else per_gpu_rate(job, peer, 1, 2)
    if alone is None or here is None or there is None:
        return None
    return alone / min(here, there)
