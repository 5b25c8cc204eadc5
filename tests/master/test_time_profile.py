"""The master's reading of a profiling run's profile.json (hopsmgr.master.state.time_profile): the
runtime's phases, timed one after another in the training thread, add up to the step, so the estimate
from the profile is the step the run measured, on the server it was measured on."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hopsmgr.config import ClusterConfig
from hopsmgr.control.commands import ProfilingWaits
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.iteration import expected_iteration_time
from hopsmgr.core.model import Calibration, ModelError, Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master import persist
from hopsmgr.master.controller import Controller
from hopsmgr.master.state import time_profile
from hopsmgr.master.store import Store
from hopsmgr.master.writer import Op
from hopsmgr.runtime import Runtime, Settings
from tests.control.test_drivers import NoExecutor
from tests.master.test_store import job_row


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


@pytest.mark.parametrize(
    "raw",
    [
        {"tf_s": 0.01, "tc_s": -0.5, "iteration_s": 0.1},  # a negative phase would inflate the rest
        {"tf_s": None, "iteration_s": 0.1},
        {"tf_s": "0.01"},
        {"tf_s": 0.01, "iteration_s": math.inf},
        {"tf_s": 0.01, "p_cache": math.nan},
        {"iteration_s": 1e-320},  # no step: its rate would overflow
        {},
    ],
)
def test_a_profile_that_is_no_measurement_is_refused_by_name(raw: dict[str, object]) -> None:
    with pytest.raises(ModelError, match="profile"):
        time_profile(raw)  # type: ignore[arg-type]


def test_a_restarted_master_reads_a_live_jobs_stored_profile_again(tmp_path: Path) -> None:
    # an older master saved its estimator with the profile read as pattern 1; the master that opens
    # the store reads the stored profile.json again and replaces it, and keeps a profile it reads alike
    config = ClusterConfig("restart", (Server("n1", "v100", 2),), SchedulerSettings(), ())
    raw = profiled(4, ("data", "forward", "backward", "update"), 0.002, 0.0)
    cal = {
        "compute_factor": 1.0,
        "memory_factor": 1.0,
        "data_factor": 1.0,
        "link_gbps": 50.0,
        "net_gbps": 12.5,
    }
    store = Store(tmp_path / "state.db")
    store.insert_job(job_row("j-000001", 1, state="QUEUED"))
    store.add_profile("j-000001", "v100", raw, {**cal, "source": "emulated"}, 1.0)
    older = Estimator()
    older.add_profile("j-000001", "v100", replace(time_profile(raw), pattern=1), Calibration(**cal))
    store.save_estimator(older.export_state(), 1.0)
    ctl = Controller(config, store, NoExecutor(), clock=lambda: 10.0)  # type: ignore[arg-type]
    ctl.open(str(tmp_path / "checkpoints"))
    found = ctl.estimator.profile_of("j-000001", "v100")
    assert found is not None and found[0] == time_profile(raw) and found[0].pattern == 2
    store.close()


def test_a_restarted_master_holds_new_jobs_by_the_profiling_times_it_stored(tmp_path: Path) -> None:
    # the machine's record of the latest profiling times is written to the store's meta table, and the
    # master that opens the store again hands them to its machine (the forecasts' hold of new jobs)
    config = ClusterConfig("restart", (Server("n1", "v100", 2),), SchedulerSettings(), ())
    store = Store(tmp_path / "state.db")
    first = Controller(config, store, NoExecutor(), clock=lambda: 10.0)  # type: ignore[arg-type]
    first.open(str(tmp_path / "checkpoints"))
    ops: list[Op] = []
    persist.record_ops(first, [ProfilingWaits((30.0, 45.5))], "test", ops)
    first.store_ops(ops)
    store.close()
    store = Store(tmp_path / "state.db")
    again = Controller(config, store, NoExecutor(), clock=lambda: 20.0)  # type: ignore[arg-type]
    again.open(str(tmp_path / "checkpoints"))
    assert list(again.machine.profiling_waits) == [30.0, 45.5]
    store.close()
