"""Unit tests of hopsmgr.core.reconcile: plan vs current placements -> ordered, safe actions."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core.model import Config
from hopsmgr.core.reconcile import (
    Action,
    CheckpointStop,
    Launch,
    ReconcileError,
    reconcile,
    replay,
)

CAP = {"s0": 4, "s1": 4, "s2": 2}


def C(**parts: int) -> Config:
    return Config.of(parts)


def stops_of(actions: Sequence[Action]) -> list[CheckpointStop]:
    return [a for a in actions if isinstance(a, CheckpointStop)]


def launches_of(actions: Sequence[Action]) -> dict[str, Launch]:
    return {a.job_id: a for a in actions if isinstance(a, Launch)}


def assert_stops_first(actions: Sequence[Action]) -> None:
    kinds = [isinstance(a, CheckpointStop) for a in actions]
    assert kinds == sorted(kinds, reverse=True), actions


def parallel_safe(
    current: Mapping[str, Config], actions: Sequence[Action], capacity: Mapping[str, int]
) -> None:
    """An executor may start a launch as soon as the stops in its `after` finished, in parallel with
    anything else. Check every set of finished stops: what still runs plus every enabled launch fits."""
    stops = stops_of(actions)
    launches = list(launches_of(actions).values())
    stopping = {s.job_id for s in stops}
    kept = {j: c for j, c in current.items() if j not in stopping}
    for r in range(len(stops) + 1):
        for finished in itertools.combinations(stops, r):
            done = {s.job_id for s in finished}
            running: list[Config] = list(kept.values())
            running += [s.config for s in stops if s.job_id not in done]
            running += [launch.config for launch in launches if set(launch.after) <= done]
            used: dict[str, int] = {}
            for config in running:
                for sid, g in config.parts:
                    used[sid] = used.get(sid, 0) + g
            for sid, n in used.items():
                assert n <= capacity.get(sid, 0), (sorted(done), sid, n)


# --- ordering and kinds ---------------------------------------------------------------------------------


def test_unchanged_plan_needs_no_actions() -> None:
    current = {"a": C(s0=2), "b": C(s1=4)}
    assert reconcile(current, dict(current), CAP) == []


def test_stops_come_before_launches() -> None:
    current = {"a": C(s0=2), "b": C(s1=4), "k": C(s2=2)}
    desired = {"k": C(s2=2), "b": C(s0=2, s1=2), "n": C(s1=2), "m": C(s0=2)}
    actions = reconcile(current, desired, CAP)
    assert_stops_first(actions)
    assert [(s.job_id, s.reason) for s in stops_of(actions)] == [("a", "preempted"), ("b", "migrated")]
    assert list(launches_of(actions)) == ["b", "m", "n"]
    assert "k" not in {a.job_id for a in actions}  # kept as it is
    assert replay(current, actions, CAP) == desired


def test_preempted_job_is_stopped_with_its_config() -> None:
    actions = reconcile({"a": C(s0=3)}, {}, CAP)
    assert actions == [CheckpointStop("a", C(s0=3), "preempted")]


def test_moved_job_is_checkpointed_then_resumed() -> None:
    current = {"a": C(s0=4)}
    desired = {"a": C(s0=2, s1=2)}
    actions = reconcile(current, desired, CAP)
    assert actions[0] == CheckpointStop("a", C(s0=4), "migrated")
    launch = launches_of(actions)["a"]
    assert launch.config == C(s0=2, s1=2)
    assert launch.resume is True
    assert "a" in launch.after  # its own GPUs on s0 are needed
    assert replay(current, actions, CAP) == desired


def test_moved_job_waits_for_its_own_checkpoint_even_on_idle_gpus() -> None:
    # a moves from s0 to the idle s1: its GPUs are free, but it resumes from the checkpoint its stop
    # writes, so the relaunch must not start before that stop finished.
    actions = reconcile({"a": C(s0=2)}, {"a": C(s1=2)}, CAP)
    assert_stops_first(actions)
    launch = launches_of(actions)["a"]
    assert launch.resume is True
    assert "a" in launch.after


def test_resume_flag_for_new_launches() -> None:
    actions = reconcile({}, {"new": C(s0=1), "old": C(s1=1)}, CAP, resumable=frozenset({"old"}))
    launches = launches_of(actions)
    assert launches["new"].resume is False
    assert launches["old"].resume is True
    assert launches["new"].after == ()
    assert launches["old"].after == ()


# --- errors ---------------------------------------------------------------------------------------------


def test_over_allocating_plan_is_refused() -> None:
    with pytest.raises(ReconcileError, match="'s0'"):
        reconcile({}, {"a": C(s0=3), "b": C(s0=2)}, CAP)
    with pytest.raises(ReconcileError, match="'s2'"):
        reconcile({"a": C(s2=1)}, {"a": C(s2=1), "b": C(s2=2)}, CAP)


def test_plan_on_unknown_server_is_refused() -> None:
    with pytest.raises(ReconcileError, match="'ghost'"):
        reconcile({}, {"a": C(ghost=1)}, CAP)


def test_replay_detects_bad_sequences() -> None:
    with pytest.raises(ReconcileError, match="over-allocated"):
        replay({"a": C(s2=2)}, [Launch("b", C(s2=1), False)], CAP)
    with pytest.raises(ReconcileError, match="before stops"):
        replay({"a": C(s2=2)}, [Launch("b", C(s1=1), False, after=("a",))], CAP)
    with pytest.raises(ReconcileError, match="does not hold"):
        replay({"a": C(s2=2)}, [CheckpointStop("a", C(s2=1), "preempted")], CAP)
    with pytest.raises(ReconcileError, match="already runs"):
        replay({"a": C(s2=2)}, [Launch("a", C(s1=1), False)], CAP)


# --- `after` ---------------------------------------------------------------------------------------------


def test_after_lists_exactly_the_stops_whose_gpus_are_needed() -> None:
    current = {"x": C(s0=4), "y": C(s1=2), "z": C(s2=2)}
    desired = {
        "p": C(s0=4),  # needs all of x's GPUs
        "q": C(s1=2),  # s1 has 2 idle GPUs: no stop needed
        "r": C(s1=2, s2=2),  # s1's idle GPUs went to q: needs y's; and z's on s2
    }
    actions = reconcile(current, desired, CAP)
    launches = launches_of(actions)
    assert launches["p"].after == ("x",)
    assert launches["q"].after == ()
    assert launches["r"].after == ("y", "z")
    parallel_safe(current, actions, CAP)
    assert replay(current, actions, CAP) == desired


def test_after_when_idle_gpus_cover_part_of_a_launch() -> None:
    # s0: x holds 3 of 4; the launch needs 2 there: 1 idle + 1 of x's.
    current = {"x": C(s0=3)}
    actions = reconcile(current, {"n": C(s0=2)}, CAP)
    assert launches_of(actions)["n"].after == ("x",)
    # 1 GPU needs no stop.
    actions = reconcile(current, {"n": C(s0=1)}, CAP)
    assert launches_of(actions)["n"].after == ()


def test_after_names_only_stops() -> None:
    # k stays on s0; the launch uses the other 2 GPUs of s0, idle now: nothing to wait for.
    current = {"k": C(s0=2), "x": C(s1=4)}
    actions = reconcile(current, {"k": C(s0=2), "n": C(s0=2)}, CAP)
    assert launches_of(actions)["n"].after == ()
    assert stops_of(actions) == [CheckpointStop("x", C(s1=4), "preempted")]


# --- properties -----------------------------------------------------------------------------------------

SMALL_CAP = {"s0": 4, "s1": 2, "s2": 3}
JOBS = [f"j{k}" for k in range(6)]


@st.composite
def placements(draw: st.DrawFn) -> dict[str, Config]:
    """A random placement that fits SMALL_CAP."""
    free = dict(SMALL_CAP)
    out: dict[str, Config] = {}
    for job in JOBS:
        if not draw(st.booleans()):
            continue
        servers = draw(st.lists(st.sampled_from(sorted(SMALL_CAP)), min_size=1, max_size=2, unique=True))
        parts = {s: draw(st.integers(1, SMALL_CAP[s])) for s in servers}
        if all(free[s] >= g for s, g in parts.items()):
            for s, g in parts.items():
                free[s] -= g
            out[job] = Config.of(parts)
    return out


@settings(max_examples=300, deadline=None)
@given(placements(), placements(), st.frozensets(st.sampled_from(JOBS)))
def test_reconcile_is_safe_and_reaches_the_plan(
    current: dict[str, Config], desired: dict[str, Config], resumable: frozenset[str]
) -> None:
    actions = reconcile(current, desired, SMALL_CAP, resumable)
    assert_stops_first(actions)
    assert replay(current, actions, SMALL_CAP) == desired
    parallel_safe(current, actions, SMALL_CAP)
    stops = {s.job_id: s for s in stops_of(actions)}
    launches = launches_of(actions)
    # Exactly the jobs that leave or move are stopped; exactly the new or moved ones are launched.
    assert set(stops) == {j for j in current if desired.get(j) != current[j]}
    assert set(launches) == {j for j in desired if current.get(j) != desired[j]}
    for job_id, stop in stops.items():
        assert stop.config == current[job_id]
        assert stop.reason == ("preempted" if job_id not in desired else "migrated")
    for job_id, launch in launches.items():
        assert launch.config == desired[job_id]
        assert launch.resume == (job_id in resumable or job_id in current)
        assert set(launch.after) <= set(stops)
        # A moved job resumes from the checkpoint its own stop writes: it waits for that stop.
        if job_id in stops:
            assert job_id in launch.after
        # Any other stop is waited for only if it frees GPUs on a server the launch uses.
        for waited in launch.after:
            if waited != job_id:
                assert set(stops[waited].config.servers) & set(launch.config.servers)
