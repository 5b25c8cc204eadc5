"""The planner in a process of its own: plan requests answered off the master's interpreter.

A long-lived worker process (started with `spawn`, so it shares nothing with the event loop) keeps
the policy and answers each `PlanRequest` with `hopsmgr.control.planning.compute_plan`, on the
request's immutable snapshot and the estimator's state as the master exported it for that request
(an immutable copy: the master keeps learning while the worker plans). The master waits for the
answer without blocking its event loop (the pipe is watched by the loop), up to a hard deadline from
the round's start; a worker that misses it is killed and replaced, and the round gets the state
machine's `fallback_plan` (hopsmgr.control.planning), which the round record reports as the fallback
it is.

A request is pickled with its job specs and servers *interned*: both sides keep the specs and servers
of the last request, and one that is the very object sent last time travels as its id, not again; job
views travel as plain tuples (`dumps_request` / `loads_request`). Pickling holds the interpreter lock
the event loop needs: at 10,000 waiting jobs this takes it from ~70 ms to ~15 ms a request.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import time
from dataclasses import fields, replace
from typing import Any

import structlog

from hopsmgr.control.commands import PlanRequest
from hopsmgr.control.events import PlanReady
from hopsmgr.control.planning import compute_plan, fallback_plan
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import JobView
from hopsmgr.core.settings import SchedulerSettings

log = structlog.get_logger("hopsmgr.master")
# The worker runs at a lower CPU priority than the master: where cores are few, heartbeats and API
# replies come first and a plan takes longer (its deadline still holds), not the other way round.
PLANNER_NICE = 5
# A LoggedEstimator update: its method, args and kwargs, pickled when made. Bytes are no work for the
# garbage collector: kept as tuples, a round's updates were thousands of containers each collection
# walked (docs/benchmarks.md, the master under load); and the followers share one copy.
Update = bytes


class LoggedEstimator(Estimator):
    """The master's estimator: an Estimator that also logs its updates for each follower (the planner
    process, the forecast worker), so that a follower's copy is brought up to date with the updates
    since it last took them (a delta), not the whole state; it makes a profile's export row as the
    profile changes, so that a whole export (a new follower) does not stall the loop. A follower starts following on its first
    `take_updates` (it then needs the whole state once); one whose log outgrows the state it describes
    (MAX_LOG updates, or PER_JOB per job with a profile, whichever is more) is dropped and starts
    again with the whole state, so a follower that stops asking costs no more memory than a copy."""

    MAX_LOG = 100_000
    PER_JOB = 200  # updates per job: about twenty rounds of progress reports

    def __init__(self, ewma_alpha: float = 0.3) -> None:
        super().__init__(ewma_alpha)
        self.logs: dict[str, list[Update]] = {}

    def _log(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.logs:
            return
        record = pickle.dumps((name, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        for follower, updates in list(self.logs.items()):
            updates.append(record)
            if len(updates) > self.MAX_LOG and len(updates) > self.PER_JOB * len(self._profiles):
                del self.logs[follower]
                log.warning("estimator_log_dropped", follower=follower, updates=len(updates))

    def add_profile(self, *args: Any, **kwargs: Any) -> None:
        super().add_profile(*args, **kwargs)
        self._log("add_profile", args, kwargs)
        self.prepare_export(kwargs.get("job_id", args[0] if args else ""))

    def observe(self, *args: Any, **kwargs: Any) -> None:
        super().observe(*args, **kwargs)
        self._log("observe", args, kwargs)

    def observe_data_time(self, *args: Any, **kwargs: Any) -> None:
        super().observe_data_time(*args, **kwargs)
        self._log("observe_data_time", args, kwargs)
        self.prepare_export(kwargs.get("job_id", args[0] if args else ""))

    def forget(self, *args: Any, **kwargs: Any) -> None:
        super().forget(*args, **kwargs)
        self._log("forget", args, kwargs)

    def take_updates(self, follower: str) -> list[Update] | None:
        """The updates since `follower` last took them, or None when it was not following (then it
        follows from now on, and must be sent the whole state)."""
        updates = self.logs.get(follower)
        self.logs[follower] = []
        return updates


# "spec" -> {job id: spec}, "server" -> {server id: server}: string keys only, so a request at 10,000
# jobs adds two dicts, not 10,000 key tuples, to what the collector walks while it is kept
Interned = dict[str, dict[str, Any]]
_VIEW_FIELDS = tuple(f.name for f in fields(JobView))
assert _VIEW_FIELDS[0] == "spec"
# JobView's number fields, sent as arrays ("d": float, "q": int); the others as lists
_NUMERIC = {f.name: "q" if f.type == "int" else "d" for f in fields(JobView) if f.type in ("float", "int")}


def interned(request: PlanRequest) -> Interned:
    """The specs and servers of `request`: what both sides keep for the next request."""
    specs = {view.spec.id: view.spec for view in request.snapshot.jobs}
    specs.update((spec.id, spec) for spec in request.to_profile)
    return {"server": {s.id: s for s in request.snapshot.servers}, "spec": specs}


def _ref(held: dict[str, Any], obj: Any) -> Any:
    """`obj`'s id if the worker holds this very object (`held`: those of its kind), else the object."""
    key = obj.id
    return key if held.get(key) is obj else obj


def _deref(kind: str, value: Any, known: Interned) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return known[kind][value]
    except KeyError:
        raise ValueError(f"the planner worker holds no {kind} {value!r}") from None


def dumps_request(message: tuple[PlanRequest, Any, Any], known: Interned) -> bytes:
    """Pickle (request, estimator state, updates) with the request's specs and servers that the worker
    holds sent by id, and its job views by column (numbers as arrays: no Python call, no memo entry per
    value while pickling)."""
    request, *rest = message
    snap = request.snapshot
    jobs = snap.jobs
    specs, servers_held = known.get("spec", {}), known.get("server", {})
    columns = [[_ref(specs, v.spec) for v in jobs]]
    for name in _VIEW_FIELDS[1:]:
        values = [getattr(v, name) for v in jobs]
        kind = _NUMERIC.get(name)
        columns.append(array.array(kind, values) if kind else values)  # type: ignore[arg-type]
    servers = [_ref(servers_held, s) for s in snap.servers]
    profile = [_ref(specs, s) for s in request.to_profile]
    shell = replace(request, snapshot=replace(snap, jobs=(), servers=()), to_profile=())
    return pickle.dumps((shell, columns, servers, profile, *rest), protocol=pickle.HIGHEST_PROTOCOL)


def loads_request(data: bytes, known: Interned) -> tuple[PlanRequest, Any, Any]:
    """The message `dumps_request` pickled, its references resolved from `known` (ValueError if the
    worker does not hold one)."""
    shell, columns, servers, profile, *rest = pickle.loads(data)
    specs = [_deref("spec", spec, known) for spec in columns[0]]
    typed = [
        column if _NUMERIC.get(name) != "q" else [int(x) for x in column]
        for name, column in zip(_VIEW_FIELDS[1:], columns[1:], strict=True)
    ]
    snap = replace(
        shell.snapshot,
        jobs=tuple(JobView(*row) for row in zip(specs, *typed, strict=True)),
        servers=tuple(_deref("server", s, known) for s in servers),
    )
    request = replace(shell, snapshot=snap, to_profile=tuple(_deref("spec", s, known) for s in profile))
    return (request, *rest)


def _pickle_request(message: tuple[PlanRequest, Any, Any], known: Interned) -> tuple[bytes, Interned]:
    """`dumps_request`, and what the worker will hold once it has read it (in the sending thread)."""
    return dumps_request(message, known), interned(message[0])


def apply_updates(estimator: Estimator, updates: list[Update]) -> None:
    """Replay a LoggedEstimator's updates on a copy of its state."""
    for record in updates:
        name, args, kwargs = decode_update(record)
        getattr(estimator, name)(*args, **kwargs)


def decode_update(record: Update) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """A logged update's method, args and kwargs."""
    name, args, kwargs = pickle.loads(record)
    return name, args, kwargs


def _serve(conn: multiprocessing.connection.Connection, settings: SchedulerSettings) -> None:
    """The worker's loop: a request with the estimator's state (whole, or the updates since the last
    request) in, PlanReady out, until the pipe closes."""
    from hopsmgr.policies.base import HopsPolicy

    with contextlib.suppress(OSError):  # the event loop wins a contended core (see PLANNER_NICE)
        os.nice(PLANNER_NICE)
    policy = HopsPolicy(settings)
    estimator = Estimator()
    known: Interned = {}
    while True:
        try:
            request, whole, updates = loads_request(conn.recv_bytes(), known)
        except (EOFError, OSError, ValueError):  # a reference it cannot resolve: a fresh worker
            return
        known = interned(request)
        if whole is not None:
            estimator = Estimator.from_state(whole)
        apply_updates(estimator, updates)
        conn.send(compute_plan(request, policy, estimator, time.perf_counter))


class PlannerProcess:
    """One worker process at a time; `plan` answers a request by `deadline` (a time.monotonic value)."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.context = multiprocessing.get_context("spawn")
        self.process: Any = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.replaced = 0
        self.fresh = True  # the worker has no estimator state yet: send it whole
        self.known: Interned = {}  # the specs and servers the worker holds (of the last request)

    def start(self) -> None:
        self.fresh = True
        self.known = {}
        parent, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_serve, args=(child, self.settings), name="hopsmgr-planner", daemon=True
        )
        self.process.start()
        child.close()
        self.conn = parent

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.process is not None:
            self.process.kill()
            self.process.join(timeout=5)
            self.process = None

    async def plan(self, request: PlanRequest, estimator: Estimator, deadline: float) -> PlanReady:
        if self.conn is None or self.process is None or not self.process.is_alive():
            self.stop()
            self.start()
        assert self.conn is not None
        loop = asyncio.get_running_loop()
        conn = self.conn
        message: tuple[PlanRequest, dict[str, Any] | None, list[Any]]
        updates = estimator.take_updates("planner") if isinstance(estimator, LoggedEstimator) else None
        if updates is not None and not self.fresh:
            message = (request, None, updates)
        else:  # a new worker (or one the log dropped): the whole state, once
            message = (request, estimator.export_state(), [])
        self.fresh = False
        known = self.known
        try:  # pickling in a thread: the loop keeps serving
            data, self.known = await loop.run_in_executor(None, _pickle_request, message, known)
            await loop.run_in_executor(None, conn.send_bytes, data)
        except BaseException:  # the worker may have missed these updates: a fresh one gets the whole
            self.stop()
            raise
        answered: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not answered.done():
                answered.set_result(None)

        loop.add_reader(conn.fileno(), readable)
        try:
            await asyncio.wait_for(answered, timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            loop.remove_reader(conn.fileno())
            log.warning("planner_missed_deadline", request=request.request_id, kind=request.kind)
            self.replaced += 1
            self.stop()  # a stalled worker is replaced; the next request starts a fresh one
            why = "the planner process missed the round's deadline: it was replaced"
            return fallback_plan(request, estimator, why)
        loop.remove_reader(conn.fileno())
        try:
            ready: PlanReady = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError) as exc:
            self.stop()
            return fallback_plan(request, estimator, f"the planner process died: {exc!r}")
        return replace(ready, stimulus_id=request.stimulus_id)
