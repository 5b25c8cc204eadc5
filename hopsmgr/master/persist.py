"""The state machine's records as store operations for the writer (hopsmgr.master.writer).

`record_ops` runs on the event loop and does only what needs the live state there: a new job's row
(from the machine's job and the submission's payload), a job's state for a history note, and the
controller's own bookkeeping (which attempts have a row, the highest attempt number, progress already
written). Everything else, the column values, their JSON and each change's log line, is left to the
operation, which runs where the writer runs it (its own thread in the master), after the record is
in the store's transaction. Records are immutable values, so handing them over is safe. The controller
(hopsmgr.master.controller) is seen as a `RecordKeeper`: the part of it that `record_ops` uses.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol

import structlog

from hopsmgr.control.commands import (
    AttemptRow,
    JobChange,
    JobNote,
    ProfilingWaits,
    ThroughputSample,
    UsageRecord,
)
from hopsmgr.control.machine import SchedulerMachine
from hopsmgr.core.lifecycle import TERMINAL, JobState
from hopsmgr.master.state import JobPayload, attempt_seq, job_row, store_counters
from hopsmgr.master.store import Store
from hopsmgr.master.writer import Op

log = structlog.get_logger("hopsmgr.master")
USAGE_SAMPLE_S = 600.0  # fair share: the decayed use is sampled at most this often for `quota --history`


class RecordKeeper(Protocol):
    """What `record_ops` uses of the controller: its machine, its bookkeeping of what is stored, and the
    buffers it writes later."""

    attempt_high: int  # the highest attempt number with a row
    attempt_meta: int  # the highest attempt number stored in meta `attempt`

    @property
    def machine(self) -> SchedulerMachine: ...

    @property
    def epoch(self) -> int: ...

    @property
    def payloads(self) -> dict[str, JobPayload]: ...

    @property
    def written(self) -> dict[str, float]: ...

    @property
    def stored_attempts(self) -> set[str]: ...

    @property
    def throughput(self) -> list[ThroughputSample]: ...

    @property
    def usage_history(self) -> deque[tuple[float, dict[str, float]]]: ...


def record_ops(ctl: RecordKeeper, records: Sequence[object], stimulus: str, ops: list[Op]) -> None:
    """Add to `ops` the store operations for the machine's `records` (see the module)."""
    for record in records:
        if isinstance(record, JobChange):
            if record.old is None:
                _new_job(ctl, record, stimulus, ops)
            else:
                if record.new in TERMINAL:
                    ctl.payloads.pop(record.job_id, None)
                    ctl.written.pop(record.job_id, None)
                else:
                    ctl.written[record.job_id] = record.counters["done_samples"]
                ops.append(partial(_store_change, change=record, stimulus=stimulus))
        elif isinstance(record, JobNote):
            job = ctl.machine.state.jobs.get(record.job_id)
            state = job.state.value if job else None
            ops.append(partial(_store_note, note=record, state=state))
        elif isinstance(record, AttemptRow):
            insert = record.id not in ctl.stored_attempts
            if insert:
                ctl.stored_attempts.add(record.id)
                ctl.attempt_high = max(ctl.attempt_high, attempt_seq(record.id))
            if record.ended is not None:
                ctl.stored_attempts.discard(record.id)
            ops.append(partial(_store_attempt, row=record, insert=insert, epoch=ctl.epoch, stimulus=stimulus))
        elif isinstance(record, ThroughputSample):
            ctl.throughput.append(record)
        elif isinstance(record, UsageRecord):
            _usage(ctl, record, ops)
        elif isinstance(record, ProfilingWaits):  # so a restarted master's forecasts hold new jobs too
            ops.append(partial(_store_meta_json, key="profiling_waits", value=list(record.waits)))
    if ctl.attempt_high > ctl.attempt_meta:  # the highest attempt number stored (read at open)
        ops.append(partial(Store.set_meta, key="attempt", value=str(ctl.attempt_high)))
        ctl.attempt_meta = ctl.attempt_high


def _new_job(ctl: RecordKeeper, c: JobChange, stimulus: str, ops: list[Op]) -> None:
    job = ctl.machine.state.jobs.get(c.job_id)
    payload = ctl.payloads[c.job_id]
    row = None
    if job is not None:
        row = job_row(job, payload)
        row.update(state=c.new.value, state_since=c.at)
    tenant, user = (job.spec.tenant, job.spec.user) if job else ("", "")
    ops.append(partial(_store_new_job, change=c, row=row, tenant=tenant, user=user, stimulus=stimulus))


def _usage(ctl: RecordKeeper, record: UsageRecord, ops: list[Op]) -> None:
    ops.append(partial(_store_meta_json, key="tenant_usage", value=[list(u) for u in record.usage]))
    at = max((a for _, _, a in record.usage), default=0.0)
    if ctl.usage_history and at - ctl.usage_history[-1][0] < USAGE_SAMPLE_S:
        return
    ctl.usage_history.append((at, {t: used for t, used, _ in record.usage}))
    ops.append(partial(_store_meta_json, key="tenant_usage_history", value=list(ctl.usage_history)))


# -- run by the writer --------------------------------------------------------------------------------------


def _store_new_job(
    store: Store, change: JobChange, row: dict[str, Any] | None, tenant: str, user: str, stimulus: str
) -> None:
    if row is not None:
        store.insert_job(row)
    store.add_event(change.job_id, change.at, "submitted", change.new.value, change.message)
    log.info("job_submitted", job_id=change.job_id, tenant=tenant, user=user, stimulus=stimulus)


def _store_change(store: Store, change: JobChange, stimulus: str) -> None:
    values: dict[str, Any] = {
        "state": change.new.value,
        "state_since": change.at,
        **store_counters(change.counters),
        "has_checkpoint": int(change.has_checkpoint),
    }
    if change.new in TERMINAL:
        values["ended"] = change.at
    if change.new == JobState.FAILED:
        values["reason"] = change.message
    store.update_job(change.job_id, **values)
    store.add_event(change.job_id, change.at, change.kind, change.new.value, change.message)
    log.info(
        "job_state",
        job_id=change.job_id,
        state=change.new.value,
        kind=change.kind,
        message=change.message,
        stimulus=stimulus,
    )


def _store_note(store: Store, note: JobNote, state: str | None) -> None:
    store.add_event(note.job_id, note.at, note.kind, state, note.message)


def _store_attempt(store: Store, row: AttemptRow, insert: bool, epoch: int, stimulus: str) -> None:
    devices = {sid: list(d) for sid, d in row.devices.items()}
    if insert:
        store.insert_attempt(
            {
                "id": row.id,
                "seq": attempt_seq(row.id),
                "job_id": row.job_id,
                "placement": row.placement.as_dict(),
                "profiling": int(row.profiling),
                "epoch": epoch,
                "created": row.created,
                "started": row.started,
                "stopping": int(row.stopping),
                "resume": int(row.resume),
                "devices": devices,
            }
        )
        if row.ended is None:
            return  # the row just inserted holds all an open attempt's values
    values: dict[str, Any] = {"started": row.started, "stopping": int(row.stopping), "devices": devices}
    if row.ended is not None:
        values.update(
            ended=row.ended, end_reason=row.end_reason, exit_code=row.exit_code, log_tail=row.log_tail
        )
    store.update_attempt(row.id, **values)
    if row.ended is not None:
        log.info(
            "attempt_ended",
            attempt_id=row.id,
            job_id=row.job_id,
            reason=row.end_reason,
            code=row.exit_code,
            stimulus=stimulus,
        )


def _store_meta_json(store: Store, key: str, value: Any) -> None:
    store.set_meta(key, json.dumps(value))


def store_job_counters(store: Store, job_id: str, values: dict[str, Any]) -> None:
    store.update_job(job_id, **values)
