"""The simulator's world for forecasts: jobs run at the estimator's rates, times a per-future error.

A forecast names each simulated job's "model" after the live job whose profile it has (itself, or for
a job that has not arrived yet the live job it copies), so the World interface of hopsmgr.sim.truth
answers from the estimator: `true_rate` is the estimator's rate of the job (found by its key) on the
configuration, the transfer prior where the job has no profile on a type (as the planner reads it:
a job the plan places on such a type runs at that rate, not at none), times the job's error factor
in this future (log-normal, drawn once per job and future),
`profile` the template's profile as it was when the future began, `model` its checkpoint size and
restart time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import Calibration, Config, JobSpec, Server
from hopsmgr.core.transfer import with_transfer
from hopsmgr.sim.simstate import job_key
from hopsmgr.sim.truth import Parts, TrueModel


class EstimatedWorld:
    name = "estimated"

    def __init__(
        self,
        estimator: Estimator,
        templates: Mapping[str, JobSpec],
        jobs: Mapping[str, JobSpec],
        servers: Sequence[Server],
        rng: random.Random,
        sigma: float,
        profiles: Mapping[str, Mapping[str, TimeProfile]] | None = None,
    ) -> None:
        self.estimator = estimator
        self.rates = with_transfer(estimator)  # what the planner reads, the transfer prior included
        self.templates = templates
        self.by_key = {job_key(job_id): spec for job_id, spec in jobs.items()}
        types = sorted({s.gpu_type for s in servers})
        # the templates' profiles now: a template that ends in the future is forgotten by the estimator
        # (`profiles`: of templates the estimator does not know, jobs that ended before the future began)
        self.profiles: dict[str, dict[str, TimeProfile]] = {n: dict(p) for n, p in (profiles or {}).items()}
        for name in templates:
            for gpu_type in types:
                found = estimator.profile_of(name, gpu_type)
                if found is not None:
                    self.profiles.setdefault(name, {})[gpu_type] = found[0]
        self.servers = {s.id: s for s in servers}
        self.types = tuple(sorted({s.gpu_type for s in servers}))
        self.rng = rng
        self.sigma = sigma
        self.factors: dict[int, float] = {}

    def models(self) -> tuple[TrueModel, ...]:
        return tuple(self.model(name) for name in self.templates)

    def model(self, name: str) -> TrueModel:
        spec = self.templates[name]
        return TrueModel(name, spec.params_bytes, spec.batch_size, spec.restart_s)

    def gpu_types(self) -> tuple[str, ...]:
        return self.types

    def factor(self, rng_key: int) -> float:
        f = self.factors.get(rng_key)
        if f is None:
            f = self.factors[rng_key] = math.exp(self.rng.gauss(0.0, self.sigma)) if self.sigma > 0 else 1.0
        return f

    def true_rate(
        self, model: str, config_parts: Parts, rng_key: int = 0, shares: Sequence[float] = ()
    ) -> float:
        """The job's (`rng_key` names it) estimated rate now, times its error in this future."""
        spec = self.by_key.get(rng_key, self.templates[model])
        config = Config.of({s.id: g for s, g in config_parts})
        rate = self.rates.config_rate(spec, config, self.servers) or 0.0
        return rate * self.factor(rng_key)

    def reference_rate(self, model: str, gpus: int, gpu_type: str | None = None) -> float:
        return 1.0  # only the simulator's own throughput measures read it; forecasts do not

    def profile(self, model: str, server: Server, rng: random.Random, rng_key: int = 0) -> TimeProfile:
        mine = self.profiles[model]
        return mine.get(server.gpu_type) or mine[min(mine)]  # none on this type: the one of another

    def sample_rate(
        self,
        model: str,
        config_parts: Parts,
        rng: random.Random,
        rng_key: int = 0,
        shares: Sequence[float] = (),
    ) -> float:
        return self.true_rate(model, config_parts, rng_key)

    def calibration(self, server: Server) -> Calibration:
        return server.calibration
