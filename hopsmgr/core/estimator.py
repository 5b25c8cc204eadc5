"""Throughput estimator: the Hops three-layer database (HOPS.md 2) over the iteration-time formula of
hopsmgr.core.iteration (HOPS.md 3).

Pure core: no I/O, no clock, no logging. `Estimator.per_gpu_rate` answers samples/s of one GPU of a job
on one server, read top-down from (1) the entity layer: values measured on this very server, (2) the type
layer: a measured/theoretical correction learned on other servers of the GPU type, (3) the theoretical
layer: the profiled time modules fed to the formula, scaled by the server's own calibration. Answers are
cached per job; a job's entries are dropped whenever its profiles or observations change.
Its entries and their persisted rows are in hopsmgr.core.estimator_entries, the type ratios of the
transfer prior in hopsmgr.core.typepairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hopsmgr.core.estimator_entries import (
    ENTITY_ROW,
    STATE_VERSION,
    TYPE_ROW,
    DataClusters,
    EntityEntry,
    ProfileEntry,
    TypeEntry,
    parse_entity_row,
    parse_profile_row,
    parse_spec_row,
    parse_type_row,
    profile_row,
    row,
    theoretical_rate,
)
from hopsmgr.core.iteration import (
    TimeProfile,
    is_real,
    iteration_time_of,
    require,
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
from hopsmgr.core.typepairs import TypePairs

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
        self._profiles: dict[JobId, dict[GpuType, ProfileEntry]] = {}
        self._entity: dict[JobId, dict[_Shape, EntityEntry]] = {}
        self._types: dict[JobId, dict[tuple[GpuType, int, int], TypeEntry]] = {}
        self._specs: dict[JobId, tuple[int, float]] = {}  # batch_size, params_bytes
        self._cache: dict[JobId, dict[_Shape, _Cached]] = {}
        # type_rate answers, per job: (gpu_type, reference) -> (batch_size, params_bytes, rate)
        self._type_cache: dict[
            JobId, dict[tuple[GpuType, Calibration | None], tuple[int, float, float | None]]
        ] = {}
        # [ours] cross-type transfer: per ordered pair of GPU types (from, to), over the jobs ever
        # profiled on both (an ended job's stay), the sums of log(nominal compute time on `to` / on `from`) and of the same
        # for the weight update, and their counts (`transfer_rate`)
        self._pairs = TypePairs()
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
        data = DataClusters.seed(profile)
        self._pairs.count(self._profiles.get(job_id), -1.0)
        self._profiles.setdefault(job_id, {})[gpu_type] = ProfileEntry(
            profile, measured_on, data, data.apply(profile)
        )
        self._pairs.count(self._profiles.get(job_id), 1.0)
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
            and hit[0] == self._pairs.version
            and (hit[1] is server or hit[1] == server)
            and hit[2] == job.batch_size
            and hit[3] == job.params_bytes
        ):
            return hit[4]
        require_shape(gpus_here, n_servers)
        moved = self._pairs.transferred(profiles, server.gpu_type)
        rate = (
            None
            if moved is None
            else theoretical_rate(job.batch_size, job.params_bytes, server, gpus_here, n_servers, moved)
        )
        self._transfer_cache.setdefault(job.id, {})[shape] = (
            self._pairs.version,
            server,
            job.batch_size,
            job.params_bytes,
            rate,
        )
        return rate

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
            theory = min(theoretical_rate(spec[0], spec[1], s, g, n, profiles[s.gpu_type]) for s, g in parts)
            ratio = pace / theory
        norm = pace / min(s.calibration.compute_factor for s, _ in parts)
        entity = self._entity.setdefault(job_id, {})
        for server, gpus in parts:
            e = entity.get((server.id, gpus, n))
            if e is None:
                entity[(server.id, gpus, n)] = EntityEntry(server.gpu_type, pace)
            else:
                e.gpu_type, e.rate = server.gpu_type, self._ewma(e.rate, pace)
        types = self._types.setdefault(job_id, {})
        for key in dict.fromkeys((s.gpu_type, g, n) for s, g in parts):
            t = types.setdefault(key, TypeEntry())
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
                entity[(sid, gpus, n)] = EntityEntry(server.gpu_type, rate * scale)
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
                profile_row(job_id, gpu_type, entry)

    def export_state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of profiles and observations; `from_state` restores it exactly.
        Read-only: its profile rows are shared with later exports until their entry changes."""
        return {
            "version": STATE_VERSION,
            "ewma_alpha": self._alpha,
            "specs": [{"job": j, "batch_size": b, "params_bytes": p} for j, (b, p) in self._specs.items()],
            "profiles": [
                e.row or profile_row(j, t, e)
                for j, per_type in self._profiles.items()
                for t, e in per_type.items()
            ],
            "entity": [
                row(ENTITY_ROW, (j, *key, e.gpu_type, e.rate))
                for j, table in self._entity.items()
                for key, e in table.items()
            ],
            "type": [
                row(TYPE_ROW, (j, *key, e.ratio, e.norm_rate))
                for j, table in self._types.items()
                for key, e in table.items()
            ],
            "pairs": self._pairs.rows(),
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
        if state.get("version") != STATE_VERSION:
            raise ModelError(f"estimator state: unknown version {state.get('version')!r}")
        est = cls(state["ewma_alpha"])
        for spec_row in state["specs"]:
            job, spec = parse_spec_row(spec_row)
            est._specs[job] = spec
        for profile_row_ in state["profiles"]:
            job, gpu_type, entry = parse_profile_row(profile_row_)
            est._profiles.setdefault(job, {})[gpu_type] = entry
        for entity_row in state["entity"]:
            job, shape, entity = parse_entity_row(entity_row)
            est._entity.setdefault(job, {})[shape] = entity
        for type_row in state["type"]:
            job, key, typed = parse_type_row(type_row)
            est._types.setdefault(job, {})[key] = typed
        if "pairs" in state:  # (absent from states exported before the transfer prior)
            est._pairs.load(state["pairs"])
        else:
            for job in est._profiles:
                est._pairs.count(est._profiles.get(job), 1.0)
        return est

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else self._alpha * new + (1.0 - self._alpha) * old

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
                else theoretical_rate(batch, params, server, gpus_here, n_servers, profile)
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
