"""The live state as the forecast worker is sent it: compact, and without the specs it already holds.

Pickling `LiveState` as it is took 0.2-0.3 s of the event loop at 10,000 jobs, most of it a Python call
per record and per spec. `encode` turns each job into its spec (or only its id, when the worker holds
that very spec from the last forecast) and a tuple of its other fields, each attempt into a list of its
fields, so that pickling is C work; `decode`, in the worker, builds the records again. Like the pickle
it replaces, the encoding holds the machine's live objects (sets, dicts): the caller pickles it at
once, before the loop runs anything else.
"""

from __future__ import annotations

import operator
from dataclasses import fields, replace
from typing import Any

from hopsmgr.control.records import Attempt, Job
from hopsmgr.core.model import JobSpec
from hopsmgr.forecast.future import LiveState

Specs = dict[str, JobSpec]  # job id -> the spec the worker holds
_JOB_FIELDS = tuple(f.name for f in fields(Job))
assert _JOB_FIELDS[0] == "spec"
_JOB_VALUES = operator.attrgetter(*_JOB_FIELDS[1:])


def specs_of(live: LiveState) -> Specs:
    """The specs both sides keep after a forecast of `live`."""
    return {job.spec.id: job.spec for job in live.jobs}


def encode(live: LiveState, known: Specs) -> tuple[LiveState, list[Any], list[Any]]:
    jobs = [
        (job.spec.id if known.get(job.spec.id) is job.spec else job.spec, _JOB_VALUES(job))
        for job in live.jobs
    ]
    attempts = [a.__getstate__() for a in live.attempts]
    return replace(live, jobs=(), attempts=()), jobs, attempts


def decode(message: tuple[LiveState, list[Any], list[Any]], known: Specs) -> LiveState:
    """The live state `encode` made; ValueError when it names a spec the worker does not hold."""
    shell, job_rows, attempt_rows = message
    jobs = []
    for spec, values in job_rows:
        if isinstance(spec, str):
            try:
                spec = known[spec]
            except KeyError:
                raise ValueError(f"the forecast worker holds no spec of job {spec!r}") from None
        jobs.append(Job(spec, *values))
    attempts = []
    for state in attempt_rows:
        attempt = Attempt.__new__(Attempt)
        attempt.__setstate__(state)
        attempts.append(attempt)
    return replace(shell, jobs=tuple(jobs), attempts=tuple(attempts))
