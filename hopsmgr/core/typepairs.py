"""[ours] The GPU-type ratios behind the estimator's transfer prior (`Estimator.transfer_rate`): for
each ordered pair of GPU types, the sums of the log ratios of the compute and weight-update times of
the jobs profiled on both (jobs that ended count too), so that a profile on one type can be scaled to
another by the geometric means.

Pure core: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from hopsmgr.core.estimator_entries import ProfileEntry
from hopsmgr.core.iteration import is_real
from hopsmgr.core.model import GpuType, ModelError


class TypePairs:
    """Per (source, target) type: [sum of log compute ratios, sum of log update ratios, jobs counted for
    compute, jobs counted for update]. `version` changes with every count, for the callers' caches."""

    def __init__(self) -> None:
        self._sums: dict[tuple[GpuType, GpuType], list[float]] = {}
        self.version = 0

    def count(self, profiles: Mapping[GpuType, ProfileEntry] | None, sign: float) -> None:
        """Add (sign 1) or take back (sign -1) a job's profiles' contribution to the type ratios."""
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
                counts = self._sums.setdefault((source, target), [0.0, 0.0, 0.0, 0.0])
                counts[0] += sign * math.log(comp_t / comp_s)
                counts[2] += sign
                if upd_s > 0 and upd_t > 0:
                    counts[1] += sign * math.log(upd_t / upd_s)
                    counts[3] += sign
        self.version += 1

    def transferred(self, profiles: Mapping[GpuType, ProfileEntry], target: GpuType) -> ProfileEntry | None:
        """The job's profile moved to `target`: from the source type whose ratio rests on the most jobs
        (ties: by name), compute and update times scaled; None if no profiled type has a ratio to it."""
        best: tuple[float, GpuType] | None = None
        for source in profiles:
            counts = self._sums.get((source, target))
            if counts is not None and counts[2] > 0.5 and (best is None or (-counts[2], source) < best):
                best = (-counts[2], source)
        if best is None:
            return None
        entry = profiles[best[1]]
        sum_c, sum_u, n_c, n_u = self._sums[(best[1], target)]
        k_c = math.exp(sum_c / n_c)
        k_u = math.exp(sum_u / n_u) if n_u > 0.5 else k_c
        p = entry.effective
        scaled = replace(p, tf_s=p.tf_s * k_c, tb_s=p.tb_s * k_c, tu_s=p.tu_s * k_u)
        return ProfileEntry(scaled, entry.measured_on, entry.data, scaled)

    def rows(self) -> list[list[Any]]:
        """The state's `pairs` rows: [source, target, *sums]."""
        return [[source, target, *counts] for (source, target), counts in self._sums.items()]

    def load(self, rows: Iterable[list[Any]]) -> None:
        """Restore `rows()`; ModelError on a bad row."""
        for source, target, *counts in rows:
            if len(counts) != 4 or not all(is_real(c) for c in counts):
                raise ModelError(f"estimator state: bad type-pair row {[source, target, *counts]!r}")
            self._sums[(source, target)] = [float(c) for c in counts]
