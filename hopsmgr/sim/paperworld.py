"""The "paper" ground-truth world (hopsmgr.sim.truth): the Hops paper's clusters; every number below is an
assumption of ours.

| GPU type  | fp32 speed | memory GB/s | PCIe GB/s | | host model | CPU speed | cache bonus | contention |
|-----------|------------|-------------|-----------|-|------------|-----------|-------------|------------|
| gtx1080ti | 1.0        | 484         | 6         | | "" (old)   | 0.9       | 0           | 0.05/GPU   |
| titanxp   | 1.1        | 548         | 6         | | A          | 1.0       | 0           | 0.04/GPU   |
| rtx3090   | 2.2        | 936         | 12        | | B (memory) | 1.3       | +0.15       | 0.03/GPU   |
|           |            |             |           | | C (newest) | 1.6       | 0           | 0.025/GPU  |

| model (variant)       | Mparams | batch | fwd/bwd ms | miss ms | p hit | hit/miss | overlap | pattern |
|-----------------------|---------|-------|------------|---------|-------|----------|---------|---------|
| ResNet18              | 11.7    | 128   | 60/120     | 110     | 0.60  | 0.50     | 0.70    | 1       |
| ResNet50              | 25.6    | 64    | 105/210    | 70      | 0.60  | 0.50     | 0.80    | 1       |
| VGG11                 | 132.9   | 64    | 85/175     | 70      | 0.60  | 0.50     | 0.50    | 1       |
| VGG13                 | 133.0   | 64    | 120/250    | 70      | 0.60  | 0.50     | 0.50    | 1       |
| ConvNeXt-base         | 88.6    | 32    | 150/310    | 40      | 0.80  | 0.50     | 0.70    | 1       |
| DenseNet161           | 28.7    | 32    | 95/195     | 40      | 0.80  | 0.50     | 0.80    | 1       |
| MobileNetV2           | 3.5     | 128   | 45/95      | 120     | 0.50  | 0.40     | 0.90    | 1       |
| RegNet (RegNetY-3.2GF)| 19.4    | 64    | 70/140     | 70      | 0.60  | 0.50     | 0.80    | 1       |
| DistilBERT            | 66.4    | 32    | 50/100     | 12      | 0.95  | 0.60     | 0.60    | 2       |
| ViT (ViT-B/16)        | 86.6    | 32    | 175/355    | 40      | 0.90  | 0.80     | 0.70    | 1       |
| wav2vec (2.0 base)    | 95.0    | 8     | 140/290    | 110     | 0.40  | 0.30     | 0.60    | 2       |
| GPT-2 medium          | 354.8   | 4     | 330/680    | 10      | 0.95  | 0.60     | 0.50    | 2       |

Public parameter counts at 4 bytes/parameter; batch is per GPU; times are assumptions of ours. MacBERT
(BERT-base sized) is left out to keep the paper's twelve. A server's GPU type is matched loosely
("GTX1080Ti", "RTX 3090"); its `host_model` is "", "A", "B" or "C" (1080Ti/TitanXp servers: "").

Hidden per-server factors: compute and data lognormal(0, sigma), memory and link (sigma/2), net (sigma/4).
One GPU of server s holding g of the configuration's N GPUs over k servers: fwd/bwd = table / (speed x
compute factor); update = 7 x params bytes / (memory GB/s x factor); data = miss time (x hit/miss on a hit,
probability p hit + cache bonus) / (CPU speed x data factor) x (1 + contention x (g - 1)): the GPUs of a
host share its CPU. Communication Tc (ring all-reduce) = max over servers of 2(g-1)/g x bytes / PCIe GB/s,
plus 2(k-1)/k x bytes / 12.5 GB/s (100 Gbit/s InfiniBand) when k > 1; `overlap` x Tc hides behind backward
(up to its length), the rest is exposed. Pattern 1: t = fwd + max(data, bwd + update + exposed); pattern 2:
the sum. A synchronous step lasts the expected maximum of t over all N GPUs (exact over hit/miss), times
1 + 0.03 sqrt(2 ln N) (compute jitter); rate = batch x N / step. The estimator's formula differs (fixed 0.2
exposed share, no contention, one GPU's expectation), so it has real error beyond one GPU.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple

from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.model import Calibration, Server
from hopsmgr.sim.truth import (
    BaseWorld,
    Parts,
    TrueModel,
    World,
    check_parts,
    gpu_key,
    hidden_factor,
    job_factor,
    norm_name,
    parts_span_types,
    restart_s_of,
    stable_rng,
)


class _PaperModel(NamedTuple):
    params_m: float
    batch: int
    tf_ms: float
    tb_ms: float
    td_miss_ms: float
    p_hit: float
    hit_ratio: float
    overlap: float
    pattern: int


# fmt: off
_PAPER_GPUS = {"gtx1080ti": (1.0, 484.0, 6.0), "titanxp": (1.1, 548.0, 6.0), "rtx3090": (2.2, 936.0, 12.0)}
_PAPER_HOSTS = {"": (0.9, 0.0, 0.05), "A": (1.0, 0.0, 0.04), "B": (1.3, 0.15, 0.03), "C": (1.6, 0.0, 0.025)}
_NET_GBPS = 12.5  # 100 Gbit/s InfiniBand
_JITTER = 0.03  # per-GPU compute-time variation: a synchronous step waits for the slowest GPU
_PAPER_MODELS = {  # params M, batch, fwd ms, bwd ms, data miss ms, p hit, hit/miss, overlap, pattern
    "ResNet18":      _PaperModel(11.7, 128, 60, 120, 110, 0.60, 0.50, 0.70, 1),
    "ResNet50":      _PaperModel(25.6, 64, 105, 210, 70, 0.60, 0.50, 0.80, 1),
    "VGG11":         _PaperModel(132.9, 64, 85, 175, 70, 0.60, 0.50, 0.50, 1),
    "VGG13":         _PaperModel(133.0, 64, 120, 250, 70, 0.60, 0.50, 0.50, 1),
    "ConvNeXt-base": _PaperModel(88.6, 32, 150, 310, 40, 0.80, 0.50, 0.70, 1),
    "DenseNet161":   _PaperModel(28.7, 32, 95, 195, 40, 0.80, 0.50, 0.80, 1),
    "MobileNetV2":   _PaperModel(3.5, 128, 45, 95, 120, 0.50, 0.40, 0.90, 1),
    "RegNet":        _PaperModel(19.4, 64, 70, 140, 70, 0.60, 0.50, 0.80, 1),
    "DistilBERT":    _PaperModel(66.4, 32, 50, 100, 12, 0.95, 0.60, 0.60, 2),
    "ViT":           _PaperModel(86.6, 32, 175, 355, 40, 0.90, 0.80, 0.70, 1),
    "wav2vec":       _PaperModel(95.0, 8, 140, 290, 110, 0.40, 0.30, 0.60, 2),
    "GPT-2 medium":  _PaperModel(354.8, 4, 330, 680, 10, 0.95, 0.60, 0.50, 2),
}
# fmt: on


def _host_key(host_model: str) -> str:
    key = norm_name(host_model).removeprefix("servermodel").removeprefix("model").removeprefix("host").upper()
    return "" if key in ("", "OLD", "LEGACY") else key


class _Modules(NamedTuple):
    """One GPU of a server, alone on its host: compute times, data-miss time, hit probability, links."""

    tf: float
    tb: float
    tu: float
    miss: float
    p_hit: float
    contention: float
    link_gbps: float
    net_gbps: float


def _balanced_shares(pm: _PaperModel, mods: list[tuple[_Modules, int]], total: int) -> list[float]:
    """[ours] Per part, its GPUs' local batch over the mean one when the global batch is split in
    proportion to each GPU's true speed (its expected forward, backward and loading time per batch):
    the ideal split; the runtime splits by the estimator's rates, which are a few percent off."""
    speeds = []
    for m, g in mods:
        miss = m.miss * (1 + m.contention * (g - 1))
        loading = m.p_hit * miss * pm.hit_ratio + (1 - m.p_hit) * miss
        speeds.append(1.0 / (m.tf + m.tb + loading))
    mean = sum(v * g for v, (_, g) in zip(speeds, mods, strict=True)) / total
    return [v / mean for v in speeds]


def _rate_of(pm: _PaperModel, mods: list[tuple[_Modules, int]], total: int, balanced: bool) -> float:
    """Samples/s of a synchronous step over the parts `mods` ((one GPU's modules, GPUs) each)."""
    size, k = pm.params_m * 4e6, len(mods)
    comm = max(2 * (g - 1) / g * size / (m.link_gbps * 1e9) for m, g in mods)
    if k > 1:
        comm += 2 * (k - 1) / k * size / (min(m.net_gbps for m, _ in mods) * 1e9)
    share = _balanced_shares(pm, mods, total) if balanced else [1.0] * len(mods)
    dists = []  # per part: (time on a hit, time on a miss, hit probability), GPUs
    for (m, g), f in zip(mods, share, strict=True):
        # a speed-balanced part computes f x the batch per GPU (its forward, backward, loading)
        m = m._replace(tf=m.tf * f, tb=m.tb * f, miss=m.miss * f)
        miss = m.miss * (1 + m.contention * (g - 1))
        exposed = comm * (1 - pm.overlap) + max(0.0, pm.overlap * comm - m.tb)
        busy = m.tb + m.tu + exposed
        hit, slow = (
            (m.tf + max(td, busy)) if pm.pattern == 1 else td + m.tf + busy
            for td in (miss * pm.hit_ratio, miss)
        )
        dists.append((hit, slow, m.p_hit, g))

    def cdf(x: float) -> float:  # P(every GPU's time <= x)
        return math.prod(((p if h <= x else 0.0) + (1 - p if m <= x else 0.0)) ** g for h, m, p, g in dists)

    expected, last = 0.0, 0.0
    for v in sorted({v for h, m, _, _ in dists for v in (h, m)}):
        now = cdf(v)
        expected, last = expected + v * (now - last), now
    expected *= 1 + _JITTER * math.sqrt(2 * math.log(total))
    return pm.batch * total / expected


class PaperWorld(BaseWorld):
    """The Hops paper's five server kinds and twelve models (see the module docstring)."""

    def __init__(self, seed: int = 0, per_server_sigma: float = 0.08) -> None:
        super().__init__("paper", seed, per_server_sigma, tuple(_PAPER_GPUS))
        self._ref_host = {"rtx3090": "A"}
        for name, pm in _PAPER_MODELS.items():
            params = pm.params_m * 4e6
            self._models[name] = TrueModel(name, params, pm.batch, restart_s_of(params))

    def _kind(self, server: Server) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        gpu = _PAPER_GPUS.get(gpu_key(server.gpu_type))
        if gpu is None:
            known = ", ".join(self._types)
            raise ValueError(f"unknown GPU type {server.gpu_type!r} in the paper world (known: {known})")
        host = _PAPER_HOSTS.get(_host_key(server.host_model))
        if host is None:
            raise ValueError(f"unknown host model {server.host_model!r} in the paper world (known: '', A-C)")
        return gpu, host

    def _factors(self, server: Server, nominal: bool) -> tuple[float, float, float, float, float]:
        """Hidden (compute, memory, data, link, net) factors of a server; all 1 when nominal."""
        if nominal:
            return 1.0, 1.0, 1.0, 1.0, 1.0
        s, key = self.sigma, (self.seed, server.id)
        return (
            hidden_factor(s, *key, "compute"), hidden_factor(s / 2, *key, "memory"), hidden_factor(s, *key, "data"),
            hidden_factor(s / 2, *key, "link"), hidden_factor(s / 4, *key, "net"),
        )  # fmt: skip

    def _modules(self, pm: _PaperModel, server: Server, nominal: bool) -> _Modules:
        (speed, mem_gbps, link_gbps), (cpu, cache_bonus, contention) = self._kind(server)
        fc, fm, fd, fl, fn = self._factors(server, nominal)
        return _Modules(
            tf=pm.tf_ms / 1e3 / (speed * fc), tb=pm.tb_ms / 1e3 / (speed * fc),
            tu=7 * pm.params_m * 4e6 / (mem_gbps * 1e9 * fm), miss=pm.td_miss_ms / 1e3 / (cpu * fd),
            p_hit=min(0.97, pm.p_hit + cache_bonus), contention=contention,
            link_gbps=link_gbps * fl, net_gbps=_NET_GBPS * fn,
        )  # fmt: skip

    def _rate(self, model: str, parts: Parts, nominal: bool) -> float:
        total = check_parts(parts)
        pm = _PAPER_MODELS[self.model(model).name]
        mods = [(self._modules(pm, s, nominal), g) for s, g in parts]
        return _rate_of(pm, mods, total, balanced=parts_span_types(parts))

    def best_case_rates(
        self, model: str, servers: Sequence[Server], splits: Sequence[Sequence[int]]
    ) -> list[float]:
        """Per split (GPU counts per server), an upper bound on `true_rate` (job factor left out) of any
        placement of `model` giving servers among `servers` (one GPU type) those counts: every part
        gets the best of each hidden factor and host parameter found among `servers`. The rate cannot
        fall when a time shrinks, a hit grows likelier or a link grows faster, so no real placement of
        that split beats it (hopsmgr.sim.bestrates)."""
        if not servers or len({gpu_key(s.gpu_type) for s in servers}) != 1:
            raise ValueError("best_case_rates needs servers of exactly one GPU type")
        most = max(s.gpus for s in servers)
        pm = _PAPER_MODELS[self.model(model).name]
        each = [self._modules(pm, s, nominal=False) for s in servers]
        best = _Modules(
            tf=min(m.tf for m in each), tb=min(m.tb for m in each), tu=min(m.tu for m in each),
            miss=min(m.miss for m in each), p_hit=max(m.p_hit for m in each),
            contention=min(m.contention for m in each), link_gbps=max(m.link_gbps for m in each),
            net_gbps=max(m.net_gbps for m in each),
        )  # fmt: skip
        rates = []
        for split in splits:
            if not split or any(not 0 < g <= most for g in split):
                raise ValueError(f"split {list(split)!r} does not fit servers of at most {most} GPUs")
            rates.append(_rate_of(pm, [(best, g) for g in split], sum(split), balanced=False))
        return rates

    def profile(self, model: str, server: Server, rng: random.Random, rng_key: int = 0) -> TimeProfile:
        """Noisy time modules of 40 profiled iterations on one GPU of `server` (hit rate counted)."""
        pm = _PAPER_MODELS[self.model(model).name]
        m = self._modules(pm, server, nominal=False)
        speedup = job_factor(self.seed, self.model(model).name, rng_key)

        def noisy(x: float, sigma: float = 0.03) -> float:
            return x / speedup * math.exp(rng.gauss(0.0, sigma))

        hits = sum(rng.random() < m.p_hit for _ in range(40))
        return TimeProfile(
            tf_s=noisy(m.tf), tb_s=noisy(m.tb), tu_s=noisy(m.tu), td_hit_s=noisy(m.miss * pm.hit_ratio, 0.05),
            td_miss_s=noisy(m.miss, 0.05), p_cache=max(hits / 40, 0.025), pattern=pm.pattern,
            td_hit_sigma=0.1 * m.miss * pm.hit_ratio, td_miss_sigma=0.1 * m.miss,
        )  # fmt: skip

    def sample_rate(
        self,
        model: str,
        config_parts: Parts,
        rng: random.Random,
        rng_key: int = 0,
        shares: Sequence[float] = (),
    ) -> float:
        """One measurement over ~50 iterations: noise grows with the model's data-loading variability."""
        pm = _PAPER_MODELS[self.model(model).name]
        cv = 0.01 + (1 - pm.hit_ratio) * math.sqrt(pm.p_hit * (1 - pm.p_hit) / 50)
        return self.true_rate(model, config_parts, rng_key) * max(0.5, 1 + rng.gauss(0.0, cv))

    def calibration(self, server: Server) -> Calibration:
        (_, _, link_gbps), (cpu, _, _) = self._kind(server)
        fc, fm, fd, fl, fn = self._factors(server, nominal=False)
        noise = stable_rng(self.seed, "calibration", server.id)

        def noisy(x: float) -> float:
            return x * math.exp(noise.gauss(0.0, 0.02))

        return Calibration(
            compute_factor=noisy(fc), memory_factor=noisy(fm), data_factor=noisy(cpu * fd),
            link_gbps=noisy(link_gbps * fl), net_gbps=noisy(_NET_GBPS * fn), source="emulated",
        )  # fmt: skip


def paper_world(seed: int = 0, per_server_sigma: float = 0.08) -> World:
    """The "paper" world: five server kinds and twelve models of the Hops paper."""
    return PaperWorld(seed, per_server_sigma)
