"""Tests of the three-layer throughput estimator and the iteration-time formula (HOPS.md 2-3)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.iteration import TimeProfile, allreduce_time, expected_iteration_time, iteration_time
from hopsmgr.core.model import Calibration, Config, JobSpec, ModelError
from tests.helpers.builders import job_spec
from tests.helpers.builders import server as make_server

# tf 0.1, tb 0.2, tu 0.05, td 0.1 (stable): one GPU, no communication: T = max(0.1, 0.2 + 0.05) + 0.1 = 0.35
PROFILE = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.05, td_hit_s=0.1, td_miss_s=0.1)
NOMINAL = Calibration()  # compute 1, data 1, link 50 GB/s, net 12.5 GB/s


def make_job(params: float = 0.0, batch: int = 32, job_id: str = "j1") -> JobSpec:
    return job_spec(job_id, (1, 2, 4), batch=batch, params_bytes=params)


def profiled(profile: TimeProfile = PROFILE, job_id: str = "j1", alpha: float = 0.3) -> Estimator:
    est = Estimator(ewma_alpha=alpha)
    est.add_profile(job_id, "V100", profile, NOMINAL)
    return est


# -- formula ------------------------------------------------------------------------------------------


def test_iteration_time_pattern_1_communication_bound() -> None:
    # busy = max(tb + 0.2*tc, tc) + tu = max(0.2 + 0.1, 0.5) + 0.05 = 0.55
    # T = max(td, busy) + tf + tw = max(0.3, 0.55) + 0.1 + 0.01 = 0.66
    assert iteration_time(0.1, 0.2, 0.05, 0.3, 0.01, 0.5, 1) == pytest.approx(0.66)


def test_iteration_time_pattern_1_data_bound() -> None:
    # busy = max(0.2 + 0.02, 0.1) + 0.05 = 0.27; T = max(0.3, 0.27) + 0.1 + 0.01 = 0.41
    assert iteration_time(0.1, 0.2, 0.05, 0.3, 0.01, 0.1, 1) == pytest.approx(0.41)


def test_iteration_time_pattern_2_adds_data_time() -> None:
    # T = td + busy + tf + tw = 0.3 + 0.55 + 0.1 + 0.01 = 0.96
    assert iteration_time(0.1, 0.2, 0.05, 0.3, 0.01, 0.5, 2) == pytest.approx(0.96)
    # T = 0.3 + 0.27 + 0.1 + 0.01 = 0.68
    assert iteration_time(0.1, 0.2, 0.05, 0.3, 0.01, 0.1, 2) == pytest.approx(0.68)


def test_allreduce_ring_term_on_one_server() -> None:
    # 1e9 bytes over 50 GB/s = 0.02 s, times (4 - 1) / 4 = 0.015
    assert allreduce_time(1e9, 4, 1, 50.0, 12.5) == pytest.approx(0.015)
    # 8 GPUs: 0.02 * 7/8 = 0.0175
    assert allreduce_time(1e9, 8, 1, 50.0, 12.5) == pytest.approx(0.0175)
    assert allreduce_time(1e9, 1, 1, 50.0, 12.5) == 0.0


def test_allreduce_network_term_across_servers() -> None:
    # 1e9 bytes over 12.5 GB/s = 0.08 s, whatever the GPUs per server
    assert allreduce_time(1e9, 1, 2, 50.0, 12.5) == pytest.approx(0.08)
    assert allreduce_time(1e9, 4, 3, 50.0, 12.5) == pytest.approx(0.08)


def test_bimodal_expectation() -> None:
    profile = TimeProfile(
        tf_s=0.1, tb_s=0.2, tu_s=0.05, td_hit_s=0.1, td_miss_s=0.9, p_cache=0.75, tw_miss_s=0.04
    )
    # busy = 0.2 + 0.05 = 0.25; hit: max(0.1, 0.25) + 0.1 + 0 = 0.35; miss: max(0.9, 0.25) + 0.1 + 0.04 = 1.04
    # E = 0.75 * 0.35 + 0.25 * 1.04 = 0.2625 + 0.26 = 0.5225
    assert expected_iteration_time(profile, 0.0) == pytest.approx(0.5225)
    # compute twice as fast, data half as fast: tf .05 tb .1 tu .025, td .2/1.8, tw_miss .08
    # hit: max(0.2, 0.125) + 0.05 = 0.25; miss: 1.8 + 0.05 + 0.08 = 1.93; E = 0.1875 + 0.4825 = 0.67
    assert expected_iteration_time(profile, 0.0, compute_scale=2.0, data_scale=0.5) == pytest.approx(0.67)


def test_bimodal_expectation_pattern_2() -> None:
    profile = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.05, td_hit_s=0.1, td_miss_s=0.9, p_cache=0.5, pattern=2)
    # hit: 0.1 + 0.25 + 0.1 = 0.45; miss: 0.9 + 0.25 + 0.1 = 1.25; E = 0.85
    assert expected_iteration_time(profile, 0.0) == pytest.approx(0.85)


# -- theoretical layer --------------------------------------------------------------------------------


def test_theoretical_rate_with_ring_allreduce() -> None:
    est = profiled()
    # tc = 0.015 (4 GPUs, 1 GB); busy = max(0.2 + 0.003, 0.015) + 0.05 = 0.253; T = 0.253 + 0.1 = 0.353
    rate = est.per_gpu_rate(make_job(params=1e9), make_server("a"), 4)
    assert rate == pytest.approx(32 / 0.353)
    assert est.layer(make_job(params=1e9), make_server("a"), 4) == "theoretical"


def test_slowest_gpu_sets_the_pace_of_a_distributed_config() -> None:
    est = profiled()
    job = make_job(params=1e9)
    servers = {"a": make_server("a"), "b": make_server("b", compute_factor=0.5)}
    # tc = 1e9 / 12.5e9 = 0.08 on both parts
    # a: busy = max(0.2 + 0.016, 0.08) + 0.05 = 0.266, T = 0.266 + 0.1 = 0.366
    # b (half speed): busy = max(0.4 + 0.016, 0.08) + 0.1 = 0.516, T = 0.516 + 0.2 = 0.716
    assert est.per_gpu_rate(job, servers["a"], 2, 2) == pytest.approx(32 / 0.366)
    assert est.per_gpu_rate(job, servers["b"], 2, 2) == pytest.approx(32 / 0.716)
    assert est.config_rate(job, Config.of({"a": 2, "b": 2}), servers) == pytest.approx(4 * 32 / 0.716)


def test_same_type_different_calibration_differs_before_history() -> None:
    est = profiled()
    job = make_job()
    plain = make_server("a1")
    fast = make_server("a2", compute_factor=1.25, data_factor=2.0)
    # fast: tf .08 tb .16 tu .04 td .05: T = max(0.05, 0.2) + 0.08 = 0.28
    assert est.per_gpu_rate(job, plain, 1) == pytest.approx(32 / 0.35)
    assert est.per_gpu_rate(job, fast, 1) == pytest.approx(32 / 0.28)


def test_profile_scaled_relative_to_the_server_it_was_measured_on() -> None:
    est = Estimator()
    est.add_profile("j1", "V100", PROFILE, Calibration(compute_factor=2.0, data_factor=2.0))
    # a nominal server is half as fast as the profiling one: every time doubles, T = 0.7
    assert est.per_gpu_rate(make_job(), make_server("a"), 1) == pytest.approx(32 / 0.7)


def test_unknown_without_profile_or_history() -> None:
    est = profiled()
    job = make_job()
    t4 = make_server("b1", gpu_type="T4")
    servers = {"a1": make_server("a1"), "b1": t4}
    assert est.per_gpu_rate(job, t4, 1) is None
    assert est.layer(job, t4, 1) == "unknown"
    assert est.config_rate(job, Config.of({"a1": 1, "b1": 1}), servers) is None
    assert est.has_profile("j1", "V100")
    assert not est.has_profile("j1", "T4")
    assert est.profiled_types("j1") == frozenset({"V100"})
    assert est.profiled_types("nobody") == frozenset()


# -- layers -------------------------------------------------------------------------------------------


def test_layers_go_top_down_as_observations_arrive() -> None:
    est = profiled()
    job = make_job()
    a1, a2 = make_server("a1"), make_server("a2", compute_factor=1.25, data_factor=2.0)
    b1, b2 = make_server("b1", gpu_type="T4"), make_server("b2", gpu_type="T4", compute_factor=2.0)
    servers = {s.id: s for s in (a1, a2, b1, b2)}
    assert [est.layer(job, s, 1) for s in (a1, a2, b1)] == ["theoretical", "theoretical", "unknown"]

    # a1 measured 64 samples/s where theory said 32 / 0.35: correction 64 * 0.35 / 32 = 0.7
    est.observe("j1", Config.single("a1", 1), servers, 64.0)
    assert est.layer(job, a1, 1) == "entity"
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(64.0)
    assert est.layer(job, a2, 1) == "type"
    assert est.per_gpu_rate(job, a2, 1) == pytest.approx(32 / 0.28 * 0.7)  # = 80
    assert est.layer(job, a1, 2) == "theoretical"  # another shape: nothing measured yet

    # no profile on T4: the measured value is carried over by the compute-factor ratio (2.0 / 1.0)
    est.observe("j1", Config.single("b1", 1), servers, 10.0)
    assert est.layer(job, b1, 1) == "entity"
    assert est.layer(job, b2, 1) == "type"
    assert est.per_gpu_rate(job, b2, 1) == pytest.approx(20.0)


def test_distributed_observation_fills_the_distributed_table() -> None:
    est = profiled()
    job = make_job(params=1e9)
    a1, a2, a3 = make_server("a1"), make_server("a2", compute_factor=0.5), make_server("a3")
    servers = {s.id: s for s in (a1, a2, a3)}
    config = Config.of({"a1": 2, "a2": 2})
    assert est.config_rate(job, config, servers) == pytest.approx(4 * 32 / 0.716)  # planned: spec now known
    est.observe("j1", config, servers, 200.0)
    assert est.layer(job, a1, 2, 2) == "entity"
    assert est.per_gpu_rate(job, a1, 2, 2) == pytest.approx(50.0)
    assert est.per_gpu_rate(job, a2, 2, 2) == pytest.approx(50.0)
    assert est.config_rate(job, config, servers) == pytest.approx(200.0)
    assert est.layer(job, a1, 2, 1) == "theoretical"  # aggregated table untouched
    # a3: theory of a3 times 50 / (slowest theory of the observed config, 32 / 0.716)
    assert est.layer(job, a3, 2, 2) == "type"
    assert est.per_gpu_rate(job, a3, 2, 2) == pytest.approx(32 / 0.366 * 50 / (32 / 0.716))


def test_type_layer_without_a_known_spec_uses_compute_factor_ratio() -> None:
    est = profiled()
    a1, a2 = make_server("a1"), make_server("a2", compute_factor=1.5)
    est.observe("j1", Config.single("a1", 1), {"a1": a1}, 40.0)  # no JobSpec seen yet: no ratio
    assert est.per_gpu_rate(make_job(), a2, 1) == pytest.approx(60.0)
    est.observe("j1", Config.single("a1", 1), {"a1": a1}, 40.0, job=make_job())
    assert est.per_gpu_rate(make_job(), a2, 1) == pytest.approx(
        32 / (0.25 / 1.5 + 0.1 / 1.5) * 40 / (32 / 0.35)
    )


def test_ewma_converges_to_repeated_measurements() -> None:
    est = profiled(alpha=0.5)
    job, a1 = make_job(), make_server("a1")
    one = Config.single("a1", 1)
    est.observe("j1", one, {"a1": a1}, 100.0)
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(100.0)
    est.observe("j1", one, {"a1": a1}, 200.0)
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(150.0)  # 0.5 * 200 + 0.5 * 100
    est.observe("j1", one, {"a1": a1}, 200.0)
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(175.0)
    for _ in range(40):
        est.observe("j1", one, {"a1": a1}, 200.0)
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(200.0, rel=1e-9)


def test_data_time_samples_shift_an_unstable_job() -> None:
    stable_looking = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.05, td_hit_s=0.1, td_miss_s=0.1, pattern=2)
    est = profiled(stable_looking)
    job, a1 = make_job(), make_server("a1")
    before = est.per_gpu_rate(job, a1, 1)
    assert before == pytest.approx(32 / 0.45)  # 0.1 + 0.25 + 0.1
    for i in range(2000):
        est.observe_data_time("j1", "V100", 0.9 if i % 2 else 0.1, 0.0)
    # half hits at 0.1, half misses at 0.9: E[T] = 0.5 * 0.45 + 0.5 * 1.25 = 0.85
    after = est.per_gpu_rate(job, a1, 1)
    assert after == pytest.approx(32 / 0.85, rel=0.01)
    assert est.layer(job, a1, 1) == "theoretical"
    est.observe_data_time("j1", "T4", 5.0, 0.0)  # no T4 profile: dropped
    assert est.per_gpu_rate(job, a1, 1) == after


def test_data_time_converges_toward_running_means() -> None:
    profile = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.05, td_hit_s=0.1, td_miss_s=0.5, p_cache=0.5, pattern=2)
    est = profiled(profile)
    job, a1 = make_job(), make_server("a1")
    for _ in range(3000):
        est.observe_data_time("j1", "V100", 0.2, 0.0)  # in truth always 0.2: all near the hit centre
    # T -> 0.2 + 0.25 + 0.1 = 0.55
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(32 / 0.55, rel=0.01)


def test_sensitivity() -> None:
    est = profiled()
    a1, a2, slow = make_server("a1"), make_server("a2"), make_server("a3", compute_factor=0.5)
    assert est.sensitivity(make_job(), a1, a2) == pytest.approx(1.0)
    # 1e10 bytes: tc = 0.8 across servers: busy = max(0.2 + 0.16, 0.8) + 0.05 = 0.85, T = 0.95
    big = make_job(params=1e10)
    assert est.sensitivity(big, a1, a2) == pytest.approx(0.95 / 0.35)
    assert est.sensitivity(big, a1, a1) == pytest.approx(0.95 / 0.35)
    assert est.sensitivity(big, a1, slow) > est.sensitivity(big, a1, a2)  # type: ignore[operator]
    assert est.sensitivity(big, make_server("t", gpu_type="T4"), a2) is None


def test_type_rate() -> None:
    est = profiled()
    job = make_job()
    assert est.type_rate(job, "V100") == pytest.approx(32 / 0.35)
    assert est.type_rate(job, "V100", Calibration(compute_factor=1.25, data_factor=2.0)) == pytest.approx(
        32 / 0.28
    )
    assert est.type_rate(job, "T4") is None
    servers = {s.id: s for s in (make_server("a1"), make_server("a2"))}
    est.observe("j1", Config.single("a1", 1), servers, 64.0)
    est.observe("j1", Config.single("a2", 1), servers, 80.0)
    est.observe("j1", Config.of({"a1": 1, "a2": 1}), servers, 10.0)  # distributed: not a 1-GPU value
    assert est.type_rate(job, "V100") == pytest.approx(72.0)


# -- cache --------------------------------------------------------------------------------------------


def test_cache_follows_profile_calibration_and_spec_changes() -> None:
    est = profiled()
    job, a1 = make_job(), make_server("a1")
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(32 / 0.35)
    est.add_profile(
        "j1", "V100", TimeProfile(tf_s=0.2, tb_s=0.2, tu_s=0.05, td_hit_s=0.1, td_miss_s=0.1), NOMINAL
    )
    assert est.per_gpu_rate(job, a1, 1) == pytest.approx(32 / 0.45)
    assert est.per_gpu_rate(job, make_server("a1", compute_factor=2.0), 1) == pytest.approx(32 / 0.225)
    assert est.per_gpu_rate(make_job(batch=64), a1, 1) == pytest.approx(64 / 0.45)
    # 1 GB: tc = 0.08; busy = max(0.216, 0.08) + 0.05 = 0.266; T = 0.266 + 0.2 = 0.466
    assert est.per_gpu_rate(make_job(params=1e9), a1, 1, 2) == pytest.approx(32 / 0.466)


def test_type_rate_cache_follows_every_change() -> None:
    est = profiled()
    job = make_job()
    assert est.type_rate(job, "V100") == pytest.approx(32 / 0.35)
    assert est.type_rate(make_job(batch=64), "V100") == pytest.approx(64 / 0.35)  # spec change
    est.add_profile(
        "j1", "V100", TimeProfile(tf_s=0.2, tb_s=0.2, tu_s=0.05, td_hit_s=0.1, td_miss_s=0.1), NOMINAL
    )
    assert est.type_rate(job, "V100") == pytest.approx(32 / 0.45)  # new profile
    est.observe_data_time("j1", "V100", 0.5, 0.0)
    assert est.type_rate(job, "V100") < 32 / 0.45  # a slow data-time sample lowers the theory
    est.forget("j1")
    assert est.type_rate(job, "V100") is None


def test_forget() -> None:
    est = profiled()
    a1 = make_server("a1")
    est.observe("j1", Config.single("a1", 1), {"a1": a1}, 64.0)
    est.forget("j1")
    assert est.per_gpu_rate(make_job(), a1, 1) is None
    assert not est.has_profile("j1", "V100")
    assert est.export_state()["entity"] == []


# -- persistence --------------------------------------------------------------------------------------


def test_export_import_round_trip() -> None:
    unstable = TimeProfile(
        tf_s=0.1,
        tb_s=0.2,
        tu_s=0.05,
        td_hit_s=0.1,
        td_miss_s=0.7,
        p_cache=0.8,
        tw_miss_s=0.02,
        td_miss_sigma=0.1,
    )
    est = profiled(unstable)
    est.add_profile("j2", "T4", PROFILE, Calibration(compute_factor=0.8, source="measured-gpu"))
    servers = {s.id: s for s in (make_server("a1"), make_server("a2"), make_server("b1", gpu_type="K80"))}
    job = make_job(params=5e8)
    est.per_gpu_rate(job, servers["a1"], 1)
    est.observe("j1", Config.single("a1", 1), servers, 70.0)
    est.observe("j1", Config.of({"a1": 2, "a2": 2}), servers, 150.0)
    est.observe("j1", Config.single("b1", 1), servers, 12.0)
    for td in (0.1, 0.8, 0.12, 0.75):
        est.observe_data_time("j1", "V100", td, td / 10)

    state = est.export_state()
    restored = Estimator.from_state(json.loads(json.dumps(state)))
    assert restored.export_state() == state
    probe = {**servers, "a3": make_server("a3", compute_factor=1.1), "b2": make_server("b2", gpu_type="K80")}
    for server in probe.values():
        for gpus, n in ((1, 1), (2, 1), (2, 2)):
            assert restored.per_gpu_rate(job, server, gpus, n) == est.per_gpu_rate(job, server, gpus, n)
            assert restored.layer(job, server, gpus, n) == est.layer(job, server, gpus, n)
    assert restored.profiled_types("j2") == frozenset({"T4"})


def test_from_state_rejects_malformed_state() -> None:
    good = profiled().export_state()
    with pytest.raises(ModelError, match="version"):
        Estimator.from_state({**good, "version": 99})
    with pytest.raises(ModelError, match="malformed"):
        Estimator.from_state({"version": good["version"]})
    bad_rate = {
        **good,
        "entity": [
            {"job": "j1", "server": "a", "gpus_here": 1, "n_servers": 1, "gpu_type": "V100", "rate": -1.0}
        ],
    }
    with pytest.raises(ModelError, match="rate"):
        Estimator.from_state(bad_rate)
    bad_profile = json.loads(json.dumps(good))
    bad_profile["profiles"][0]["profile"]["p_cache"] = 2.0
    with pytest.raises(ModelError, match="p_cache"):
        Estimator.from_state(bad_profile)


# -- invalid inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tf_s": -1.0}, "tf_s"),
        ({"tb_s": math.nan}, "tb_s"),
        ({"td_miss_s": math.inf}, "td_miss_s"),
        ({"tw_hit_s": -0.1}, "tw_hit_s"),
        ({"p_cache": 1.5}, "p_cache"),
        ({"p_cache": math.nan}, "p_cache"),
        ({"pattern": 3}, "pattern"),
        ({"pattern": True}, "pattern"),
        ({"tf_s": 0.0, "tb_s": 0.0, "tu_s": 0.0}, "tf_s"),
    ],
)
def test_invalid_profile_names_the_field(changes: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"tf_s": 0.1, "tb_s": 0.2, "tu_s": 0.05, "td_hit_s": 0.1, "td_miss_s": 0.1}
    values.update(changes)
    with pytest.raises(ModelError, match=field):
        TimeProfile(**values)  # type: ignore[arg-type]


def test_invalid_arguments_name_the_field() -> None:
    with pytest.raises(ModelError, match="pattern"):
        iteration_time(0.1, 0.2, 0.05, 0.1, 0.0, 0.0, 0)
    with pytest.raises(ModelError, match="gpus_here"):
        allreduce_time(1e9, 0, 1, 50.0, 12.5)
    with pytest.raises(ModelError, match="link_gbps"):
        allreduce_time(1e9, 2, 1, 0.0, 12.5)
    with pytest.raises(ModelError, match="compute_scale"):
        expected_iteration_time(PROFILE, 0.0, compute_scale=0.0)
    with pytest.raises(ModelError, match="ewma_alpha"):
        Estimator(ewma_alpha=0.0)
    est = profiled()
    a1 = make_server("a1")
    with pytest.raises(ModelError, match="gpus_here"):
        est.per_gpu_rate(make_job(), a1, 0)
    with pytest.raises(ModelError, match="n_servers"):
        est.per_gpu_rate(make_job(), a1, 1, 0)
    for bad in (0.0, -5.0, math.nan, math.inf):
        with pytest.raises(ModelError, match="samples_per_s"):
            est.observe("j1", Config.single("a1", 1), {"a1": a1}, bad)
    with pytest.raises(ModelError, match="'zz'"):
        est.observe("j1", Config.single("zz", 1), {"a1": a1}, 10.0)
    with pytest.raises(ModelError, match="td_s"):
        est.observe_data_time("j1", "V100", -1.0, 0.0)
    with pytest.raises(ModelError, match="tw_s"):
        est.observe_data_time("j1", "V100", 0.1, math.nan)
    assert est.export_state()["entity"] == []  # nothing recorded by the rejected calls


# -- properties ---------------------------------------------------------------------------------------

SHARED = profiled(TimeProfile(tf_s=0.03, tb_s=0.06, tu_s=0.01, td_hit_s=0.02, td_miss_s=0.2, p_cache=0.9))
factors = st.floats(min_value=0.25, max_value=4.0)


@given(
    params=st.tuples(st.floats(0, 1e11), st.floats(0, 1e11)).map(sorted),
    gpus=st.integers(1, 8),
    n_servers=st.integers(1, 4),
    compute=factors,
    data=factors,
    link=st.floats(1.0, 600.0),
    net=st.floats(0.5, 50.0),
)
def test_rate_positive_and_non_increasing_in_params(
    params: list[float], gpus: int, n_servers: int, compute: float, data: float, link: float, net: float
) -> None:
    server = make_server("s", compute_factor=compute, data_factor=data, link_gbps=link, net_gbps=net)
    small = SHARED.per_gpu_rate(make_job(params=params[0]), server, gpus, n_servers)
    large = SHARED.per_gpu_rate(make_job(params=params[1]), server, gpus, n_servers)
    assert small is not None and large is not None
    assert large > 0
    assert small >= large


@given(params=st.floats(0, 1e11), gpus=st.integers(1, 7), compute=factors)
def test_rate_non_increasing_in_gpus_on_one_server(params: float, gpus: int, compute: float) -> None:
    server = make_server("s", compute_factor=compute)
    job = make_job(params=params)
    fewer, more = SHARED.per_gpu_rate(job, server, gpus), SHARED.per_gpu_rate(job, server, gpus + 1)
    assert fewer is not None and more is not None
    assert fewer >= more > 0
