"""Policies by name: Hops with each queue priority, and the baselines (Gavel, Sia, FIFO).

The "-lr" baselines use the latency-ratio queue order, as in the Hops paper's comparison. Hops variants
take their knobs from the scheduler settings; the baselines keep their own published round lengths.
"""

from __future__ import annotations

from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.base import HOPS_VARIANTS, Policy, hops_policy
from hopsmgr.policies.fifo import FifoPolicy
from hopsmgr.policies.gavel import GavelPolicy
from hopsmgr.policies.sia import SiaPolicy

POLICY_NAMES: tuple[str, ...] = (
    "hops",
    "hops-las",
    "hops-sjf",
    "hops-srtf",
    "hops-srtf-lr",
    "hops-ftf",
    "hops-fifo",
    "gavel",
    "gavel-lr",
    "sia",
    "sia-lr",
    "fifo",
)


def make_policy(name: str, settings: SchedulerSettings) -> Policy:
    """A fresh policy (with fresh state) for `name`; ValueError naming it and the valid names otherwise."""
    if name in HOPS_VARIANTS:
        return hops_policy(name, settings)
    if name == "gavel":
        return GavelPolicy(queue_order="published", name=name)
    if name == "gavel-lr":
        return GavelPolicy(queue_order="latency_ratio", name=name)
    if name == "sia":
        return SiaPolicy(queue_order="published", time_limit_s=settings.time_limit_s, name=name)
    if name == "sia-lr":
        return SiaPolicy(queue_order="latency_ratio", time_limit_s=settings.time_limit_s, name=name)
    if name == "fifo":
        return FifoPolicy()
    raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
