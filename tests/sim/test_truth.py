"""Tests of hopsmgr.sim.truth: the gavel and paper ground-truth worlds."""

from __future__ import annotations

import json
import math
import os
import random
import statistics
from pathlib import Path

import pytest

from hopsmgr.core.iteration import expected_iteration_time
from hopsmgr.core.model import Server
from hopsmgr.sim import gavelworld, paperworld
from hopsmgr.sim.gavelworld import gavel_world
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.worlds import world_by_name

DATA = Path(
    os.environ.get("HOPSMGR_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
)
THROUGHPUTS = DATA / "gavel" / "simulation_throughputs.json"
needs_data = pytest.mark.skipif(
    not THROUGHPUTS.is_file(), reason=f"shared data not found at {DATA} (set HOPSMGR_SHARED_DATA)"
)
KINDS = [("gtx1080ti", ""), ("titanxp", ""), ("rtx3090", "A"), ("rtx3090", "B"), ("rtx3090", "C")]


def server(sid: str, gpu_type: str, host: str = "", gpus: int = 8) -> Server:
    return Server(sid, gpu_type, gpus, host_model=host)


def null_steps(worker: str, job: str, gpus: int) -> float:
    table = json.loads(THROUGHPUTS.read_text())
    return float(table[worker][f"('{job}', {gpus})"]["null"])


# ------------------------------------------------------------------------------------------ paper


def test_paper_world_has_twelve_models_and_five_server_kinds() -> None:
    world = paper_world()
    assert len(world.models()) == 12
    assert world.gpu_types() == ("gtx1080ti", "titanxp", "rtx3090")
    for gpu_type, host in KINDS:
        assert world.true_rate("ResNet50", [(server("s", gpu_type, host), 1)]) > 0
    gpt2 = world.model("GPT-2 medium")
    assert gpt2.params_bytes == pytest.approx(354.8e6 * 4)
    assert world.model("ResNet18").restart_s < gpt2.restart_s <= 250


def test_paper_docstring_table_matches_the_constants() -> None:
    doc = paperworld.__doc__ or ""
    for name, pm in paperworld._PAPER_MODELS.items():
        row = next(line for line in doc.splitlines() if line.startswith(f"| {name} "))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) == pm.params_m and int(cells[2]) == pm.batch
        assert cells[3] == f"{pm.tf_ms:g}/{pm.tb_ms:g}" and float(cells[4]) == pm.td_miss_ms
        assert [float(c) for c in cells[5:8]] == [pm.p_hit, pm.hit_ratio, pm.overlap]
        assert int(cells[8]) == pm.pattern


def test_worlds_are_deterministic_and_differ_per_server_within_a_type() -> None:
    a, b = server("tx-1", "titanxp"), server("tx-2", "titanxp")
    w1, w2 = paper_world(seed=3), paper_world(seed=3)
    for model in ("ResNet18", "ViT", "GPT-2 medium"):
        assert w1.true_rate(model, [(a, 4)]) == w2.true_rate(model, [(a, 4)])
        assert w1.true_rate(model, [(a, 1)]) != w1.true_rate(model, [(b, 1)])
    assert paper_world(seed=4).true_rate("ViT", [(a, 1)]) != w1.true_rate("ViT", [(a, 1)])
    flat = paper_world(per_server_sigma=0.0)
    assert flat.true_rate("ViT", [(a, 2)]) == flat.true_rate("ViT", [(b, 2)])


def test_gpu_and_host_speeds_order_as_documented() -> None:
    world = paper_world(per_server_sigma=0.0)
    rate = {k: world.true_rate("ViT", [(server("s", *k), 1)]) for k in KINDS}
    assert rate[KINDS[0]] < rate[KINDS[1]] < rate[KINDS[2]]
    # data-heavy model: the newer host CPU (C) and the bigger cache (B) help; contention grows with GPUs
    data = {k: world.true_rate("MobileNetV2", [(server("s", *k), 4)]) for k in KINDS[2:]}
    assert data[("rtx3090", "A")] < data[("rtx3090", "B")] < data[("rtx3090", "C")]
    assert world.true_rate("ViT", [(server("s", "RTX 3090", "model C"), 1)]) == rate[("rtx3090", "C")]


@pytest.mark.parametrize("model", [m.name for m in paper_world().models()])
def test_paper_multi_gpu_scaling_is_sublinear(model: str) -> None:
    world = paper_world(per_server_sigma=0.0)
    s1 = server("a", "rtx3090", "A")
    rates = [world.true_rate(model, [(s1, n)]) for n in (1, 2, 4, 8)]
    assert rates == sorted(rates)
    assert 0.4 < rates[3] / (8 * rates[0]) < 0.97


def test_spreading_costs_communication_but_relieves_a_busy_host_cpu() -> None:
    world = paper_world(per_server_sigma=0.0)
    s1, s2 = server("a", "rtx3090", "A"), server("b", "rtx3090", "A")
    for model in ("VGG11", "VGG13", "ConvNeXt-base", "DistilBERT", "ViT", "GPT-2 medium"):
        assert world.true_rate(model, [(s1, 4), (s2, 4)]) < world.true_rate(model, [(s1, 8)])
    assert world.true_rate("MobileNetV2", [(s1, 4), (s2, 4)]) > world.true_rate("MobileNetV2", [(s1, 8)])


def test_slowest_server_sets_the_pace_within_a_type() -> None:
    world = paper_world(per_server_sigma=0.3)  # hidden per-server factors: same type, unequal speeds
    a, b = server("a", "rtx3090", "A"), server("b", "rtx3090", "A")
    a2, b2 = server("a2", "rtx3090", "A"), server("b2", "rtx3090", "A")
    both = world.true_rate("ViT", [(a, 2), (b, 2)])
    assert (
        both
        <= min(world.true_rate("ViT", [(a, 2), (a2, 2)]), world.true_rate("ViT", [(b, 2), (b2, 2)])) * 1.05
    )


def test_across_gpu_types_each_gpu_runs_at_its_own_pace() -> None:
    # Speed-balanced batches (hopsmgr.runtime.balance): the fast GPUs take more of the global batch,
    # so the mixed rate lies between the all-slow and all-fast ones, near their mean.
    world = paper_world(per_server_sigma=0.0)
    slow, slow2, fast = server("s", "gtx1080ti"), server("s2", "gtx1080ti"), server("f", "rtx3090", "C")
    fast2 = server("f2", "rtx3090", "C")
    for model in ("ViT", "ResNet50", "MobileNetV2"):
        mixed = world.true_rate(model, [(slow, 2), (fast, 2)])
        all_slow = world.true_rate(model, [(slow, 2), (slow2, 2)])
        all_fast = world.true_rate(model, [(fast, 2), (fast2, 2)])
        assert all_slow < mixed < all_fast, model
        assert mixed == pytest.approx((all_slow + all_fast) / 2, rel=0.15), model


def test_true_rate_differs_from_the_estimator_formula_beyond_one_gpu() -> None:
    world = paper_world(per_server_sigma=0.0)
    s = server("a", "rtx3090", "A")
    profile = world.profile("ResNet18", s, random.Random(0))
    est_one = world.model("ResNet18").batch_size / expected_iteration_time(profile, 0.0)
    est8 = 8 * est_one  # the estimator with no communication and no contention
    assert world.true_rate("ResNet18", [(s, 8)]) < 0.85 * est8


@pytest.mark.parametrize("kind", KINDS)
def test_paper_profile_matches_the_true_rate_on_one_gpu(kind: tuple[str, str]) -> None:
    world, rng = paper_world(seed=1), random.Random(7)
    s = server("p-" + "".join(kind), *kind)
    for tm in world.models():
        true = world.true_rate(tm.name, [(s, 1)])
        estimates = []
        for _ in range(20):
            profile = world.profile(tm.name, s, rng)
            assert 0 < profile.p_cache <= 1 and profile.td_hit_s <= profile.td_miss_s * 1.3
            estimates.append(tm.batch_size / expected_iteration_time(profile, 0.0))
        assert all(abs(e / true - 1) < 0.2 for e in estimates), tm.name
        assert statistics.fmean(estimates) == pytest.approx(true, rel=0.05), tm.name


def test_sample_rate_is_noisy_around_the_true_rate() -> None:
    world, rng = paper_world(), random.Random(1)
    parts = [(server("a", "titanxp"), 4), (server("b", "titanxp"), 2)]
    true = world.true_rate("MobileNetV2", parts)
    samples = [world.sample_rate("MobileNetV2", parts, rng) for _ in range(400)]
    assert min(samples) > 0 and statistics.pstdev(samples) > 0
    assert statistics.fmean(samples) == pytest.approx(true, rel=0.02)


def test_calibration_tracks_the_hidden_factors() -> None:
    world = paper_world(seed=2, per_server_sigma=0.15)
    servers = [server(f"c{i}", "rtx3090", "A") for i in range(6)]
    for s in servers:
        cal = world.calibration(s)
        assert cal.source == "emulated" and cal == world.calibration(s)
        ratio = world.true_rate("GPT-2 medium", [(s, 1)]) / world.true_rate("GPT-2 medium", [(servers[0], 1)])
        cal_ratio = cal.compute_factor / world.calibration(servers[0]).compute_factor
        assert cal_ratio == pytest.approx(ratio, rel=0.08)
    assert world.calibration(server("x", "rtx3090", "C")).data_factor > 1.2


def test_rng_key_gives_a_fixed_job_instance_factor() -> None:
    world, parts = paper_world(), [(server("a", "titanxp"), 2)]
    base = world.true_rate("VGG11", parts)
    assert world.true_rate("VGG11", parts, rng_key=0) == base
    keyed = world.true_rate("VGG11", parts, rng_key=17)
    assert keyed == world.true_rate("VGG11", parts, rng_key=17) and keyed != base
    assert keyed == pytest.approx(base, rel=0.15)
    assert world.true_rate("vgg11", parts, rng_key=17) == keyed  # loose model names share the factor
    rng = random.Random(4)
    samples = [world.sample_rate("VGG11", parts, rng, rng_key=17) for _ in range(300)]
    assert statistics.fmean(samples) == pytest.approx(keyed, rel=0.01)
    s = parts[0][0]
    one = world.true_rate("VGG11", [(s, 1)], rng_key=17)
    profiles = [world.profile("VGG11", s, rng, rng_key=17) for _ in range(40)]
    estimates = [64 / expected_iteration_time(p, 0.0) for p in profiles]
    assert statistics.fmean(estimates) == pytest.approx(one, rel=0.04)


def test_invalid_inputs_raise_value_error_naming_the_value() -> None:
    world = paper_world()
    with pytest.raises(ValueError, match="a100"):
        world.true_rate("ViT", [(server("s", "a100"), 1)])
    with pytest.raises(ValueError, match="'Z'"):
        world.true_rate("ViT", [(server("s", "rtx3090", "Z"), 1)])
    with pytest.raises(ValueError, match="AlexNet"):
        world.true_rate("AlexNet", [(server("s", "titanxp"), 1)])
    with pytest.raises(ValueError, match="at least one"):
        world.true_rate("ViT", [])
    with pytest.raises(ValueError, match="9"):
        world.true_rate("ViT", [(server("s", "titanxp"), 9)])
    with pytest.raises(ValueError, match="unknown world"):
        world_by_name("nope")


def test_reference_rate_is_the_true_rate_on_nominal_servers() -> None:
    world = paper_world(per_server_sigma=0.0)
    assert world.reference_rate("ViT", 1) == world.true_rate("ViT", [(server("x", "titanxp"), 1)])
    parts = [(server("x", "rtx3090", "A"), 8), (server("y", "rtx3090", "A"), 4)]
    assert world.reference_rate("ViT", 12, "rtx3090") == pytest.approx(world.true_rate("ViT", parts))


# ------------------------------------------------------------------------------------------ gavel


@needs_data
def test_gavel_world_reproduces_the_file_at_zero_sigma() -> None:
    world = gavel_world(THROUGHPUTS, per_server_sigma=0.0)
    cases = [
        ("v100", "ResNet-50 (batch size 64)", 1, 64),
        ("k80", "A3C", 1, 1),
        ("p100", "Transformer (batch size 64)", 4, 64),
        ("k80", "LM (batch size 20)", 8, 20),
    ]
    for worker, job, gpus, batch in cases:
        expected = null_steps(worker, job, gpus) * batch
        assert world.true_rate(job, [(server("s", worker.upper()), gpus)]) == pytest.approx(expected)
    assert len(world.models()) == 26 and world.gpu_types() == ("k80", "p100", "v100")
    assert world_by_name("gavel", throughputs_path=THROUGHPUTS).name == "gavel"


@needs_data
def test_gavel_world_fills_missing_counts_and_slows_spread_jobs() -> None:
    world = gavel_world(THROUGHPUTS, per_server_sigma=0.0)
    job, s = "Transformer (batch size 64)", server("p", "p100", gpus=8)
    r2, r3, r4 = (world.true_rate(job, [(s, n)]) for n in (2, 3, 4))
    assert r2 < r3 < r4
    assert r3 == pytest.approx(r2 * (r4 / r2) ** math.log2(1.5))
    r8 = world.true_rate(job, [(s, 8)])
    assert isinstance(world, gavelworld.GavelWorld)
    assert world.steps_per_s(job, "p100", 32) * 64 == pytest.approx(r8 * (r8 / r4) ** 2)
    spread = world.true_rate(job, [(s, 4), (server("q", "p100"), 4)])
    ratio = null_steps("p100_unconsolidated", job, 8) / null_steps("p100", job, 8)
    assert spread == pytest.approx(r8 * ratio) and spread < r8
    three = [(server(f"p{i}", "p100"), 4) for i in range(3)]
    assert world.true_rate(job, three) < world.true_rate(job, three[:2]) * 1.5
    a3c = world.true_rate("A3C", [(s, 2)]) / world.true_rate("A3C", [(s, 1)])
    assert a3c == pytest.approx(1.8)
    # superlinear entries are capped at linear scaling
    v = server("v", "v100")
    assert world.true_rate("ResNet-18 (batch size 16)", [(v, 2)]) <= 2 * world.true_rate(
        "ResNet-18 (batch size 16)", [(v, 1)]
    )
    with pytest.raises(ValueError, match="h100"):
        world.true_rate(job, [(server("h", "h100"), 1)])


@needs_data
def test_gavel_world_without_spread_slowdown_uses_consolidated_rates() -> None:
    # --gavel-compat: Gavel's simulator runs a job over several servers at its consolidated rate.
    world = gavel_world(THROUGHPUTS, per_server_sigma=0.0, spread_slowdown=False)
    job = "Transformer (batch size 64)"
    r8 = world.true_rate(job, [(server("p", "p100", gpus=8), 8)])
    assert world.true_rate(job, [(server("p", "p100"), 4), (server("q", "p100"), 4)]) == pytest.approx(r8)
    two = [(server(f"p{i}", "p100"), 4) for i in range(2)]
    assert gavel_world(THROUGHPUTS, per_server_sigma=0.0).true_rate(job, two) < r8


@needs_data
def test_gavel_world_per_server_factors_profile_and_calibration() -> None:
    world = gavel_world(THROUGHPUTS, seed=5)
    a, b = server("v1", "v100"), server("v2", "v100")
    job = "ResNet-50 (batch size 32)"
    assert world.true_rate(job, [(a, 1)]) != world.true_rate(job, [(b, 1)])
    nominal = null_steps("v100", job, 1) * 32
    for s in (a, b):
        factor = world.true_rate(job, [(s, 1)]) / nominal
        assert world.calibration(s).compute_factor == pytest.approx(factor, rel=0.08)
        rng = random.Random(3)
        estimates = [32 / expected_iteration_time(world.profile(job, s, rng), 0.0) for _ in range(30)]
        assert statistics.fmean(estimates) == pytest.approx(world.true_rate(job, [(s, 1)]), rel=0.05)
    sample = world.sample_rate(job, [(a, 2)], random.Random(0))
    assert sample == pytest.approx(world.true_rate(job, [(a, 2)]), rel=0.15)


def test_parse_job_type() -> None:
    assert gavelworld.parse_job_type("ResNet-18 (batch size 16)") == ("ResNet-18", 16)
    assert gavelworld.parse_job_type("CycleGAN") == ("CycleGAN", 1)
