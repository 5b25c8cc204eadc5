"""Plan vs current placements -> ordered actions.

Level-triggered: given what runs now and what the plan wants, list the checkpoint-and-stop actions for
jobs that must leave (or move) first, then the launches. A launch names the stops whose GPUs it needs;
the executor may run launches in parallel with each other but never before those stops have finished,
so no GPU is ever given twice. `replay` checks an action sequence against server capacity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hopsmgr.core.model import Config, JobId, ServerId


class ReconcileError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CheckpointStop:
    job_id: JobId
    config: Config
    reason: str  # "preempted" | "migrated"


@dataclass(frozen=True, slots=True)
class Launch:
    job_id: JobId
    config: Config
    resume: bool
    after: tuple[JobId, ...] = ()  # stops that must finish first (they free GPUs this launch uses)


Action = CheckpointStop | Launch


def _usage(placements: Mapping[JobId, Config]) -> dict[ServerId, int]:
    used: dict[ServerId, int] = {}
    for config in placements.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    return used


def reconcile(
    current: Mapping[JobId, Config],
    desired: Mapping[JobId, Config],
    capacity: Mapping[ServerId, int],
    resumable: frozenset[JobId] = frozenset(),
) -> list[Action]:
    """Ordered actions that take `current` to `desired` without over-allocating any server.

    `resumable` lists jobs with a checkpoint to resume from (their launch says resume=True); a job that
    moves is always resumable, since it is checkpointed first.
    """
    stops: list[CheckpointStop] = []
    for job_id in sorted(current):
        want = desired.get(job_id)
        if want is None:
            stops.append(CheckpointStop(job_id, current[job_id], "preempted"))
        elif want != current[job_id]:
            stops.append(CheckpointStop(job_id, current[job_id], "migrated"))
    stopping = {s.job_id for s in stops}
    # One pass over the placements (a plan at 10,000 jobs keeps most of them): what the kept jobs use
    # is what all current ones use less the stopping ones', and the plan uses that plus its launches'.
    current_usage = _usage(current)
    kept_usage = dict(current_usage)
    for stop in stops:
        for sid, g in stop.config.parts:
            kept_usage[sid] -= g
    desired_usage = dict(kept_usage)
    for job_id, want in desired.items():
        if job_id not in current or job_id in stopping:
            for sid, g in want.parts:
                desired_usage[sid] = desired_usage.get(sid, 0) + g
    for sid, used in desired_usage.items():
        if used > capacity.get(sid, 0):
            raise ReconcileError(f"plan gives server {sid!r} {used} GPUs, it has {capacity.get(sid, 0)}")
    free = {sid: capacity.get(sid, 0) - kept_usage.get(sid, 0) for sid in capacity}
    # GPUs that are free right now (not held by any current placement) need no stop to finish.
    now_free = {sid: capacity.get(sid, 0) - current_usage.get(sid, 0) for sid in capacity}
    holders: dict[ServerId, list[JobId]] = {}
    for stop in stops:
        for sid, _ in stop.config.parts:
            holders.setdefault(sid, []).append(stop.job_id)
    launches: list[Launch] = []
    for job_id in sorted(desired):
        want = desired[job_id]
        if job_id in current and job_id not in stopping:  # kept where it is
            continue
        after: set[JobId] = set()
        for sid, g in want.parts:
            if free.get(sid, 0) < g:
                raise ReconcileError(
                    f"launch of {job_id!r} on {sid!r} needs {g} GPUs, {free.get(sid, 0)} left"
                )
            free[sid] -= g
            if now_free.get(sid, 0) >= g:
                now_free[sid] -= g
            else:
                now_free[sid] = 0
                after.update(holders.get(sid, ()))
        if job_id in stopping:
            after.add(job_id)  # it resumes from the checkpoint its own stop writes
        launches.append(Launch(job_id, want, job_id in resumable or job_id in stopping, tuple(sorted(after))))
    return [*stops, *launches]


def replay(
    current: Mapping[JobId, Config], actions: Sequence[Action], capacity: Mapping[ServerId, int]
) -> dict[JobId, Config]:
    """Apply actions in order, checking at every step that no server is over-allocated and every
    launch's `after` stops already happened. Returns the final placements."""
    state = dict(current)
    done: set[JobId] = set()
    for action in actions:
        if isinstance(action, CheckpointStop):
            if state.get(action.job_id) != action.config:
                raise ReconcileError(f"stop of {action.job_id!r}: it does not hold {action.config}")
            del state[action.job_id]
            done.add(action.job_id)
        else:
            missing = [j for j in action.after if j not in done]
            if missing:
                raise ReconcileError(f"launch of {action.job_id!r} before stops {missing}")
            if action.job_id in state:
                raise ReconcileError(f"launch of {action.job_id!r}: it already runs")
            state[action.job_id] = action.config
        for sid, used in _usage(state).items():
            if used > capacity.get(sid, 0):
                raise ReconcileError(f"server {sid!r} over-allocated ({used} > {capacity.get(sid, 0)})")
    return state
