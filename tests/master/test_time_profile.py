"""The master's reading of a profiling run's profile.json (hopsmgr.master.state.time_profile): the
runtime's phases, timed one after another in the training thread, add up to the step, so the estimate
from the profile is the step the run measured, on the server it was measured on."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from hopsmgr.core.estimator import expected_iteration_time
from hopsmgr.master.state import time_profile
from hopsmgr.runtime import Runtime, Settings


def profiled(steps: int, phases: tuple[str, ...], phase_s: float, outside_s: float) -> dict[str, float]:
    """profile.json of a real runtime in profile mode after `steps` steps of the given phases."""
    rt = Runtime(Settings(mode="profile", profile_iters=10_000), install_signals=False)
    for _ in range(steps):
        for name in phases:
            with rt.phase(name):
                time.sleep(phase_s)
        time.sleep(outside_s)
        rt.count(32)
    return rt.profile()


def test_a_step_that_loads_in_the_training_thread_is_estimated_at_its_length() -> None:
    raw = profiled(6, ("data", "forward", "backward", "update"), 0.004, 0.002)
    profile = time_profile(raw)
    assert profile.pattern == 2
    assert expected_iteration_time(profile, 0.0) == pytest.approx(raw["iteration_s"], rel=1e-9)
    # read as overlapped (pattern 1), the data wait would hide under the backward pass: a step ~30% short
    hidden = expected_iteration_time(replace(profile, pattern=1), 0.0)
    assert hidden < 0.85 * raw["iteration_s"]


def test_a_script_that_times_no_phase_has_a_usable_profile_of_its_steps() -> None:
    raw = profiled(6, (), 0.0, 0.004)
    assert raw["tf_s"] == raw["tb_s"] == raw["tu_s"] == 0.0
    profile = time_profile(raw)
    assert profile.tf_s == pytest.approx(raw["iteration_s"])
    assert expected_iteration_time(profile, 0.0) == pytest.approx(raw["iteration_s"], rel=1e-9)


def test_an_older_profile_without_an_iteration_time_reads_its_phases() -> None:
    raw = {"tf_s": 0.01, "tb_s": 0.02, "tu_s": 0.005, "td_s": 0.01}
    assert expected_iteration_time(time_profile(raw), 0.0) == pytest.approx(0.045)
