"""The machine charges tenants for the GPUs their jobs hold (fair share) and persists the decayed use."""

from __future__ import annotations

import pytest

from hopsmgr.control.commands import UsageRecord
from hopsmgr.control.events import AttemptEnded, AttemptStarted, RoundTick, StateRestored
from hopsmgr.control.settings import ControlSettings
from hopsmgr.control.usage import current_usage
from hopsmgr.core.model import TenantQuota
from hopsmgr.core.settings import SchedulerSettings
from tests.control.harness import Harness
from tests.control.test_machine import profiled

HOUR = 3600.0


def test_use_is_charged_per_gpu_second_decays_and_is_persisted() -> None:
    settings = ControlSettings(scheduler=SchedulerSettings(fairshare_half_life_h=1.0))
    h = Harness(settings=settings)
    (launch,) = profiled(h, "ja", (4,), samples=1e12)
    assert launch.placement.servers[0].startswith("v100")  # the reference type (8 of the 10 GPUs)
    h.feed(AttemptStarted(h.stimulus(), launch.attempt_id))
    started = h.now
    h.now = started + HOUR
    out = h.feed(RoundTick(h.stimulus(), "first"))
    usage = current_usage(h.machine.state, h.now, 1.0)
    assert usage["default"] == pytest.approx(4 * HOUR, rel=1e-6)
    (record,) = [r for r in h.records(out) if isinstance(r, UsageRecord)]
    assert record.usage == (("default", pytest.approx(4 * HOUR), h.now),)
    # An hour later with the job stopped: half of it is left, and nothing more was charged.
    h.now += 0.5 * HOUR
    h.feed(AttemptEnded(h.stimulus(), launch.attempt_id, "exited", 0))
    after_end = current_usage(h.machine.state, h.now, 1.0)["default"]
    assert after_end == pytest.approx(4 * HOUR * 0.5**0.5 + 4 * 0.5 * HOUR, rel=1e-6)
    h.now += HOUR
    assert current_usage(h.machine.state, h.now, 1.0)["default"] == pytest.approx(after_end / 2, rel=1e-6)
    h.close()


def test_restored_use_is_kept() -> None:
    h = Harness(tenants=(TenantQuota("a"),))
    h.feed(StateRestored("restore", usage=(("a", 7200.0, 0.0),)))
    assert current_usage(h.machine.state, 0.0, 24.0) == {"a": 7200.0}
    h.close()
