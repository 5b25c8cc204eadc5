"""bench/sim_paper.py's `parts` scenario: each row changes one real [scheduler] setting away from its
default (a misspelt field or a no-op row would make the ablation table lie), and `hops` is the default."""

from __future__ import annotations

from dataclasses import replace

from hopsmgr.core.settings import SchedulerSettings
from tests.helpers.bench import load_bench


def test_each_part_changes_one_setting_from_its_default() -> None:
    parts = load_bench("sim_paper").PARTS
    default = SchedulerSettings()
    assert parts["hops"] == {}
    for label, overrides in parts.items():
        if label == "hops":
            continue
        assert len(overrides) == 1, label
        ((name, value),) = overrides.items()
        changed = replace(default, **overrides)  # a field SchedulerSettings does not have raises here
        assert getattr(changed, name) == value != getattr(default, name), label
