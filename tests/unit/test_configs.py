"""Unit tests of hopsmgr.core.configs: configuration generation, placement sensitivity, the span rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core import configs
from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import Calibration, Config, JobSpec, Server
from tests.helpers.builders import job_spec

# Three servers: two of type A (4 GPUs each, adjacent), one of type B (8 GPUs).
S0 = Server("s0", "A", 4, order=0)
S1 = Server("s1", "A", 4, order=1)
S2 = Server("s2", "B", 8, order=2)
SERVERS = {s.id: s for s in (S0, S1, S2)}
FULL = {"s0": 4, "s1": 4, "s2": 8}

# No parameters to all-reduce and no data time: per-GPU rate = batch / (tf + tb + tu) everywhere.
PROFILE_A = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)
PROFILE_B = TimeProfile(tf_s=0.05, tb_s=0.1, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)
RATE_A = 32 / 0.3
RATE_B = 32 / 0.15


def job(counts: tuple[int, ...], job_id: str = "j", params: float = 0.0) -> JobSpec:
    return job_spec(job_id, counts, params_bytes=params)


def estimator_for(*specs: JobSpec, types: tuple[str, ...] = ("A", "B")) -> Estimator:
    est = Estimator()
    for spec in specs:
        for t in types:
            est.add_profile(spec.id, t, PROFILE_A if t == "A" else PROFILE_B, Calibration())
    return est


def configs_of(candidates: list[configs.Candidate]) -> set[Config]:
    return {c.config for c in candidates}


def C(**parts: int) -> Config:
    return Config.of(parts)


def gen(
    spec: JobSpec, free: dict[str, int], span: bool, est: Estimator | None = None
) -> list[configs.Candidate]:
    est = est or estimator_for(spec)
    by_type = configs.group_by_type(SERVERS.values(), free)
    return configs.generate(spec, by_type, free, SERVERS, est, span)


# --- group_by_type --------------------------------------------------------------------------------------


def test_group_by_type_orders_by_adjacency_and_drops_empty_servers() -> None:
    servers = [Server("b", "A", 4, order=2), Server("a", "A", 4, order=5), Server("c", "A", 4, order=0), S2]
    groups = configs.group_by_type(servers, {"a": 1, "b": 4, "c": 2, "s2": 0})
    assert [s.id for s in groups["A"]] == ["c", "b", "a"]
    assert "B" not in groups
    # Ties in `order` are broken by id.
    tied = configs.group_by_type([Server("y", "A", 1), Server("x", "A", 1)], {"x": 1, "y": 1})
    assert [s.id for s in tied["A"]] == ["x", "y"]


# --- aggregated configurations --------------------------------------------------------------------------


def test_aggregated_only_where_capacity_allows() -> None:
    cands = gen(job((2, 4, 8)), FULL, span=False)
    assert configs_of(cands) == {
        C(s0=2),
        C(s1=2),
        C(s0=4),
        C(s1=4),
        C(s2=2),
        C(s2=4),
        C(s2=8),
        # 8 GPUs fit no server of s0's type: spanning them is its only placement there, offered even
        # without span (the program weighs it against s2's 8 GPUs)
        C(s0=4, s1=4),
    }
    assert len(cands) == len(configs_of(cands))  # no duplicates
    assert [c.config for c in cands if c.config.distributed] == [C(s0=4, s1=4)]


def test_aggregated_respects_partial_free_gpus() -> None:
    cands = gen(job((2, 4)), {"s0": 1, "s1": 3, "s2": 4}, span=False)
    assert configs_of(cands) == {C(s1=2), C(s2=2), C(s2=4)}


def test_rates_are_the_estimators_and_hand_computed() -> None:
    spec = job((2, 4, 8))
    est = estimator_for(spec)
    for cand in gen(spec, FULL, span=True, est=est):
        assert cand.rate == pytest.approx(est.config_rate(spec, cand.config, SERVERS))
        assert cand.rate > 0
    rates = {c.config: c.rate for c in gen(spec, FULL, span=True, est=est)}
    assert rates[C(s0=2)] == pytest.approx(2 * RATE_A)
    assert rates[C(s2=8)] == pytest.approx(8 * RATE_B)
    assert rates[C(s0=4, s1=4)] == pytest.approx(8 * RATE_A)


def test_unprofiled_type_gets_no_configurations() -> None:
    spec = job((2, 4))
    est = estimator_for(spec, types=("A",))
    cands = gen(spec, FULL, span=True, est=est)
    assert cands
    assert all(set(c.config.servers) <= {"s0", "s1"} for c in cands)


# --- distributed configurations -------------------------------------------------------------------------


def test_distributed_only_when_span() -> None:
    spec = job((2, 4, 8))
    free = {"s0": 2, "s1": 4, "s2": 8}
    without = configs_of(gen(spec, free, span=False))
    with_span = configs_of(gen(spec, free, span=True))
    # 4 GPUs fit one A server (s1): split over s0 and s1 only with span.
    assert with_span - without == {C(s0=2, s1=2)}
    assert without <= with_span
    # 8 GPUs fit no A server: 4 + 4 on the two adjacent A servers is offered either way (else type A
    # could never run the count); B's single server holds 8 itself.
    assert C(s0=4, s1=4) in configs_of(gen(spec, FULL, span=False))
    assert configs_of(gen(spec, FULL, span=True)) == configs_of(gen(spec, FULL, span=False))


def test_distributed_fills_each_starting_server_as_much_as_possible() -> None:
    spec = job((2, 4, 8))
    cands = gen(spec, {"s0": 1, "s1": 4, "s2": 8}, span=True)
    distributed = {c.config for c in cands if c.config.distributed}
    # Start at s0: all of its 1 GPU, the rest from s1. Start at s1: s1 holds it alone (aggregated).
    # 8 GPUs: 1 + 4 < 8, the A servers run out.
    assert distributed == {C(s0=1, s1=1), C(s0=1, s1=3)}
    assert C(s1=4) in configs_of(cands)


def test_distributed_over_adjacent_servers_only() -> None:
    # Adjacency follows `order`, not ids: b (0) - c (1) - a (2).
    a, b, c = Server("a", "A", 2, order=2), Server("b", "A", 2, order=0), Server("c", "A", 2, order=1)
    servers = {s.id: s for s in (a, b, c)}
    free = {"a": 1, "b": 1, "c": 1}
    spec = job((2, 3))
    est = estimator_for(spec, types=("A",))
    by_type = configs.group_by_type(servers.values(), free)
    got = configs_of(configs.generate(spec, by_type, free, servers, est, span=True))
    # 2 GPUs: from b (b, c), from c (c, a); a alone runs out. 3 GPUs: only from b, over all three.
    assert got == {C(b=1, c=1), C(a=1, c=1), C(a=1, b=1, c=1)}
    assert C(a=1, b=1) not in got


def test_no_configurations_when_servers_run_out() -> None:
    spec = job((9, 16))
    assert gen(spec, FULL, span=True) == []
    assert gen(spec, FULL, span=False) == []


def test_each_configuration_has_a_requested_count_and_fits() -> None:
    spec = job((1, 2, 3, 5, 7))
    free = {"s0": 3, "s1": 4, "s2": 5}
    for cand in gen(spec, free, span=True):
        assert cand.config.gpus in spec.requirements
        for sid, g in cand.config.parts:
            assert g <= free[sid]
        # Never mixes GPU types.
        assert len({SERVERS[sid].gpu_type for sid in cand.config.servers}) == 1


def test_distributed_parts_direct() -> None:
    servers = [S0, S1]
    assert configs.distributed_parts(servers, {"s0": 3, "s1": 4}, 0, 5) == [("s0", 3), ("s1", 2)]
    assert configs.distributed_parts(servers, {"s0": 3, "s1": 4}, 0, 3) == [("s0", 3)]
    assert configs.distributed_parts(servers, {"s0": 3, "s1": 4}, 1, 5) is None
    assert configs.distributed_parts(servers, {"s0": 0, "s1": 4}, 0, 4) == [("s1", 4)]
    assert configs.distributed_parts(servers, {"s0": 3, "s1": 4}, 0, 8) is None


# --- the span rule and sensitivity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rho", "minimum", "largest", "expected"),
    [
        (1.0, 2, 8, True),  # low sensitivity: always
        (1.4, 2, 8, True),  # rho == sigma is not "above the threshold"
        (1.41, 2, 8, False),  # high sensitivity, fits one server
        (3.0, 8, 8, False),  # exactly the largest server: still fits
        (3.0, 9, 8, True),  # no single server can hold the smallest requirement
        (1.0, 16, 8, True),
    ],
)
def test_may_span(rho: float, minimum: int, largest: int, expected: bool) -> None:
    spec = job((minimum, minimum * 2))
    assert configs.may_span(spec, rho, 1.4, largest) is expected


def test_sensitivity_of_a_communication_bound_job() -> None:
    # 12.5 GB of parameters over a 12.5 GB/s network: Tc = 1 s across servers, 0 on one GPU.
    spec = job((1, 2), params=12.5e9)
    est = estimator_for(spec)
    by_type = configs.group_by_type(SERVERS.values(), FULL)
    rho = configs.sensitivity(spec, by_type, est)
    # alone: tf + tb + tu = 0.3 s; across: max(tb + 0.2 Tc, Tc) + tu + tf = 1.0 + 0.1 = 1.1 s (type A)
    assert rho == pytest.approx(1.1 / 0.3)
    assert rho == pytest.approx(est.sensitivity(spec, S0, S1))
    assert not configs.may_span(spec, rho, 1.4, 8)


def test_sensitivity_is_one_without_two_servers_of_a_type() -> None:
    spec = job((1, 2), params=12.5e9)
    est = estimator_for(spec)
    only_b = configs.group_by_type(SERVERS.values(), {"s0": 4, "s2": 8})
    assert configs.sensitivity(spec, only_b, est) == 1.0
    # Unknown (no profile on the type): 1.0 as well.
    assert configs.sensitivity(spec, configs.group_by_type(SERVERS.values(), FULL), Estimator()) == 1.0


@settings(max_examples=60, deadline=None)
@given(
    st.floats(0.0, 5e10),
    st.floats(0.001, 0.5),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.5),
    st.sampled_from([1, 2]),
    st.floats(0.5, 2.0),
)
def test_sensitivity_is_at_least_one(
    params: float, tf: float, tb: float, td: float, pattern: int, compute: float
) -> None:
    spec = job((1, 2), params=params)
    est = Estimator()
    est.add_profile(spec.id, "A", TimeProfile(tf, tb, 0.0, td, td, pattern=pattern), Calibration())
    fast = Server("f", "A", 4, Calibration(compute_factor=compute), order=0)
    servers = {"f": fast, "s1": S1}
    by_type = configs.group_by_type(servers.values(), {"f": 4, "s1": 4})
    assert configs.sensitivity(spec, by_type, est) >= 1.0
