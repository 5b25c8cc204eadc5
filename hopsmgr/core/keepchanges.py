"""[ours] Moves and preemptions that pay: after the program, running jobs whose change frees no room
keep their GPUs (hopsmgr.core.planner calls it on first plans)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hopsmgr.core import typecaps
from hopsmgr.core.model import Config, JobId, JobView, ServerId
from hopsmgr.core.program import RoundState, job_value


def keep_changes_that_free_nothing(
    state: RoundState,
    jobs: Sequence[JobView],
    free: Mapping[ServerId, int],
    running: Mapping[JobId, Config],
    assignment: dict[JobId, Config],
) -> None:
    """[ours] Moves and preemptions that pay: a running job the solver moved or left out, whose current
    GPUs nothing else in the plan uses (the change frees no room), keeps them. A job left out always
    does (the solver stops within its gap, and a long job's weight is far less than the gap: it was
    preempted for nothing); a moved one when the move is worth less than keeping (the program's own
    values) or when it keeps its GPU count and gains less than `move_min_gain` in estimated throughput
    (less than the estimator's error on servers the job has not run on, and each move is paid again
    when the next plan moves it on). A job of a tenant with a cap is not kept on more GPUs than the
    plan gave it (the cap's row counted those), nor back on GPUs of a type that a limit per GPU type
    (hopsmgr.core.typecaps) has no room left for. Jobs in queue order; a kept job's new GPUs go back
    to the pool, and the pass repeats until it keeps no more (a change skipped because a later-undone
    move used its GPUs frees nothing either); each job is kept at most once, so it ends."""
    used: dict[ServerId, int] = {}
    for config in assignment.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    capped = {name for name, q in state.snapshot.tenants.items() if q.cap_gpus is not None}
    tenant_of = {v.id: v.spec.tenant for v in jobs}
    type_left = typecaps.type_room(
        state.type_limits,
        typecaps.merged(
            state.tenant_type_held,
            typecaps.held_by_type(
                ((tenant_of[j], c) for j, c in assignment.items() if j in tenant_of), state.servers
            ),
        ),
    )

    kept = True
    while kept:
        kept = False
        for view in jobs:
            current = running.get(view.id)
            new = assignment.get(view.id)
            if current is None or new == current:
                continue
            if view.spec.tenant in capped and current.gpus > (new.gpus if new is not None else 0):
                continue  # (a tenant cap row counted the new GPU count)
            back = typecaps.change_back(current, new, state.servers)
            grown = {t: n for t, n in back.items() if n > 0}
            if grown and not typecaps.fits(view.spec.tenant, grown, type_left):
                continue  # (the limits per GPU type counted the new placement: the old one would break one)
            returned = new.parts if new is not None else ()
            room = {sid: free.get(sid, 0) - used.get(sid, 0) for sid, _ in current.parts}
            for sid, g in returned:
                if sid in room:
                    room[sid] += g
            if any(room[sid] < g for sid, g in current.parts):
                continue  # its GPUs are used by the plan: the change makes room
            keep_rate = state.estimator.config_rate(view.spec, current, state.servers) or 0.0
            if keep_rate <= 0:
                continue
            if new is not None:
                move_rate = state.estimator.config_rate(view.spec, new, state.servers) or 0.0
                gain = state.settings.move_min_gain
                small = new.gpus == current.gpus and move_rate < keep_rate * (1.0 + gain)
                worth_less = job_value(state, view, move_rate, True) <= job_value(
                    state, view, keep_rate, False
                )
                if not (small or worth_less):
                    continue
            for sid, g in returned:
                used[sid] -= g
            for sid, g in current.parts:
                used[sid] = used.get(sid, 0) + g
            assignment[view.id] = current
            typecaps.take(view.spec.tenant, back, type_left)
            kept = True
