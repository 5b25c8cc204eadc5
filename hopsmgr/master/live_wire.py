"""The live state as the forecast worker is sent it: only what changed since the worker's last forecast.

Pickling `LiveState` as it is took 0.2-0.3 s of the event loop at 10,000 jobs, most of it a Python call
per record and per spec, and most jobs (those waiting) had not changed since the last forecast. Both
sides keep each job as it was last sent, as (spec, the tuple of its other fields); `encode` sends the
jobs' order (their ids), the jobs whose tuple or spec changed (a spec the worker holds goes as the
job's id), and every open attempt as the list of its fields; `decode`, in the worker, applies that to
what it holds and builds the records again. Before a worker's first forecast (or after it lost what it
held) the jobs it lacks are sent ahead in slices (`encode_jobs`, `hold`), between which the event loop
serves others; the forecast's own message then carries only what changed meanwhile. The tuples hold copies of the jobs' mutable fields, so
what the master keeps is not changed by the machine afterwards.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import fields, replace
from typing import Any

from hopsmgr.control.records import Attempt, Job
from hopsmgr.core.model import JobSpec
from hopsmgr.forecast.live import LiveState

JobRow = tuple[JobSpec, tuple[Any, ...]]
Held = dict[str, JobRow]  # job id -> the job as the worker holds it
Changed = list[tuple[Any, tuple[Any, ...]]]  # (spec, or the job's id when the worker holds its spec; fields)
Message = tuple[LiveState, list[str], Changed, list[Any]]
_JOB_FIELDS = tuple(f.name for f in fields(Job))
assert _JOB_FIELDS[0] == "spec"
_JOB_VALUES = operator.attrgetter(*_JOB_FIELDS[1:])
_PROFILING = _JOB_FIELDS.index("profiling") - 1  # its place in the tuple (a set: sent as a frozenset)


def _values(job: Job) -> tuple[Any, ...]:
    values: tuple[Any, ...] = _JOB_VALUES(job)
    return (*values[:_PROFILING], frozenset(job.profiling), *values[_PROFILING + 1 :])


def encode_jobs(jobs: Iterable[Job], held: Held) -> tuple[Changed, Held]:
    """The jobs of `jobs` that differ from what the worker holds (new, or changed since), and every
    job of `jobs` as the worker will hold it."""
    rows: Held = {}
    changed: Changed = []
    for job in jobs:
        job_id = job.spec.id
        before = held.get(job_id)
        # a set equals the frozenset of the same items: unchanged jobs are compared without a copy
        if before is not None and before[0] is job.spec and before[1] == _JOB_VALUES(job):
            rows[job_id] = before
            continue
        values = _values(job)
        changed.append((job_id if before is not None and before[0] is job.spec else job.spec, values))
        rows[job_id] = (job.spec, values)
    return changed, rows


def hold(changed: Changed, held: Held) -> Held:
    """In the worker: what it holds once `changed` is applied (ValueError for a job it does not hold)."""
    rows = dict(held)
    for spec, values in changed:
        if isinstance(spec, str):
            if spec not in rows:
                raise ValueError(f"the forecast worker holds no job {spec!r}")
            spec = rows[spec][0]
        rows[spec.id] = (spec, values)
    return rows


def encode(live: LiveState, held: Held) -> tuple[Message, Held]:
    """The message for a worker that holds `held`, and what it holds once it has read it."""
    changed, rows = encode_jobs(live.jobs, held)
    attempts = [a.__getstate__() for a in live.attempts]
    return (replace(live, jobs=(), attempts=()), list(rows), changed, attempts), rows


def decode(message: Message, held: Held) -> tuple[LiveState, Held]:
    """The live state `encode` made, and what the worker holds from now on; ValueError when the
    message names a job the worker does not hold."""
    shell, order, changed, attempt_rows = message
    rows = hold(changed, held)
    try:
        kept: Held = {job_id: rows[job_id] for job_id in order}
    except KeyError as exc:
        raise ValueError(f"the forecast worker holds no job {exc.args[0]!r}") from None
    jobs = []
    for spec, values in kept.values():
        job = Job(spec, *values)
        job.profiling = set(job.profiling)
        jobs.append(job)
    attempts = []
    for state in attempt_rows:
        attempt = Attempt.__new__(Attempt)
        attempt.__setstate__(state)
        attempts.append(attempt)
    return replace(shell, jobs=tuple(jobs), attempts=tuple(attempts)), kept
