"""The planner's view of the machine's state, and the measures decisions need (pure functions).

`build_snapshot` turns live jobs, open attempts and nodes into the `ClusterSnapshot` a policy plans
over: healthy, undrained nodes give all their usable GPUs; suspect, lost, drained nodes, and nodes a
command recently could not reach, give only what running jobs already hold (no new placements). GPUs
of profiling, stopping and waiting attempts are taken out of the capacity; jobs being profiled or
checkpointed are not planned this time. Placed jobs that may not be preempted (`JobSpec.preemptible`
False: commands without the runtime and without a checkpoint signal) are not planned at all: their
GPUs are out of the capacity and they keep their placement (`pinned_placements`).
"""

from __future__ import annotations

from collections.abc import Iterator

from hopsmgr.control import usage
from hopsmgr.control.records import ControlState, Job, NodeHealth
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import ClusterSnapshot, Config, JobId, JobView, ServerId

PLACED = (JobState.RUNNING, JobState.LAUNCHING)
Placements = dict[JobId, Config]


def fixed_gpus(state: ControlState, current: Placements | None = None) -> dict[ServerId, int]:
    """GPUs the planner cannot use: all claimed GPUs (ControlState.held) but those of current placements
    (profiling, stopping and waiting attempts, such as a move's new half)."""
    held = state.held()
    for config in (current_placements(state) if current is None else current).values():
        for sid, g in config.parts:
            held[sid] = held.get(sid, 0) - g
    return held


def usable_capacity(
    state: ControlState, now: float, backoff_s: float, current: Placements | None = None
) -> dict[ServerId, int]:
    held = state.held()
    fixed = fixed_gpus(state, current)
    capacity: dict[ServerId, int] = {}
    for node in state.nodes.values():
        recent_error = now - node.exec_error_at < backoff_s
        if node.health == NodeHealth.HEALTHY and not node.drained and not recent_error:
            usable = node.usable_gpus
        else:
            usable = held.get(node.server.id, 0)
        capacity[node.server.id] = max(0, usable - fixed.get(node.server.id, 0))
    return capacity


def current_placements(state: ControlState) -> Placements:
    """Jobs placed now (launching or running, not being stopped; or half-way through a move, their
    checkpoint written and the new attempt waiting for other stops) and their configurations. From
    the open attempts, not the jobs: at scale most jobs wait and have none."""
    current: Placements = {}
    jobs = state.jobs
    for attempt in state.attempts.values():
        job = jobs.get(attempt.job_id)
        if job is None:
            continue
        if job.attempt == attempt.id:
            if job.state in PLACED and not attempt.stopping:
                current[job.id] = attempt.placement
        elif job.attempt is None and job.moving_to == attempt.id:
            current[job.id] = attempt.placement
    return current


def pinned_placements(state: ControlState, current: Placements | None = None) -> Placements:
    """Placed jobs a plan may not stop, move or resize, and their configurations."""
    current = current_placements(state) if current is None else current
    return {j: c for j, c in current.items() if not state.jobs[j].spec.preemptible}


def waited_s(job: Job, state: ControlState, now: float) -> float:
    """Time the job has spent not running: since submission, less its attempts' run time (the current
    attempt's included), so a running job's wait does not grow."""
    running = job.running_s
    if job.attempt is not None:
        attempt = state.attempts.get(job.attempt)
        if attempt is not None and attempt.started is not None:
            running += max(0.0, now - attempt.started)
    return max(0.0, now - job.submitted - running)


def job_view(job: Job, state: ControlState, now: float) -> JobView:
    current: Config | None = None
    attempt_s = 0.0
    if job.attempt is not None:
        attempt = state.attempts[job.attempt]
        current = attempt.placement
        attempt_s = max(0.0, now - (attempt.started if attempt.started is not None else attempt.created))
    elif job.moving_to is not None and job.moving_to in state.attempts:
        # Half-way through a move (checkpoint written, the new attempt waits for other stops): the job
        # is placed where it moves to, and that placement is new. Shown as waiting, a fragment plan
        # would place it a second time (the old GPUs are free) and undo the move.
        current = state.attempts[job.moving_to].placement
    return JobView(
        spec=job.spec,
        done_samples=job.done_samples,
        waited_s=waited_s(job, state, now),
        attained_gpu_s=job.attained_gpu_s,
        running_s=job.running_s,
        current=current,
        attempt_s=attempt_s,
        restarts=job.restarts,
    )


def prebuild_waiting(state: ControlState, now: float, job_ids: list[str], into: dict[str, JobView]) -> None:
    """The views of those of `job_ids` that wait with no attempt (the bulk of a snapshot at scale), as
    of `now`, into `into`: a plan request builds them in slices between other events, and
    `build_snapshot` takes each one whose job has not changed since (`_still`)."""
    jobs, queued = state.jobs, JobState.QUEUED
    for job_id in job_ids:
        job = jobs.get(job_id)
        if job is None or job.profiling or job.state != queued:
            continue
        if job.attempt is not None or job.moving_to is not None or job.spec.after:
            continue  # built afresh at the end (--after: whether it still waits is asked then)
        into[job_id] = _waiting_view(job, now)


def _waiting_view(job: Job, now: float) -> JobView:
    return JobView(
        job.spec,
        job.done_samples,
        max(0.0, now - job.submitted - job.running_s),
        job.attained_gpu_s,
        job.running_s,
        None,
        0.0,
        job.restarts,
    )


def _still(view: JobView, job: Job) -> bool:
    """Whether `view`, built earlier for `job` while it waited with no attempt, still describes it
    (an attempt that began and ended in between changed its counters)."""
    return (
        view.spec is job.spec
        and view.done_samples == job.done_samples
        and view.running_s == job.running_s
        and view.attained_gpu_s == job.attained_gpu_s
        and view.restarts == job.restarts
    )


def build_snapshot(
    state: ControlState,
    now: float,
    backoff_s: float,
    half_life_h: float = 24.0,
    prebuilt: dict[str, JobView] | None = None,
    waits_at: float | None = None,
) -> ClusterSnapshot:
    """The planner's view of the cluster at `now`. `prebuilt`: waiting jobs' views built a little
    earlier in the same request (`prebuild_waiting`), each used while its job still waits unchanged,
    else the job's view is built here. `waits_at` (default `now`): the instant the waits of jobs with
    no attempt count to, the same for all of them (the master builds views in slices from then, a few
    milliseconds before `now`; a job submitted since has waited 0)."""
    views: list[JobView] = []
    current = current_placements(state)
    pinned = pinned_placements(state, current)
    capacity = usable_capacity(state, now, backoff_s, current)
    for config in pinned.values():
        for sid, g in config.parts:
            capacity[sid] = max(0, capacity.get(sid, 0) - g)
    planned = (JobState.QUEUED, *PLACED)
    ready = prebuilt or {}
    queued = JobState.QUEUED
    waits_to = now if waits_at is None else waits_at
    for job in state.jobs.values():
        if job.profiling or job.state not in planned:
            continue
        if job.attempt is None and job.moving_to is None:
            # the common case at scale, a job waiting with no attempt: its view without the lookups
            view = ready.get(job.id)
            if view is not None and job.state == queued and _still(view, job):
                views.append(view)
                continue
            if job.state == queued and job.spec.after and state.waits_for(job):  # --after
                continue
            views.append(_waiting_view(job, waits_to))
            continue
        if job.spec.id in pinned:
            continue
        if job.state == JobState.QUEUED and job.spec.after and state.waits_for(job):
            continue
        if job.attempt is not None and state.attempts[job.attempt].stopping:
            continue
        views.append(job_view(job, state, now))
    servers = tuple(n.server for n in state.nodes.values())
    return ClusterSnapshot(
        servers,
        capacity,
        tuple(views),
        now,
        dict(state.tenants),
        usage.current_usage(state, now, half_life_h),
    )


def idle_gpus(state: ControlState, now: float, backoff_s: float) -> int:
    """Usable GPUs no attempt holds (ControlState.held's claims, read per node: asked after every
    event that may free GPUs, so without building the whole map)."""
    return sum(free for _, free in _free_per_node(state, now, backoff_s))


def free_gpus_by_server(state: ControlState, now: float, backoff_s: float) -> dict[ServerId, int]:
    """The usable GPUs no attempt holds, per server that has any (what `idle_gpus` adds up)."""
    return dict(_free_per_node(state, now, backoff_s))


def _free_per_node(state: ControlState, now: float, backoff_s: float) -> Iterator[tuple[ServerId, int]]:
    claimed_now, claimed_after = state.claimed_now, state.claimed_after
    for node in state.nodes.values():
        if node.health != NodeHealth.HEALTHY or node.drained or now - node.exec_error_at < backoff_s:
            continue
        sid = node.server.id
        held = claimed_now.get(sid, 0)
        after = claimed_after.get(sid, 0)
        free = node.usable_gpus - (after if after > held else held)
        if free > 0:
            yield sid, free


def profiling_budget(state: ControlState, share: float) -> int:
    """[ours] GPUs profiling runs may take now: `share` of the cluster (and at least one job's runs,
    one per GPU type), so a burst of new jobs cannot keep queued work off the GPUs."""
    running = state.profiling_gpus
    types = len(state.gpu_types)
    return max(0, max(types, int(state.total_gpus * share)) - running)
