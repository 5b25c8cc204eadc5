"""EmulatedWorld: its rates are the arithmetic of examples/emulated_train.py on an emulated server."""

from __future__ import annotations

import random

import pytest

from hopsmgr.core.iteration import expected_iteration_time
from hopsmgr.core.model import Server
from hopsmgr.sim.emulated import EmulatedModel, EmulatedWorld

A100 = Server("node-a100", "a100", 2)
P100 = Server("node-p100", "p100", 2)


def world(**kw: float) -> EmulatedWorld:
    models = [
        EmulatedModel("plain", step_s=0.1, batch_size=16),
        EmulatedModel("rigid2", step_s=0.1, batch_size=16, base_gpus=2),
        EmulatedModel("misses", step_s=0.1, batch_size=16, miss_every=4, miss_s=0.2),
    ]
    return EmulatedWorld({"node-a100": 1.3, "node-p100": 0.6}, models, **kw)


def test_rate_is_batch_over_step_time_at_the_speed() -> None:
    w = world()
    # the example sleeps 4 x (step / speed / 4) per iteration and counts batch samples
    step = 4 * (0.1 / 1.3 / 4)
    assert w.iteration_s("plain", A100) == pytest.approx(step)
    assert w.true_rate("plain", [(A100, 1)]) == pytest.approx(16 / step)
    assert w.sample_rate("plain", [(A100, 1)], random.Random(0)) == pytest.approx(16 / step)


def test_more_gpus_do_more_work_per_iteration_and_the_primary_sets_the_pace() -> None:
    # the per-GPU batch stays fixed: an iteration on 2 GPUs lasts as long and does twice the samples
    w = world()
    assert w.true_rate("plain", [(A100, 2)]) == pytest.approx(2 * w.true_rate("plain", [(A100, 1)]))
    assert w.true_rate("plain", [(P100, 1), (A100, 1)]) == pytest.approx(2 * 16 * 0.6 / 0.1)
    assert w.reference_rate("plain", 4, "a100") == pytest.approx(4 * w.reference_rate("plain", 1, "a100"))


def test_speed_balanced_shares_pace_the_primary_as_the_example_does() -> None:
    w = world()
    # shares in proportion to speed: the primary (A100) computes 1.3 / 0.95 of an equal share per step
    # (examples/emulated_train.py: node_share x world GPUs / its GPUs), so both run at the mean pace
    shares = (1.3 / 1.9, 0.6 / 1.9)
    balanced = w.true_rate("plain", [(A100, 1), (P100, 1)], shares=shares)
    assert balanced == pytest.approx(16 * (1.3 + 0.6) / 0.1)
    measured = w.sample_rate("plain", [(A100, 1), (P100, 1)], random.Random(0), shares=shares)
    assert measured == pytest.approx(balanced)
    # equal shares, or shares that do not match the placement's GPUs, leave the primary's own pace
    assert w.true_rate("plain", [(A100, 1), (P100, 1)], shares=(0.5, 0.5)) == pytest.approx(
        2 * 16 * 1.3 / 0.1
    )
    assert w.true_rate("plain", [(A100, 1), (P100, 1)], shares=(1.0,)) == pytest.approx(2 * 16 * 1.3 / 0.1)
    # the example scales the step's work by the share, not its misses (every 4th iteration 0.2 s more)
    pace = (1.3 / 1.9) * 2
    step = (0.1 * pace + 0.2 / 4) / 1.3
    assert w.true_rate("misses", [(A100, 1), (P100, 1)], shares=shares) == pytest.approx(2 * 16 / step)


def test_the_measured_rate_counts_every_gpus_batch() -> None:
    # the master measures batch x G per iteration time, not the runtime's own samples/s (its rank's
    # batch); for a rigid 2-GPU job G is R1
    w = world()
    assert w.true_rate("rigid2", [(A100, 2)]) == pytest.approx(2 * 16 * 1.3 / 0.1)
    assert w.sample_rate("rigid2", [(A100, 2)], random.Random(0)) == pytest.approx(2 * 16 * 1.3 / 0.1)
    assert w.reported_rate("rigid2", A100, 2) == pytest.approx(2 * 16 * 1.3 / 0.1)
    assert w.reported_rate("plain", A100, 4) == pytest.approx(4 * 16 * 1.3 / 0.1)


def test_misses_and_overhead() -> None:
    w = world(step_overhead=0.05)
    # every 4th iteration sleeps 0.2 s more at speed 1: mean 0.15 s of work per iteration
    assert w.iteration_s("misses", P100) == pytest.approx(0.15 / 0.6 * 1.05)
    profile = w.profile("misses", P100, random.Random(0))
    assert profile.td_miss_s - profile.td_hit_s == pytest.approx(0.2 / 0.6 * 1.05)
    assert profile.p_cache == pytest.approx(0.75)
    # the example's phases run in sequence: the estimate from its profile is its iteration, not the
    # third less a data phase hidden under the backward pass (pattern 1) would give
    assert expected_iteration_time(profile, 0.0) == pytest.approx(w.iteration_s("misses", P100))


def test_calibration_is_what_an_emulated_agent_reports() -> None:
    cal = world().calibration(P100)
    assert (cal.compute_factor, cal.memory_factor, cal.data_factor, cal.source) == (0.6, 0.6, 1.0, "emulated")


def test_unknown_model_and_server_are_refused() -> None:
    w = world()
    with pytest.raises(ValueError, match="unknown model"):
        w.true_rate("nope", [(A100, 1)])
    with pytest.raises(ValueError, match="no emulated speed"):
        w.true_rate("plain", [(Server("x", "k80", 1), 1)])


def one_job_end(model: str, gpus: int) -> float:
    """When a job of 100 iterations of work (batch 16 x `gpus`) ends, alone on the A100 server, in the
    simulated executor with a 2-s profiling overhead plus 10 iterations, and 1.5-s launches."""
    from hopsmgr.core.model import RequirementSet
    from hopsmgr.core.settings import SchedulerSettings
    from hopsmgr.policies.base import HopsPolicy
    from hopsmgr.sim.engine import Simulation
    from hopsmgr.sim.simstate import SimOptions
    from hopsmgr.sim.workload import WorkloadJob

    job = WorkloadJob("j-000001", 0.0, model, RequirementSet.of([gpus]), 100 * 16.0 * gpus, 16)
    options = SimOptions(profile_s=2.0, profile_iterations=10, launch_s=1.5)
    policy = HopsPolicy(SchedulerSettings(round_seconds=20.0))
    result = Simulation(world(), [A100], [job], policy, options, lambda: 0.0).run()
    assert result.jobs[0].completed and result.jobs[0].end_time is not None
    return result.jobs[0].end_time


def test_simulated_executor_charges_the_measured_launch_and_profile_costs() -> None:
    step = 0.1 / 1.3
    assert one_job_end("plain", 1) == pytest.approx(2.0 + 10 * step + 1.5 + 100 * step)


def test_a_profiling_run_takes_its_iterations_on_one_gpu_whatever_the_smallest_count() -> None:
    # a rigid 2-GPU job: its profiling run is 10 iterations on one GPU (the runtime's own pace, as
    # live), then its run does 100 iterations of work on 2 GPUs
    step = 0.1 / 1.3
    assert one_job_end("rigid2", 2) == pytest.approx(2.0 + 10 * step + 1.5 + 100 * step)
