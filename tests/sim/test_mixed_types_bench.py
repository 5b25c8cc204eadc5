"""bench/mixed_types.py still drives the simulator: it wraps a private method of the engine
(`Simulation._sample_error`) to read the estimator's signed error, and a change of that method's
signature broke it unnoticed once. A short run with mixed placements on must complete and log errors."""

from __future__ import annotations

from pathlib import Path

from hopsmgr.sim.engine import Simulation
from tests.helpers.bench import load_bench

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_completes_and_reads_the_estimator_error() -> None:
    bench = load_bench("mixed_types")
    original = Simulation._sample_error
    row = bench.one_run(str(ROOT / "configs/sim/paper-16.toml"), "poisson:jobs=40,rate=8", 1, True)
    assert Simulation._sample_error is original  # the wrapper is taken off again
    assert row["mixed_types"] is True and row["avg_jct_h"] > 0
    assert row["samples_mixed"] > 0 and row["err_mixed_abs"] is not None, row  # spanning types, sampled
