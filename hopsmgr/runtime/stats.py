"""Small statistics for profiling: means and a 1-D 2-means split of data-loading times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A split counts as bimodal when it explains at least this share of the variance (a uniform spread
# gives 0.75, a normal one about 0.64) and the two centres differ by at least this relative gap.
MIN_EXPLAINED = 0.8
MIN_RELATIVE_GAP = 0.25


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass(frozen=True)
class CacheSplit:
    """Data-phase times as a cache model: a hit with probability `p_cache`, else a miss."""

    hit_s: float
    miss_s: float
    p_cache: float


def _sse(total: float, total_sq: float, n: int) -> float:
    return max(total_sq - total * total / n, 0.0) if n else 0.0


def two_means(values: Sequence[float]) -> CacheSplit:
    """Exact 1-D 2-means over `values` (best split of the sorted values).

    When the split is weak (too few values, little variance explained, or close centres) the data is
    treated as one mode: hit = miss = mean, p_cache = 1.
    """
    xs = sorted(float(v) for v in values)
    n = len(xs)
    m = mean(xs)
    single = CacheSplit(m, m, 1.0)
    if n < 4:
        return single
    total = sum(xs)
    total_sq = sum(x * x for x in xs)
    sse_all = _sse(total, total_sq, n)
    if sse_all <= 1e-18:
        return single
    best: tuple[float, int] | None = None
    left = left_sq = 0.0
    for k in range(1, n):
        left += xs[k - 1]
        left_sq += xs[k - 1] ** 2
        sse = _sse(left, left_sq, k) + _sse(total - left, total_sq - left_sq, n - k)
        if best is None or sse < best[0]:
            best = (sse, k)
    assert best is not None
    sse, k = best
    lo, hi = mean(xs[:k]), mean(xs[k:])
    if 1.0 - sse / sse_all < MIN_EXPLAINED or hi - lo < MIN_RELATIVE_GAP * hi:
        return single
    return CacheSplit(lo, hi, k / n)
