"""Ground-truth throughput worlds for the simulator: the hidden "true" speed the estimator must learn.

A `World` answers, for a job's model and a configuration given as (server, GPUs on it) pairs, the true
total samples/s (`true_rate`), one noisy measurement of it (`sample_rate`), what the profiler would see on
one GPU (`profile`) and what an agent's calibration kernels would report (`calibration`). Every server
carries hidden factors drawn from a hash of (seed, server id), so two servers of one type differ.

This module holds the interface and what both worlds share; the worlds are hopsmgr.sim.gavelworld
(Gavel's measured throughputs) and hopsmgr.sim.paperworld (the Hops paper's clusters, our assumptions),
and hopsmgr.sim.worlds picks one by name. `true_rate` with `rng_key` != 0 multiplies by a fixed
lognormal(0, 0.03) job-instance factor (both worlds); pass the same key to `profile` and `sample_rate` to
stay consistent with it. Restart cost (both worlds): 25 s + 0.15 s per MB of parameters, at most 250 s.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.model import Calibration, Server

Parts = Sequence[tuple[Server, int]]


@dataclass(frozen=True, slots=True)
class TrueModel:
    """One model of a world: parameter bytes, per-GPU batch size, checkpoint+restart seconds."""

    name: str
    params_bytes: float
    batch_size: int
    restart_s: float


class World(Protocol):
    """A hidden ground truth of job speeds (see the module docstring)."""

    name: str

    def models(self) -> tuple[TrueModel, ...]: ...
    def model(self, name: str) -> TrueModel: ...
    def gpu_types(self) -> tuple[str, ...]: ...
    # shares: each rank's share of the global batch as the launch gave them (LaunchAttempt.shares; ()
    # = equal); a world may take them into account or split the batch its own way
    def true_rate(
        self, model: str, config_parts: Parts, rng_key: int = 0, shares: Sequence[float] = ()
    ) -> float: ...
    def reference_rate(self, model: str, gpus: int, gpu_type: str | None = None) -> float: ...
    def profile(self, model: str, server: Server, rng: random.Random, rng_key: int = 0) -> TimeProfile: ...
    def sample_rate(
        self,
        model: str,
        config_parts: Parts,
        rng: random.Random,
        rng_key: int = 0,
        shares: Sequence[float] = (),
    ) -> float: ...
    def calibration(self, server: Server) -> Calibration: ...


def stable_rng(*key: object) -> random.Random:
    digest = hashlib.sha256(repr(key).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def hidden_factor(sigma: float, *key: object) -> float:
    return math.exp(stable_rng(*key).gauss(0.0, sigma)) if sigma > 0 else 1.0


def restart_s_of(params_bytes: float) -> float:
    return min(25.0 + 0.15 * params_bytes / 1e6, 250.0)


def norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def gpu_key(gpu_type: str) -> str:
    """A GPU type's name as the paper world's tables key it ("GeForce RTX 3090" -> "rtx3090")."""
    key = norm_name(gpu_type)
    for prefix in ("nvidia", "geforce", "gtx", "rtx"):
        key = key.removeprefix(prefix)
    return {"1080ti": "gtx1080ti", "titanxp": "titanxp", "3090": "rtx3090"}.get(key, key)


def parts_span_types(parts: Parts) -> bool:
    return len({s.gpu_type.lower() for s, _ in parts}) > 1


def check_parts(parts: Parts) -> int:
    if not parts:
        raise ValueError("a configuration needs at least one (server, gpus) part")
    for server, gpus in parts:
        if not isinstance(gpus, int) or not 0 < gpus <= server.gpus:
            raise ValueError(f"configuration gives server {server.id!r} ({server.gpus} GPUs) {gpus!r} GPUs")
    return sum(g for _, g in parts)


@functools.lru_cache(maxsize=65536)
def job_factor(seed: int, model: str, rng_key: int) -> float:
    """Per-job-instance speed multiplier: exactly 1 for key 0, else lognormal(0, 0.03)."""
    return 1.0 if rng_key == 0 else hidden_factor(0.03, seed, "job", model, rng_key)


class BaseWorld:
    """Model lookup and reference configurations shared by both worlds."""

    _gpus_per_server = 8

    def __init__(self, name: str, seed: int, sigma: float, types: tuple[str, ...]) -> None:
        self.name, self.seed, self.sigma, self._types = name, seed, sigma, types
        self._models: dict[str, TrueModel] = {}
        self._ref_host: dict[str, str] = {}
        self._memo: dict[tuple[str, tuple[tuple[Server, int], ...], bool], float] = {}
        self._reference: dict[tuple[str, int, str | None], float] = {}

    def models(self) -> tuple[TrueModel, ...]:
        return tuple(self._models.values())

    def model(self, name: str) -> TrueModel:
        found = self._models.get(name) or next(
            (m for m in self._models.values() if norm_name(m.name) == norm_name(name)), None
        )
        if found is None:
            raise ValueError(f"unknown model {name!r} in the {self.name} world")
        return found

    def gpu_types(self) -> tuple[str, ...]:
        return self._types

    def reference_parts(self, gpus: int, gpu_type: str | None = None) -> list[tuple[Server, int]]:
        """Nominal servers (hidden factors 1) of `gpu_type` (default: the middle type) holding `gpus`."""
        gtype = gpu_type or self._types[len(self._types) // 2]
        per, parts = self._gpus_per_server, []
        for i in range(math.ceil(gpus / per)):
            server = Server(f"__ref{i}", gtype, per, host_model=self._ref_host.get(gpu_key(gtype), ""))
            parts.append((server, min(per, gpus - i * per)))
        return parts

    def true_rate(
        self, model: str, config_parts: Parts, rng_key: int = 0, shares: Sequence[float] = ()
    ) -> float:
        """The rate of `model` on `config_parts` (a speed-balanced placement at the ideal split, whatever
        `shares` the launch gave: see _balanced_shares)."""
        rate = self._memo_rate(model, config_parts, nominal=False)
        return rate * job_factor(self.seed, self.model(model).name, rng_key) if rng_key else rate

    def reference_rate(self, model: str, gpus: int, gpu_type: str | None = None) -> float:
        """True rate on nominal servers of `gpu_type` (middle type by default), 8 GPUs per server."""
        key = (model, gpus, gpu_type)
        rate = self._reference.get(key)
        if rate is None:
            rate = self._reference[key] = self._memo_rate(model, self.reference_parts(gpus, gpu_type), True)
        return rate

    def _memo_rate(self, model: str, parts: Parts, nominal: bool) -> float:
        key = (model, tuple(parts), nominal)
        rate = self._memo.get(key)
        if rate is None:
            if len(self._memo) >= 100_000:
                self._memo.clear()
            rate = self._memo[key] = self._rate(model, parts, nominal)
        return rate

    def _rate(self, model: str, parts: Parts, nominal: bool) -> float:
        raise NotImplementedError
