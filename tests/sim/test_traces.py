"""Tests of hopsmgr.sim.traces: the real traces in shared/data load, malformed lines raise TraceError."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hopsmgr.sim.gavelworld import gavel_world
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.traces import (
    TraceError,
    read_gavel_trace,
    read_philly_csv,
    read_tiresias_csv,
    read_trace,
    workload_from_spec,
)
from hopsmgr.sim.truth import World

DATA = Path(
    os.environ.get("HOPSMGR_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
)
THROUGHPUTS = DATA / "gavel" / "simulation_throughputs.json"
needs_data = pytest.mark.skipif(
    not THROUGHPUTS.is_file(), reason=f"shared data not found at {DATA} (set HOPSMGR_SHARED_DATA)"
)
PAPER = paper_world()
GAVEL: World | None = gavel_world(THROUGHPUTS) if THROUGHPUTS.is_file() else None

GOOD10 = "ResNet-50 (batch size 64)\tpython3 main.py\timagenet\t--num\t1\t2931\t2\t1\t-1.000000\t5"
GOOD7 = "LM (batch size 20)\tpython main.py\t--steps\t1\t1000\t7.0\t4"
PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster"
PHILLY_GOOD = "2017-10-09 07:01:55,66.0,1,66.0,11cb48"
TIRESIAS_HEAD = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval"
TIRESIAS_GOOD = "0,1,0,606,vgg19,164,30"


def gavel() -> World:
    assert GAVEL is not None
    return GAVEL


def write(tmp: Path, name: str, lines: list[str]) -> Path:
    path = tmp / name
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ real traces


@needs_data
@pytest.mark.parametrize(
    "path", sorted((DATA / "gavel" / "traces").glob("*/*.trace")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_every_gavel_trace_loads(path: Path) -> None:
    lines = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
    jobs = read_gavel_trace(path, gavel())
    assert len(jobs) == len(lines)
    assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs) and jobs[0].arrival_s == 0.0
    legacy = len(lines[0]) == 7
    first = min(lines, key=lambda c: float(c[5] if legacy else c[9]))
    steps, sf = (first[4], first[6]) if legacy else (first[5], first[6])
    job = jobs[0]
    assert job.model == first[0] and job.requirements.counts == (int(sf),)
    assert job.total_samples == pytest.approx(float(steps) * gavel().model(job.model).batch_size)
    assert all(j.duration_class in ("S", "M", "L", "XL") for j in jobs)


@needs_data
def test_philly_loads_the_earliest_jobs_deterministically() -> None:
    path = DATA / "philly" / "philly.csv"
    jobs = read_philly_csv(path, PAPER, limit=2000)
    assert len(jobs) == 2000 and jobs[0].arrival_s == 0.0
    assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
    assert len({j.tenant for j in jobs}) > 3 and len({j.model for j in jobs}) == 12
    assert max(j.requirements.maximum for j in jobs) >= 8
    again = read_philly_csv(path, PAPER, limit=2000)
    assert again == jobs
    other = read_philly_csv(path, PAPER, rng_seed=1, limit=2000)
    assert [j.model for j in other] != [j.model for j in jobs]
    assert read_philly_csv(path, PAPER, limit=10) == jobs[:10]  # models are drawn in arrival order


@needs_data
def test_tiresias_loads_and_keeps_known_model_names() -> None:
    jobs = read_tiresias_csv(DATA / "tiresias" / "60_job.csv", PAPER)
    assert len(jobs) == 60 and {j.job_id for j in jobs} == {str(i) for i in range(60)}
    by_id = {j.job_id: j for j in jobs}
    assert by_id["1"].model == "VGG11" and by_id["1"].requirements.counts == (8,)
    assert Counter(j.model for j in jobs)["ResNet50"] >= 6
    hours = by_id["0"].total_samples / PAPER.reference_rate(by_id["0"].model, 1) / 3600
    assert hours == pytest.approx(164 / 3600)


@needs_data
def test_read_trace_and_workload_from_spec_dispatch() -> None:
    tiresias = DATA / "tiresias" / "60_job.csv"
    assert read_trace(tiresias, "tiresias", PAPER) == read_tiresias_csv(tiresias, PAPER)
    assert len(workload_from_spec(f"tiresias:path={tiresias}", PAPER)) == 60
    philly = workload_from_spec(f"philly:path={DATA / 'philly' / 'philly.csv'},limit=30,seed=4", PAPER)
    assert philly == read_philly_csv(DATA / "philly" / "philly.csv", PAPER, rng_seed=4, limit=30)
    trace = DATA / "gavel" / "traces" / "physical_cluster" / "small_test.trace"
    assert workload_from_spec(f"gavel:path={trace},tenant=vc", gavel())[0].tenant == "vc"
    assert len(workload_from_spec("poisson:jobs=7,rate=10", PAPER)) == 7
    with pytest.raises(ValueError, match="'helios'"):
        read_trace(tiresias, "helios", PAPER)


def test_gavel_trace_in_the_paper_world_through_a_model_map(tmp_path: Path) -> None:
    path = write(tmp_path, "g.trace", [GOOD10])
    with pytest.raises(TraceError, match="unknown job type"):
        read_gavel_trace(path, PAPER)
    jobs = read_gavel_trace(path, PAPER, model_map={"ResNet-50 (batch size 64)": "ResNet50"})
    assert jobs[0].model == "ResNet50" and jobs[0].total_samples == 2931 * 64
    assert jobs[0].priority_weight == 1.0 and jobs[0].slo is None


# ------------------------------------------------------------------------------------ malformed


def cols(line: str, index: int, value: str, sep: str = "\t") -> str:
    parts = line.split(sep)
    parts[index] = value
    return sep.join(parts)


MALFORMED = [
    # (format, lines, bad line number, reason fragment)
    ("gavel", [GOOD10, "a\tb\tc"], 2, "columns"),
    ("gavel", [GOOD10, cols(GOOD10, 5, "many")], 2, "total_steps"),
    ("gavel", [GOOD10, cols(GOOD10, 5, "-4")], 2, "total_steps"),
    ("gavel", [GOOD10, cols(GOOD10, 6, "0")], 2, "scale_factor"),
    ("gavel", [GOOD10, cols(GOOD10, 6, "-2")], 2, "scale_factor"),
    ("gavel", [GOOD10, cols(GOOD10, 6, "1.5")], 2, "scale_factor"),
    ("gavel", [GOOD10, cols(GOOD10, 7, "0")], 2, "priority_weight"),
    ("gavel", [GOOD10, cols(GOOD10, 9, "nan")], 2, "arrival_time"),
    ("gavel", [GOOD10, cols(GOOD10, 9, "-1")], 2, "arrival_time"),
    ("gavel", [GOOD10, "", cols(GOOD10, 0, "BERT (batch size 8)")], 3, "unknown job type"),
    ("gavel", [GOOD7, cols(GOOD7, 6, "x")], 2, "scale_factor"),
    ("gavel", [GOOD7, cols(GOOD7, 4, "1e400")], 2, "total_steps"),
    ("gavel", [GOOD7, GOOD7 + "\textra"], 2, "columns"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, "2017-10-09 07:01:55,66.0,1,66.0"], 3, "columns"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, cols(PHILLY_GOOD, 1, "long", ",")], 3, "duration"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, cols(PHILLY_GOOD, 1, "-3", ",")], 3, "duration"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, cols(PHILLY_GOOD, 2, "-1", ",")], 3, "num_gpus"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, cols(PHILLY_GOOD, 2, "two", ",")], 3, "num_gpus"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, cols(PHILLY_GOOD, 2, "100000", ",")], 3, "num_gpus"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, cols(PHILLY_GOOD, 3, "?", ",")], 3, "gpu_time"),
    ("philly", [PHILLY_HEAD, PHILLY_GOOD, cols(PHILLY_GOOD, 0, "yesterday", ",")], 3, "timestamp"),
    ("philly", ["timestamp,duration,gpus,gpu_time,cluster", PHILLY_GOOD], 1, "num_gpus"),
    ("tiresias", [TIRESIAS_HEAD, TIRESIAS_GOOD, "1,1,0,606,vgg19,164"], 3, "columns"),
    ("tiresias", [TIRESIAS_HEAD, TIRESIAS_GOOD, "1,-1,0,606,vgg19,164,30"], 3, "num_gpu"),
    ("tiresias", [TIRESIAS_HEAD, TIRESIAS_GOOD, "1,1,soon,606,vgg19,164,30"], 3, "submit_time"),
    ("tiresias", [TIRESIAS_HEAD, TIRESIAS_GOOD, "1,1,0,606,vgg19,0,30"], 3, "duration"),
    ("tiresias", [TIRESIAS_HEAD, TIRESIAS_GOOD, TIRESIAS_GOOD], 3, "job_id"),
    ("tiresias", [TIRESIAS_HEAD, TIRESIAS_GOOD, '"1,1,0,606,vgg19,164,30'], 3, "columns"),
]


@needs_data
@pytest.mark.parametrize(("fmt", "lines", "line", "reason"), MALFORMED)
def test_malformed_lines_raise_trace_error_with_file_and_line(
    tmp_path: Path, fmt: str, lines: list[str], line: int, reason: str
) -> None:
    path = write(tmp_path, f"bad.{fmt}", lines)
    world = gavel() if fmt == "gavel" else PAPER
    with pytest.raises(TraceError) as info:
        read_trace(path, fmt, world)
    err = info.value
    assert str(err).startswith(f"{path}:{line}: ")
    assert (err.path, err.line) == (str(path), line) and reason in err.reason


@pytest.mark.parametrize(
    ("fmt", "lines", "line"),
    [
        ("gavel", [], 0),
        ("gavel", ["", "   ", "# comment"], 3),
        ("philly", [], 0),
        ("philly", [PHILLY_HEAD], 1),
        ("tiresias", [TIRESIAS_HEAD, ""], 2),
    ],
)
def test_empty_trace_raises_trace_error(tmp_path: Path, fmt: str, lines: list[str], line: int) -> None:
    path = write(tmp_path, f"empty.{fmt}", lines)
    with pytest.raises(TraceError, match="empty trace") as info:
        read_trace(path, fmt, PAPER)
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_philly_limit_must_be_positive(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", [PHILLY_HEAD, PHILLY_GOOD])
    assert len(read_philly_csv(path, PAPER, limit=1)) == 1
    with pytest.raises(ValueError, match="limit"):
        read_philly_csv(path, PAPER, limit=0)


# ------------------------------------------------------------------------------------ junk

TOKENS = st.sampled_from(
    [
        "",
        "0",
        "1",
        "-1",
        "2.5",
        "1e400",
        "nan",
        "inf",
        "8",
        "99999",
        "x",
        "ResNet-50 (batch size 64)",
        "vgg11",
    ]
)
FIELDS = st.one_of(TOKENS, st.text(max_size=12))
JUNK = {
    "gavel": st.one_of(st.text(max_size=80), st.lists(FIELDS, min_size=6, max_size=11).map("\t".join)),
    "philly": st.one_of(st.text(max_size=80), st.lists(FIELDS, min_size=4, max_size=6).map(",".join)),
    "tiresias": st.one_of(st.text(max_size=80), st.lists(FIELDS, min_size=6, max_size=8).map(",".join)),
}
HEADERS = {"gavel": [GOOD7], "philly": [PHILLY_HEAD, PHILLY_GOOD], "tiresias": [TIRESIAS_HEAD, TIRESIAS_GOOD]}


@needs_data
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(sorted(JUNK)), data=st.data())
def test_junk_lines_raise_nothing_but_trace_error(fmt: str, data: st.DataObject) -> None:
    junk = data.draw(st.lists(JUNK[fmt], min_size=1, max_size=3))
    world = gavel() if fmt == "gavel" else PAPER
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "junk.txt"
        path.write_text("\n".join([*HEADERS[fmt], *junk]) + "\n", encoding="utf-8", errors="surrogatepass")
        try:
            jobs = read_trace(path, fmt, world)
        except TraceError as err:
            assert err.line >= 0 and str(err).startswith(f"{path}:{err.line}: ")
        else:
            assert jobs and all(j.total_samples > 0 and j.arrival_s >= 0 for j in jobs)
