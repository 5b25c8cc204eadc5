"""The planner's prior on GPU types a job was never profiled on (hopsmgr.core.transfer).

A job placed before its profiling run on a busy type, then running, gets no run there later: without
a prior the planner never offered it that type (docs/results.md, the 64-GPU paper world at light load).
"""

from __future__ import annotations

import pytest

from hopsmgr.core import configs as config_gen
from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import Calibration, ClusterSnapshot, Config, JobSpec, JobView, RequirementSet, Server
from hopsmgr.core.planner import plan_round
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.core.transfer import with_transfer

SLOW = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.01, td_hit_s=0.0, td_miss_s=0.0)
FAST = TimeProfile(tf_s=0.05, tb_s=0.1, tu_s=0.005, td_hit_s=0.0, td_miss_s=0.0)  # twice as fast


def spec(jid: str, *counts: int, params: float = 0.0) -> JobSpec:
    return JobSpec(jid, RequirementSet.of(counts), 1e9, 32, params_bytes=params, restart_s=60.0)


def cluster() -> list[Server]:
    # one 8-GPU server of the slow type, two 4-GPU servers of the fast type (as in the paper's lab)
    return [
        Server("slow0", "slow", 8, Calibration(), order=0),
        Server("fast0", "fast", 4, Calibration(), order=1),
        Server("fast1", "fast", 4, Calibration(), order=2),
    ]


def taught() -> Estimator:
    """An estimator that saw one (since ended) job profiled on both types, and `r` on the slow one."""
    est = Estimator()
    est.add_profile("other", "slow", SLOW, Calibration())
    est.add_profile("other", "fast", FAST, Calibration())
    est.forget("other")
    est.add_profile("r", "slow", SLOW, Calibration())
    return est


def test_transfer_rate_scales_the_profile_by_the_ratio_other_jobs_showed() -> None:
    est = taught()
    servers = {s.id: s for s in cluster()}
    job = spec("r", 1)
    assert est.per_gpu_rate(job, servers["fast0"], 1) is None  # no profile there: the layers know nothing
    slow = est.per_gpu_rate(job, servers["slow0"], 1)
    assert slow is not None
    fast = est.transfer_rate(job, servers["fast0"], 1)
    assert fast == pytest.approx(2 * slow)
    assert est.transfer_rate(job, servers["slow0"], 1) is None  # profiled there: per_gpu_rate answers
    # kept across a restart of the master (export / from_state)
    again = Estimator.from_state(est.export_state())
    assert again.transfer_rate(job, servers["fast0"], 1) == pytest.approx(fast)
    # the planner's view answers with it where the estimator knows nothing
    view = with_transfer(est)
    assert view.per_gpu_rate(job, servers["fast0"], 1) == pytest.approx(fast)
    assert view.config_rate(job, Config.of({"fast0": 4, "fast1": 4}), servers) == pytest.approx(8 * fast)


def test_no_ratio_no_prior() -> None:
    est = Estimator()
    est.add_profile("r", "slow", SLOW, Calibration())
    assert est.transfer_rate(spec("r", 1), cluster()[1], 1) is None


@pytest.mark.parametrize("transfer", [True, False])
def test_a_running_job_moves_to_a_faster_type_it_was_never_profiled_on(transfer: bool) -> None:
    # r (rigid, 8 GPUs) was placed on the slow server before its profiling run on the busy fast type;
    # now the two fast servers idle. With the prior the plan moves it there (twice as fast, spanning
    # the two 4-GPU servers); without it (the code before) the fast type was never offered.
    servers = cluster()
    r = JobView(spec("r", 8), current=Config.single("slow0", 8), running_s=5000.0, attempt_s=5000.0)
    snap = ClusterSnapshot(tuple(servers), {s.id: s.gpus for s in servers}, (r,), now=10_000.0)
    settings = SchedulerSettings(solver="exact", gap=0.0, transfer_estimates=transfer)
    plan = plan_round(snap, taught(), settings)
    if transfer:
        assert plan.assignments == {"r": Config.of({"fast0": 4, "fast1": 4})}
    else:
        assert plan.assignments == {"r": Config.single("slow0", 8)}


def test_a_count_no_server_of_a_type_holds_spans_that_type_even_when_sensitive() -> None:
    # span=False (a high-sensitivity job): 8 GPUs fit one slow server, aggregated there; the fast type
    # has only 4-GPU servers, so 8 GPUs there span them (the program weighs their estimated rate).
    servers = cluster()
    by_type = config_gen.group_by_type(servers, {s.id: s.gpus for s in servers})
    est = Estimator()
    est.add_profile("r", "slow", SLOW, Calibration())
    est.add_profile("r", "fast", FAST, Calibration())
    free = {s.id: s.gpus for s in servers}
    got = config_gen.generate(spec("r", 4, 8), by_type, free, {s.id: s for s in servers}, est, span=False)
    configs = {c.config for c in got}
    assert Config.of({"fast0": 4, "fast1": 4}) in configs
    assert Config.single("slow0", 8) in configs
    assert not any(c.distributed and c.gpus == 4 for c in configs)  # 4 fits one server: not spanned
