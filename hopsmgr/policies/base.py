"""The policy interface shared by Hops and the baselines, and the Hops policy itself.

A policy turns a `ClusterSnapshot` (servers, usable GPUs, live jobs with their current placements)
into a `Plan`: the placement every job should have. The simulator and the master call `plan` at the
start of each round (kind "first") and, for policies with `fragment_plans`, again within the round when
GPUs go idle (kind "fragment"). Policies may keep state between calls (Gavel tracks the time shares it
gave), but read no clock: time arrives as `snapshot.now`, and `timer` only measures solver time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import ClusterSnapshot, JobId
from hopsmgr.core.plan import Reservation
from hopsmgr.core.planner import Plan, PlanKind, plan_fragments, plan_round
from hopsmgr.core.reserve import reserved_servers
from hopsmgr.core.settings import SchedulerSettings

Timer = Callable[[], float]


class Policy(Protocol):
    name: str
    description: str
    round_seconds: float
    fragment_plans: bool

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan: ...


class HopsPolicy:
    """The Hops planner (hopsmgr.core.planner) with the priority its settings name."""

    # [ours] A queued job missing a GPU type's profile is planned before it is profiled there
    # (hopsmgr.control.planning.compute_plan). The baselines keep profiling first, as Sia profiles a
    # job on every GPU type before it schedules it.
    plans_before_profiling = True

    def __init__(self, settings: SchedulerSettings, name: str = "hops") -> None:
        self.settings = settings
        self.name = name
        self.round_seconds = settings.round_seconds
        self.fragment_plans = settings.fragment_plans
        self.description = f"Hops planner, {settings.priority} priority, lambda={settings.lambda_}"
        if settings.lambda_knee > 0:
            self.description += f" (below lambda_knee={settings.lambda_knee}: {settings.lambda_below})"
        if settings.priority == "latency_ratio" and settings.lr_hysteresis > 0:
            self.description += f", lr_hysteresis={settings.lr_hysteresis}"
        if settings.priority in ("latency_ratio", "srtf_lr") and settings.critical_path:
            self.description += ", critical_path"
        # The last plan's reservations (hopsmgr.core.reserve): a reserved job keeps its servers.
        self.reservations: dict[JobId, Reservation] = {}

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        if kind == "first":
            plan = plan_round(snapshot, estimator, self.settings, timer, self.reservations)
        else:
            plan = plan_fragments(snapshot, estimator, self.settings, timer, self.reservations)
        self.reservations = {r.job_id: r for r in plan.reservations}
        return plan

    @property
    def reserved_servers(self) -> frozenset[str]:
        """Servers the last plan reserved (hopsmgr.control.planning keeps profiling runs off them)."""
        return reserved_servers(tuple(self.reservations.values()))


HOPS_VARIANTS = {
    "hops": "latency_ratio",
    "hops-las": "las",
    "hops-sjf": "sjf",
    "hops-srtf": "srtf",
    "hops-srtf-lr": "srtf_lr",
    "hops-ftf": "ftf",
    "hops-fifo": "fifo",
}


def hops_policy(name: str, settings: SchedulerSettings) -> HopsPolicy:
    priority = HOPS_VARIANTS[name]
    changes: dict[str, object] = {"priority": priority}
    if priority == "ftf":
        changes["lambda_"] = 2.0  # the paper's setting with FTF as the priority
    return HopsPolicy(dataclasses.replace(settings, **changes), name)  # type: ignore[arg-type]
