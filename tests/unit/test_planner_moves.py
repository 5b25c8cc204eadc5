"""Unit tests of hopsmgr.core.planner on hand-built rounds: when a running job moves, and when it keeps its
GPUs.

A move must pay for its restart and checkpoint over the round's horizon; a young attempt is protected;
a move that frees nothing must gain move_min_gain (through a chain of moves too); a running job behind
the window moves only to make room; a running job the solver leaves out keeps GPUs that nothing else
uses. CBC is called through PuLP on tiny snapshots (tests/unit/_planner_helpers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from hopsmgr.core.model import Config, JobView, TenantQuota
from hopsmgr.core.planner import Plan, plan_round
from hopsmgr.core.settings import SchedulerSettings
from tests.unit._planner_helpers import EXACT, C, profiled, snapshot, spec, srv, used_per_server


def moving_round(
    round_seconds: float,
    restart_penalty: bool = True,
    solver: str = "exact",
    fast: str = "A",
    speed: float = 3.0,
    min_attempt_s: float = 0.0,
    preemption_cost: bool = True,
) -> Plan:
    # j runs on the slow a0 (an old attempt: not protected); the idle f1 (type `fast`) has `speed` x the
    # compute: moving multiplies the rate by `speed`.
    servers = [srv("a0", 2, 1.0, order=0), srv("f1", 2, speed, gpu_type=fast, order=1)]
    job = JobView(spec("j", 2, restart_s=60.0), current=C(a0=2), running_s=600.0, attempt_s=600.0)
    settings_ = SchedulerSettings(
        solver=solver,  # type: ignore[arg-type]
        gap=0.0,
        round_seconds=round_seconds,
        restart_penalty=restart_penalty,
        min_attempt_s=min_attempt_s,
        preemption_cost=preemption_cost,
    )
    return plan_round(snapshot(servers, [job]), profiled(job, types=("A", "B")), settings_)


# The class model values a class at its median server, so its move test puts the fast server in a class
# of its own (another GPU type); the exact model is tested both ways.
MOVES = [("exact", "A"), ("exact", "B"), ("classes", "B")]


@pytest.mark.parametrize(("solver", "fast"), MOVES)
def test_running_job_moves_when_the_gain_pays_for_the_restart(solver: str, fast: str) -> None:
    # restart factor 1 - 60 / max(300, 0 + 2 x 60) = 0.8; 3 x 0.8 = 2.4 > 1: move.
    assert moving_round(300.0, solver=solver, fast=fast).assignments == {"j": C(f1=2)}


@pytest.mark.parametrize(("solver", "fast"), MOVES)
def test_running_job_keeps_its_configuration_when_the_restart_costs_more(solver: str, fast: str) -> None:
    # 1.5 x (1 - 60 / 150) = 0.9 < 1: keep.
    assert moving_round(150.0, solver=solver, fast=fast, speed=1.5).assignments == {"j": C(a0=2)}
    # Without the penalty the same round moves it.
    plan = moving_round(150.0, restart_penalty=False, solver=solver, fast=fast, speed=1.5)
    assert plan.assignments == {"j": C(f1=2)}


def test_restart_penalty_threshold() -> None:
    # Without the preemption cost, moving pays exactly when 1.5 x (1 - 60 / round) > 1: round > 180 s.
    assert moving_round(179.0, speed=1.5, preemption_cost=False).assignments == {"j": C(a0=2)}
    assert moving_round(181.0, speed=1.5, preemption_cost=False).assignments == {"j": C(f1=2)}


def test_a_move_also_pays_its_checkpoint() -> None:
    # With it, the move loses the checkpoint too (5 s for a job with no parameters given): it pays
    # when 1.5 x (1 - 65 / round) > 1, i.e. round > 195 s.
    assert moving_round(194.0, speed=1.5).assignments == {"j": C(a0=2)}
    assert moving_round(196.0, speed=1.5).assignments == {"j": C(f1=2)}


def test_restart_horizon_is_at_least_the_minimum_attempt() -> None:
    # min_attempt_s = 300: the horizon is max(150, 300 + 120) = 420 s, so 1.5 x (1 - 60/420) > 1: move.
    assert moving_round(150.0, speed=1.5, min_attempt_s=300.0).assignments == {"j": C(f1=2)}


def test_a_young_attempt_keeps_its_gpus() -> None:
    # The same job with a 100-s-old attempt is protected by the minimum attempt length: it stays.
    servers = [srv("a0", 2, 1.0, order=0), srv("f1", 2, 3.0, order=1)]
    job = JobView(spec("j", 2, restart_s=60.0), current=C(a0=2), running_s=100.0, attempt_s=100.0)
    plan = plan_round(
        snapshot(servers, [job]), profiled(job), SchedulerSettings(gap=0.0, min_attempt_s=300.0)
    )
    assert plan.assignments == {"j": C(a0=2)}


def test_running_job_keeps_its_configuration_among_equals() -> None:
    # Two identical servers: moving gains nothing and costs the restart.
    servers = [srv("a0", 2, order=0), srv("a1", 2, order=1)]
    job = JobView(spec("j", 2), current=C(a1=2))
    plan = plan_round(snapshot(servers, [job]), profiled(job), EXACT)
    assert plan.assignments == {"j": C(a1=2)}


def test_a_running_job_behind_the_window_moves_to_free_a_whole_server_for_a_wide_job() -> None:
    # a and b (1 GPU each, low priority) sit on s1 and s2; two 4-GPU jobs of a tenant capped at 4 GPUs
    # have waited long and fill the window, so one of them can run. Keep-or-drop alone can give it a
    # whole server only by preempting a or b; moving a next to b (or b next to a) preempts no one.
    servers = [srv("s1", 4, order=0), srv("s2", 4, order=1)]
    a = JobView(spec("a", 1, restart_s=0.0), current=C(s1=1), running_s=20_000.0, attempt_s=20_000.0)
    b = JobView(spec("b", 1, restart_s=0.0), current=C(s2=1), running_s=20_000.0, attempt_s=20_000.0)
    w1 = JobView(spec("w1", 4, tenant="wide", restart_s=0.0), waited_s=5_000.0)
    w2 = JobView(spec("w2", 4, tenant="wide", restart_s=0.0), waited_s=5_000.0)
    tenants = {"wide": TenantQuota("wide", cap_gpus=4)}
    settings_ = SchedulerSettings(solver="exact", gap=0.0, round_seconds=360.0)
    plan = plan_round(snapshot(servers, [a, b, w1, w2], tenants=tenants), profiled(a, b, w1, w2), settings_)
    assert "a" not in plan.window and "b" not in plan.window
    assert {"a", "b"} <= plan.assignments.keys()  # no one preempted
    wide = [j for j in ("w1", "w2") if j in plan.assignments]
    assert len(wide) == 1 and plan.assignments[wide[0]].gpus == 4
    assert sorted(used_per_server(plan.assignments).values()) == [2, 4]


@pytest.mark.parametrize("restart_penalty", [True, False])
def test_a_running_job_behind_the_window_is_not_moved_for_nothing(restart_penalty: bool) -> None:
    # a runs alone on one of three identical servers, behind a window of three 4-GPU jobs of which the
    # tenant cap lets one run: moving a gains nothing, even where a move costs nothing (no penalty)
    servers = [srv("s1", 4, order=0), srv("s2", 4, order=1), srv("s3", 4, order=2)]
    tenants = {"wide": TenantQuota("wide", cap_gpus=4)}
    settings_ = SchedulerSettings(
        solver="exact", gap=0.0, round_seconds=360.0, restart_penalty=restart_penalty
    )
    for where in ("s1", "s2", "s3"):
        a = JobView(spec("a", 1, restart_s=0.0), current=C(**{where: 1}), running_s=2e4, attempt_s=2e4)
        wide = [JobView(spec(f"w{k}", 4, tenant="wide", restart_s=0.0), waited_s=5_000.0) for k in range(3)]
        plan = plan_round(snapshot(servers, [a, *wide], tenants=tenants), profiled(a, *wide), settings_)
        assert "a" not in plan.window
        assert plan.assignments["a"] == a.current


@pytest.mark.parametrize(("min_gain", "moved"), [(0.15, False), (0.0, True)])
def test_a_move_that_frees_nothing_must_gain_move_min_gain(min_gain: float, moved: bool) -> None:
    # r runs alone on s1; s2 is 10% faster and idle. The program pays a 5-s checkpoint out of a 300-s
    # horizon (factor 0.983) for 1.1x: it moves r. The move frees nothing the plan uses and gains less
    # than 15%: kept, unless move_min_gain is 0.
    servers = [srv("s1", 1, 1.0), srv("s2", 1, 1.1, order=1)]
    r = JobView(spec("r", 1, restart_s=0.0), current=C(s1=1), running_s=5000.0, attempt_s=5000.0)
    settings_ = SchedulerSettings(solver="exact", gap=0.0, round_seconds=120.0, move_min_gain=min_gain)
    plan = plan_round(snapshot(servers, [r]), profiled(r), settings_)
    assert plan.assignments == {"r": C(s2=1) if moved else C(s1=1)}


def test_a_lateral_move_that_makes_room_for_a_waiting_job_is_kept() -> None:
    # r (1 GPU) sits on the 2-GPU server s1; w needs 2 GPUs and has waited long. Moving r to s2 (same
    # speed: no gain) lets w run: the pass keeps the move, r's GPU on s1 is used by the plan.
    servers = [srv("s1", 2, 1.0), srv("s2", 1, 1.0, order=1)]
    r = JobView(spec("r", 1, restart_s=0.0), current=C(s1=1), running_s=5000.0, attempt_s=5000.0)
    w = JobView(spec("w", 2, restart_s=0.0), waited_s=50_000.0)
    settings_ = SchedulerSettings(solver="exact", gap=0.0, round_seconds=120.0)
    plan = plan_round(snapshot(servers, [r, w]), profiled(r, w), settings_)
    assert plan.assignments == {"r": C(s2=1), "w": C(s1=2)}


def test_moves_that_free_nothing_are_kept_through_a_chain() -> None:
    # The program moves a (s1 -> s2, 10% faster) and b (s3 -> s1, 10% faster): a's move makes room for
    # b's. b's gains less than 15% and frees nothing: b stays on s3, and then a's move frees nothing
    # either, so a stays on s1 too (a single pass in queue order had left a moved and s1 half idle).
    servers = [srv("s1", 2, 1.1), srv("s2", 1, 1.1, order=1), srv("s3", 2, 1.0, order=2)]
    a = JobView(
        spec("a", 1, restart_s=0.0), current=C(s1=1), waited_s=3000.0, running_s=5000.0, attempt_s=5000.0
    )
    b = JobView(
        spec("b", 2, restart_s=0.0), current=C(s3=2), waited_s=100.0, running_s=5000.0, attempt_s=5000.0
    )
    free_moves = SchedulerSettings(solver="exact", gap=0.0, round_seconds=120.0, move_min_gain=0.0)
    assert plan_round(snapshot(servers, [a, b]), profiled(a, b), free_moves).assignments == {
        "a": C(s2=1),
        "b": C(s1=2),
    }
    settings_ = SchedulerSettings(solver="exact", gap=0.0, round_seconds=120.0)
    plan = plan_round(snapshot(servers, [a, b]), profiled(a, b), settings_)
    assert plan.assignments == {"a": C(s1=1), "b": C(s3=2)}


def _solver_returning(chosen: Mapping[str, Config]) -> Callable[..., Any]:
    """A stand-in for the solver's answer (what the pass after it is given), with the real stats."""
    from hopsmgr.core import planner

    real = planner._solve

    def solve(*args: Any) -> tuple[dict[str, Config], Any, Any]:
        _, stats, explain = real(*args)
        return dict(chosen), stats, explain

    return solve


@pytest.mark.parametrize(
    ("answer", "tenant", "kept"),
    [
        ({}, "default", True),  # r left out and s1 idle: preempted for nothing, so it keeps s1
        ({"w": C(s1=1)}, "default", False),  # its GPU goes to w: the preemption makes room
        ({}, "capped", False),  # a tenant with a cap: the cap's row may be why it was left out
    ],
)
def test_a_running_job_left_out_whose_gpus_nothing_uses_keeps_them(
    monkeypatch: pytest.MonkeyPatch, answer: dict[str, Config], tenant: str, kept: bool
) -> None:
    # The solver stops within its gap, and a long job's share of the objective is far below the gap:
    # whatever it answers, a running job it leaves out keeps its GPUs when the plan uses none of them.
    from hopsmgr.core import planner

    monkeypatch.setattr(planner, "_solve", _solver_returning(answer))
    servers = [srv("s1", 1, 1.0), srv("s2", 1, 1.0, order=1)]
    r = JobView(spec("r", 1, tenant=tenant), current=C(s1=1), running_s=5000.0, attempt_s=5000.0)
    w = JobView(spec("w", 1), waited_s=100.0)
    tenants = {"capped": TenantQuota("capped", cap_gpus=1)}
    settings_ = SchedulerSettings(solver="exact", gap=0.0, round_seconds=120.0)
    plan = plan_round(snapshot(servers, [r, w], tenants=tenants), profiled(r, w), settings_)
    assert plan.assignments.get("r") == (C(s1=1) if kept else None)
    assert {k: v for k, v in plan.assignments.items() if k != "r"} == answer
