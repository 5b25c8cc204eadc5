"""The class model's refinement scope at scale: support classes and support GPU counts only.

Above `REFINE_BUDGET` estimated options the location-specific refinement offers each job only the
servers of the classes and the GPU counts its class-LP support uses; forced here on small instances.
"""

from __future__ import annotations

import pytest

from hopsmgr.core import classes as class_model
from hopsmgr.core import configs
from hopsmgr.core import program as program_module
from hopsmgr.core.planner import plan_round
from hopsmgr.core.scenario import busy_instance
from hopsmgr.core.settings import SchedulerSettings
from tests.unit.test_configs import FULL, SERVERS, estimator_for, job


def test_generate_keeps_only_the_given_counts() -> None:
    spec = job((1, 2, 4))
    by_type = configs.group_by_type(SERVERS.values(), FULL)
    everything = configs.generate(spec, by_type, FULL, SERVERS, estimator_for(spec), True)
    only = configs.generate(spec, by_type, FULL, SERVERS, estimator_for(spec), True, counts={2})
    assert {c.config.gpus for c in everything} == {1, 2, 4}
    assert only and {c.config.gpus for c in only} == {2}
    assert {c.config for c in only} == {c.config for c in everything if c.config.gpus == 2}
    assert configs.generate(spec, by_type, FULL, SERVERS, estimator_for(spec), True, counts=()) == []


def test_class_tier_offers_the_support_counts_and_stays_feasible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(class_model, "SMALL_PROGRAM", 0)
    monkeypatch.setattr(class_model, "REFINE_BUDGET", 0)
    seen: list[object] = []
    real = program_module.build_exact_program

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(args[6] if len(args) > 6 else kwargs.get("counts"))
        return real(*args, **kwargs)

    monkeypatch.setattr(class_model, "build_exact_program", spy)
    inst = busy_instance(2, 96, 144)
    plan = plan_round(inst.snapshot, inst.estimator, SchedulerSettings(solver="classes"))
    assert len(seen) == 1 and isinstance(seen[0], dict) and seen[0]
    counts = seen[0]
    specs = {v.id: v.spec for v in inst.snapshot.jobs}
    for jid, allowed in counts.items():
        assert allowed <= set(specs[jid].requirements.counts)
    capacity = inst.snapshot.capacity
    used: dict[str, int] = {}
    for config in plan.assignments.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    assert all(n <= capacity[sid] for sid, n in used.items())
    assert plan.stats.objective > 0
    assert not plan.stats.proven


def test_small_refinement_skips_the_class_lp(monkeypatch: pytest.MonkeyPatch) -> None:
    # Below SMALL_PROGRAM the refinement covers every server: no class program is built or solved.
    built: list[int] = []
    real = class_model._class_program

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(class_model, "_class_program", spy)
    inst = busy_instance(3, 64, 60)
    plan = plan_round(inst.snapshot, inst.estimator, SchedulerSettings(solver="classes"))
    assert built == []
    assert plan.stats.model == "classes" and not plan.stats.proven
    assert plan.stats.fallback is None
    assert plan.stats.bound is not None and plan.stats.bound >= plan.stats.objective * (1 - 1e-6)
    monkeypatch.setattr(class_model, "SMALL_PROGRAM", 0)
    again = plan_round(inst.snapshot, inst.estimator, SchedulerSettings(solver="classes"))
    assert built == [1]
    assert again.stats.model == "classes"
