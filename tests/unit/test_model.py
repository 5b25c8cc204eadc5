"""Unit tests of hopsmgr.core.model: requirement sets, configurations, job specs and their validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core.model import (
    ClusterSnapshot,
    Config,
    JobSpec,
    JobView,
    ModelError,
    RequirementSet,
    Server,
)

# --- RequirementSet ------------------------------------------------------------------------------------


def test_rigid_has_one_count() -> None:
    r = RequirementSet.rigid(4)
    assert r.counts == (4,)
    assert r.minimum == r.maximum == r.median == 4
    assert r.mean == 4.0


def test_of_sorts_and_deduplicates() -> None:
    r = RequirementSet.of([8, 2, 4, 2])
    assert r.counts == (2, 4, 8)
    assert list(r) == [2, 4, 8]
    assert 4 in r
    assert 3 not in r
    assert r.minimum == 2
    assert r.maximum == 8
    assert r.mean == pytest.approx(14 / 3)
    assert r.median == 4


def test_median_of_even_length_is_the_lower_middle() -> None:
    assert RequirementSet.of([1, 2, 4, 8]).median == 2


@pytest.mark.parametrize(
    ("low", "high", "levels", "expected"),
    [
        (2, 8, 4, (2, 4, 6, 8)),  # step 2
        (1, 8, 4, (1, 3, 6, 8)),  # step 7/3: 1, 3.33, 5.67, 8
        (1, 8, 2, (1, 8)),
        (1, 8, 1, (1,)),  # one level: the minimum only
        (4, 4, 3, (4,)),  # low == high: one count
        (1, 2, 4, (1, 2)),  # 1, 1.33, 1.67, 2: more levels than integers collapse
        (4, 16, 4, (4, 8, 12, 16)),
    ],
)
def test_span_hand_computed(low: int, high: int, levels: int, expected: tuple[int, ...]) -> None:
    assert RequirementSet.span(low, high, levels).counts == expected


def test_span_1_16_5() -> None:
    # step 15/4 = 3.75: 1, 4.75, 8.5, 12.25, 16; 8.5 is equally near 8 and 9.
    counts = RequirementSet.span(1, 16, 5).counts
    assert counts in {(1, 5, 8, 12, 16), (1, 5, 9, 12, 16)}


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(0, 64), st.integers(1, 12))
def test_span_properties(low: int, extra: int, levels: int) -> None:
    high = low + extra
    counts = RequirementSet.span(low, high, levels).counts
    assert counts[0] == low
    assert counts[-1] == (high if levels > 1 else low)
    assert list(counts) == sorted(set(counts))
    assert len(counts) <= levels
    if levels > 1 and extra >= levels - 1:
        # Enough integers between the bounds: every level survives, each within 0.5 of its ideal value.
        assert len(counts) == levels
        step = extra / (levels - 1)
        for k, c in enumerate(counts):
            assert abs(c - (low + k * step)) <= 0.5


@pytest.mark.parametrize(
    "counts",
    [(), (0,), (-1,), (2, 0), (1.5,), (2.0,), (True,), (1, True), ("2",)],
)
def test_constructor_rejects_invalid_counts(counts: tuple[object, ...]) -> None:
    with pytest.raises(ModelError, match="requirements"):
        RequirementSet(counts)  # type: ignore[arg-type]


@pytest.mark.parametrize("counts", [(4, 2), (2, 2), (1, 4, 2)])
def test_constructor_rejects_unsorted_or_repeated(counts: tuple[int, ...]) -> None:
    with pytest.raises(ModelError, match="ascending and distinct") as info:
        RequirementSet(counts)
    assert repr(list(counts)) in str(info.value)


def test_zero_and_negative_are_named_in_the_message() -> None:
    with pytest.raises(ModelError, match="got 0"):
        RequirementSet.of([2, 0])
    with pytest.raises(ModelError, match="got -3"):
        RequirementSet.of([-3])
    with pytest.raises(ModelError, match="got True"):
        RequirementSet.of([True])
    with pytest.raises(ModelError, match="must not be empty"):
        RequirementSet.of([])


@pytest.mark.parametrize(
    ("low", "high", "levels", "field"),
    [
        (0, 4, 2, "min"),
        (-2, 4, 2, "min"),
        (1.0, 4, 2, "min"),
        (4, 2, 2, "max"),
        (2, 3.5, 2, "max"),
        (1, 4, 0, "rnum"),
        (1, 4, -1, "rnum"),
        (1, 4, 2.0, "rnum"),
    ],
)
def test_span_rejects_invalid_bounds(low: object, high: object, levels: object, field: str) -> None:
    with pytest.raises(ModelError, match=field) as info:
        RequirementSet.span(low, high, levels)  # type: ignore[arg-type]
    assert repr({"min": low, "max": high, "rnum": levels}[field]) in str(info.value)


@pytest.mark.parametrize(("low", "high", "levels"), [(True, 4, 2), (1, 4, True), (1, True, 2)])
def test_span_rejects_bools(low: object, high: object, levels: object) -> None:
    # bool is an int subclass; `of` and the constructor reject it, so must `span`.
    with pytest.raises(ModelError):
        RequirementSet.span(low, high, levels)  # type: ignore[arg-type]


# --- Config --------------------------------------------------------------------------------------------


def test_config_of_sorts_drops_zeros_and_sums() -> None:
    c = Config.of({"s2": 4, "s0": 2, "s1": 0})
    assert c.parts == (("s0", 2), ("s2", 4))
    assert c.gpus == 6
    assert c.servers == ("s0", "s2")
    assert c.distributed
    assert c.as_dict() == {"s0": 2, "s2": 4}
    assert str(c) == "{s0: 2, s2: 4}"


def test_config_single() -> None:
    c = Config.single("a", 3)
    assert c.parts == (("a", 3),)
    assert not c.distributed
    assert c.gpus == 3
    assert c == Config.of({"a": 3})
    assert hash(c) == hash(Config.of({"a": 3}))


def test_config_equality_ignores_mapping_order() -> None:
    assert Config.of({"a": 1, "b": 2}) == Config.of({"b": 2, "a": 1})
    assert Config.of({"a": 1, "b": 2}) != Config.of({"a": 2, "b": 1})


def test_config_rejects_empty() -> None:
    with pytest.raises(ModelError, match="at least one server"):
        Config(())
    with pytest.raises(ModelError, match="at least one server"):
        Config.of({})
    with pytest.raises(ModelError, match="at least one server"):
        Config.of({"a": 0})


def test_config_rejects_duplicate_server() -> None:
    with pytest.raises(ModelError, match="'a' twice"):
        Config((("a", 1), ("a", 2)))


@pytest.mark.parametrize("gpus", [0, -1])
def test_config_rejects_non_positive_parts(gpus: int) -> None:
    with pytest.raises(ModelError, match=f"'b' {gpus} GPUs"):
        Config((("a", 1), ("b", gpus)))


def test_config_of_rejects_negative_counts() -> None:
    # A zero entry means "none here" and is dropped; a negative count is never valid and must not vanish.
    with pytest.raises(ModelError):
        Config.of({"a": 2, "b": -1})


def test_config_rejects_fractional_gpus() -> None:
    with pytest.raises(ModelError):
        Config((("a", 1.5),))  # type: ignore[arg-type]


# --- JobSpec -------------------------------------------------------------------------------------------


def spec(**kw: object) -> JobSpec:
    args: dict[str, object] = {
        "id": "j",
        "requirements": RequirementSet.of([2, 4]),
        "total_samples": 1000.0,
        "batch_size": 32,
    }
    args.update(kw)
    return JobSpec(**args)  # type: ignore[arg-type]


def test_jobspec_defaults() -> None:
    s = spec()
    assert s.tenant == "default"
    assert s.restart_s == 60.0
    assert s.params_bytes == 0.0


@pytest.mark.parametrize("work", [0.0, -1.0, -1e9, math.inf, math.nan])
def test_jobspec_rejects_non_positive_or_non_finite_work(work: float) -> None:
    with pytest.raises(ModelError, match="total work must be positive") as info:
        spec(total_samples=work)
    assert "'j'" in str(info.value)


@pytest.mark.parametrize("batch", [0, -4, 2.5])
def test_jobspec_rejects_bad_batch(batch: object) -> None:
    with pytest.raises(ModelError, match=f"batch_size must be a positive integer, got {batch!r}"):
        spec(batch_size=batch)


def test_jobspec_rejects_bool_batch() -> None:
    with pytest.raises(ModelError, match="batch_size"):
        spec(batch_size=True)


def test_jobspec_rejects_empty_id() -> None:
    with pytest.raises(ModelError, match=r"job\.id"):
        spec(id="")


@pytest.mark.parametrize(("name", "value"), [("params_bytes", -1.0), ("params_bytes", math.inf)])
def test_jobspec_rejects_bad_params(name: str, value: float) -> None:
    with pytest.raises(ModelError, match=name):
        spec(**{name: value})


@pytest.mark.parametrize("value", [-0.5, math.nan])
def test_jobspec_rejects_bad_restart(value: float) -> None:
    with pytest.raises(ModelError, match="restart_s"):
        spec(restart_s=value)


def test_samples_from_iterations_uses_smallest_count() -> None:
    # iters x batch x R1 = 100 x 32 x 2
    assert JobSpec.samples_from_iterations(100, 32, RequirementSet.of([2, 4, 8])) == 6400.0
    assert JobSpec.samples_from_iterations(2.5, 8, RequirementSet.rigid(1)) == 20.0
    value = JobSpec.samples_from_iterations(10, 4, RequirementSet.rigid(3))
    assert isinstance(value, float)
    assert value == 120.0


@pytest.mark.parametrize("iterations", [0, -5, math.inf, math.nan])
def test_samples_from_iterations_rejects_bad_iterations(iterations: float) -> None:
    with pytest.raises(ModelError, match="iterations must be positive"):
        JobSpec.samples_from_iterations(iterations, 32, RequirementSet.rigid(1))


# --- Server, JobView, ClusterSnapshot -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"id": ""}, "server.id"),
        ({"gpu_type": ""}, "gpu_type"),
        ({"gpus": 0}, "gpus must be a positive integer"),
        ({"gpus": 2.0}, "gpus must be a positive integer"),
    ],
)
def test_server_validation(kw: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"id": "s0", "gpu_type": "A", "gpus": 4}
    args.update(kw)
    with pytest.raises(ModelError, match=match):
        Server(**args)  # type: ignore[arg-type]


def test_jobview_remaining_and_running() -> None:
    view = JobView(spec(total_samples=100.0), done_samples=30.0)
    assert view.id == "j"
    assert view.remaining_samples == 70.0
    assert not view.running
    done = JobView(spec(total_samples=100.0), done_samples=130.0, current=Config.single("s", 2))
    assert done.remaining_samples == 0.0
    assert done.running


def test_snapshot_total_counts_capacity_of_known_servers_only() -> None:
    servers = (Server("a", "A", 4), Server("b", "A", 8))
    snap = ClusterSnapshot(servers, {"a": 3, "ghost": 16}, (), now=0.0)
    assert snap.total_gpus == 3
    assert set(snap.server_map()) == {"a", "b"}
