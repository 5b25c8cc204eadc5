"""Tests of hopsmgr.sim.workload: the Poisson generator and the workload-spec parser."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core.model import JobSpec
from hopsmgr.sim.gavelworld import gavel_world
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.workload import (
    DURATION_CLASSES,
    REQUIREMENT_MENU,
    WorkloadJob,
    duration_class,
    parse_workload_spec,
    poisson_workload,
    reference_gpu_hours,
    reference_gpu_type,
    to_job_spec,
)

DATA = Path(
    os.environ.get("HOPSMGR_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
)
THROUGHPUTS = DATA / "gavel" / "simulation_throughputs.json"
WORLD = paper_world()


@pytest.fixture(scope="module")
def big() -> list[WorkloadJob]:
    return poisson_workload(WORLD, 2000, 100.0, seed=11, tenants=("a", "b", "c"))


def test_count_ids_and_arrivals(big: list[WorkloadJob]) -> None:
    assert len(big) == 2000
    assert len({j.job_id for j in big}) == 2000
    arrivals = [j.arrival_s for j in big]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    rate_per_hour = (len(big) - 1) / arrivals[-1] * 3600
    assert rate_per_hour == pytest.approx(100.0, rel=0.1)
    assert {j.tenant for j in big} == {"a", "b", "c"}
    assert {j.model for j in big} == {m.name for m in WORLD.models()}


def test_duration_class_mix_and_gpu_time_within_class(big: list[WorkloadJob]) -> None:
    counts = Counter(j.duration_class for j in big)
    for name, share, _, _ in DURATION_CLASSES:
        assert counts[name] / len(big) == pytest.approx(share, abs=0.04)
    bounds = {name: (low, high) for name, _, low, high in DURATION_CLASSES}
    for job in big:
        low, high = bounds[job.duration_class]
        hours = reference_gpu_hours(WORLD, job)
        assert low * 0.999 <= hours <= high * 1.001


def test_requirement_sets_are_valid(big: list[WorkloadJob]) -> None:
    menu = {counts for counts, _ in REQUIREMENT_MENU}
    assert sum(share for _, share in REQUIREMENT_MENU) == pytest.approx(1.0)
    assert sum(c[1] for c in DURATION_CLASSES) == pytest.approx(1.0)
    for counts in menu:
        assert counts[0] >= 1 and counts[-1] <= 16 and len(counts) <= 8
    sets = Counter(j.requirements.counts for j in big)
    assert set(sets) <= menu
    rigid = sum(n for counts, n in sets.items() if len(counts) == 1)
    assert 0.2 < rigid / len(big) < 0.4
    assert max(len(c) for c in sets) == 8 and max(c[-1] for c in sets) == 16
    for job in big:
        assert job.batch_size == WORLD.model(job.model).batch_size and job.total_samples > 0


def test_deterministic_by_seed() -> None:
    a = poisson_workload(WORLD, 50, 60.0, seed=5)
    assert a == poisson_workload(WORLD, 50, 60.0, seed=5)
    assert a != poisson_workload(WORLD, 50, 60.0, seed=6)
    # aspects draw from separate streams: the arrivals do not depend on the tenants
    b = poisson_workload(WORLD, 50, 60.0, seed=5, tenants=("x", "y"))
    assert [j.arrival_s for j in a] == [j.arrival_s for j in b]
    assert poisson_workload(WORLD, 0, 60.0, seed=5) == []


def test_reference_type_follows_gpu_types() -> None:
    assert reference_gpu_type(WORLD) == "titanxp"
    assert reference_gpu_type(WORLD, ["rtx3090", "GTX1080Ti"]) == "rtx3090"
    slow = poisson_workload(WORLD, 20, 60.0, seed=1, gpu_types=["gtx1080ti"])
    fast = poisson_workload(WORLD, 20, 60.0, seed=1, gpu_types=["rtx3090"])
    assert all(f.total_samples > s.total_samples for s, f in zip(slow, fast, strict=True))
    with pytest.raises(ValueError, match="a100"):
        poisson_workload(WORLD, 5, 60.0, seed=1, gpu_types=["a100"])


@pytest.mark.skipif(not THROUGHPUTS.is_file(), reason=f"shared data not found at {DATA}")
def test_gavel_world_workload() -> None:
    world = gavel_world(THROUGHPUTS)
    jobs = poisson_workload(world, 100, 30.0, seed=2)
    assert {j.model for j in jobs} <= {m.name for m in world.models()}
    assert all(j.duration_class == duration_class(reference_gpu_hours(world, j)) for j in jobs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"jobs": -1}, "jobs"),
        ({"jobs": 2.5}, "jobs"),
        ({"rate_per_hour": 0.0}, "rate_per_hour"),
        ({"rate_per_hour": float("nan")}, "rate_per_hour"),
        ({"tenants": ()}, "tenants"),
        ({"tenants": ("a", "")}, "tenants"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"jobs": 3, "rate_per_hour": 10.0, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        poisson_workload(WORLD, **args)  # type: ignore[arg-type]


def test_to_job_spec() -> None:
    job = poisson_workload(WORLD, 1, 10.0, seed=3, tenants=("t",))[0]
    spec = to_job_spec(job, WORLD)
    model = WORLD.model(job.model)
    assert isinstance(spec, JobSpec)
    assert (spec.id, spec.tenant, spec.model, spec.submit_time) == (job.job_id, "t", job.model, 0.0)
    assert spec.params_bytes == model.params_bytes and spec.restart_s == model.restart_s


def test_duration_class_bounds() -> None:
    assert [duration_class(h) for h in (0.0, 0.99, 1.0, 9.9, 10.0, 49.9, 50.0, 1e6)] == [
        "S",
        "S",
        "M",
        "M",
        "L",
        "L",
        "XL",
        "XL",
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("poisson:jobs=500,rate=100", {"kind": "poisson", "jobs": 500, "rate": 100.0}),
        (
            " Poisson : jobs = 5 , rate=2.5, seed=0, tenants=a|b ",
            {"kind": "poisson", "jobs": 5, "rate": 2.5, "seed": 0, "tenants": ("a", "b")},
        ),
        ("philly:path=/x/philly.csv,limit=2000", {"kind": "philly", "path": "/x/philly.csv", "limit": 2000}),
        ("tiresias:path=t.csv", {"kind": "tiresias", "path": "t.csv"}),
        ("gavel:path=a.trace,tenant=vc1", {"kind": "gavel", "path": "a.trace", "tenant": "vc1"}),
    ],
)
def test_parse_workload_spec(spec: str, expected: dict[str, object]) -> None:
    assert parse_workload_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "part"),
    [
        ("uniform:jobs=5", "'uniform'"),
        ("poisson:jobs=5", "rate"),
        ("poisson:jobs=x,rate=1", "'x'"),
        ("poisson:jobs=0,rate=1", "jobs"),
        ("poisson:jobs=5,rate=-1", "'-1'"),
        ("poisson:jobs=5,rate=inf", "'inf'"),
        ("poisson:jobs=5,rate=1,speed=3", "'speed'"),
        ("poisson:jobs=5,rate=1,jobs=6", "'jobs'"),
        ("poisson:jobs=5,rate=1,oops", "'oops'"),
        ("poisson:jobs=5,rate=1,seed=-2", "'-2'"),
        ("poisson:jobs=5,rate=1,tenants=|", "tenants"),
        ("philly:limit=3", "path"),
        ("philly:path=", "path"),
        ("", "''"),
    ],
)
def test_bad_spec_names_the_part(spec: str, part: str) -> None:
    with pytest.raises(ValueError, match=part.replace("|", r"\|")):
        parse_workload_spec(spec)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_spec_parser_raises_only_value_error(spec: str) -> None:
    try:
        result = parse_workload_spec(spec)
    except ValueError:
        return
    assert result["kind"] in ("poisson", "gavel", "philly", "tiresias")
