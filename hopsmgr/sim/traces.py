"""Trace readers: Gavel, Philly and Tiresias job traces (shared/data) as lists of `WorkloadJob`.

Gavel traces (MIT) give total steps at a rigid GPU count. Gavel counts steps per worker (its throughput
table's 8-GPU steps/s are 5-8x the 1-GPU value), so a job's global iterations are total_steps /
scale_factor and, as `JobSpec.samples_from_iterations` counts iterations at the smallest GPU count,
total_samples = (total_steps / sf) x batch x sf = total_steps x batch (the world model's per-GPU batch).
Philly (CC BY 4.0, via the Pollux artifact) and Tiresias (Apache-2.0) traces give a duration instead:
total_samples = duration x the world's true rate at the job's GPU count on nominal reference servers of
the middle GPU type (`World.reference_rate`), so the job would run that long there. Philly and Tiresias
carry no usable model: one is drawn per job from the world's models with `random.Random(rng_seed)` in
arrival order (a Tiresias model name the world knows is kept). Every job is rigid at the trace's GPU count.
Arrivals are relative to the earliest job; jobs come back sorted by arrival (file order among equals).
A line that cannot be read raises `TraceError` ("<file>:<line>: <reason>"); so does a trace with no job.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hopsmgr.core.model import RequirementSet
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import (
    WorkloadJob,
    duration_class,
    gang_workload,
    parse_workload_spec,
    poisson_workload,
)

MAX_GPUS = 4096  # a larger GPU count in a trace is taken for a malformed line
_MAX_VALUE = 1e15  # larger times or step counts are taken for malformed values


class TraceError(ValueError):
    """A trace line that cannot be read: `path`, 1-based `line` (0: the file as a whole) and `reason`."""

    def __init__(self, path: str | Path, line: int, reason: str) -> None:
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")


def _number(name: str, text: str, *, positive: bool = False, lowest: float = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if not (math.isfinite(value) and abs(value) <= _MAX_VALUE):
        raise ValueError(f"{name} must be a finite number, got {text!r}")
    if value < lowest or (positive and value <= 0):
        raise ValueError(f"{name} must be {'> 0' if positive else f'>= {lowest:g}'}, got {text!r}")
    return value


def _gpus(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer GPU count, got {text!r}") from None
    if not 0 < value <= MAX_GPUS:
        raise ValueError(f"{name} must be within 1..{MAX_GPUS}, got {text!r}")
    return value


def _model(world: World, name: str) -> str:
    try:
        return world.model(name).name
    except ValueError:
        raise ValueError(f"unknown job type {name!r} for the {world.name} world") from None


class _Builder:
    """Collects (sort key, job fields) per line and turns them into sorted `WorkloadJob`s."""

    def __init__(self, path: str | Path, world: World, gpu_type: str | None) -> None:
        self.path, self.world, self.gpu_type = path, world, gpu_type
        self.rows: list[tuple[float, int, dict[str, Any]]] = []
        self.last_line = 0
        self._rates: dict[tuple[str, int], float] = {}

    def rate(self, model: str, gpus: int) -> float:
        key = (model, gpus)
        if key not in self._rates:
            self._rates[key] = self.world.reference_rate(model, gpus, self.gpu_type)
        return self._rates[key]

    def lines(
        self, stream: Iterator[list[str]], counter: Callable[[], int]
    ) -> Iterator[tuple[int, list[str]]]:
        """Yield (line number, fields) of non-blank rows; any read error becomes a TraceError."""
        while True:
            try:
                fields = next(stream)
            except StopIteration:
                return
            except (csv.Error, ValueError) as exc:
                raise TraceError(self.path, counter() + 1, f"unreadable line: {exc}") from None
            self.last_line = counter()
            if any(f.strip() for f in fields):
                yield self.last_line, fields

    def build(self, finish: Callable[[dict[str, Any]], None] | None = None) -> list[WorkloadJob]:
        if not self.rows:
            raise TraceError(self.path, self.last_line, "empty trace: no jobs")
        self.rows.sort(key=lambda r: (r[0], r[1]))
        first = self.rows[0][0]
        jobs = []
        for index, (arrival, line, fields) in enumerate(self.rows):
            try:
                if finish is not None:
                    finish(fields)
                gpus = fields["requirements"].minimum
                total = fields.pop("duration_s", None)
                if total is not None:
                    total *= self.rate(fields["model"], gpus)
                else:
                    total = fields.pop("total_samples")
                if not (math.isfinite(total) and total > 0):
                    raise ValueError(f"total work is not a positive number ({total!r} samples)")
                hours = total / self.rate(fields["model"], gpus) * gpus / 3600.0
                fields.setdefault("job_id", f"j{index:05d}")
                jobs.append(
                    WorkloadJob(
                        arrival_s=arrival - first,
                        total_samples=total,
                        batch_size=self.world.model(fields["model"]).batch_size,
                        duration_class=duration_class(hours),
                        **fields,
                    )
                )
            except (ValueError, ArithmeticError) as exc:
                raise TraceError(self.path, line, str(exc)) from None
        return jobs


def read_gavel_trace(
    path: str | Path,
    world: World,
    tenant: str = "default",
    model_map: Mapping[str, str] | None = None,
    gpu_type: str | None = None,
) -> list[WorkloadJob]:
    """A Gavel trace: 10 tab-separated columns (job_type, command, working_dir, num_steps_arg,
    needs_data_dir, total_steps, scale_factor, priority_weight, SLO, arrival_time) or the legacy 7
    (job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor).

    `model_map` renames job types first (e.g. to run a Gavel trace in the paper world); the job type must
    then be one of the world's models. SLO <= 0 (Gavel writes -1) means none.
    """
    builder = _Builder(path, world, gpu_type)
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        for lineno, raw in enumerate(fh, 1):
            builder.last_line = lineno
            line = raw.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cols = line.split("\t")
            try:
                if len(cols) == 10:
                    job_type, steps, sf, weight, slo, arrival = (
                        cols[0],
                        cols[5],
                        cols[6],
                        cols[7],
                        cols[8],
                        cols[9],
                    )
                elif len(cols) == 7:
                    job_type, steps, arrival, sf, weight, slo = cols[0], cols[4], cols[5], cols[6], "1", "-1"
                else:
                    raise ValueError(f"expected 10 (or legacy 7) tab-separated columns, got {len(cols)}")
                model = _model(world, (model_map or {}).get(job_type.strip(), job_type.strip()))
                gpus = _gpus("scale_factor", sf)
                batch = world.model(model).batch_size
                fields = {
                    "model": model,
                    "requirements": RequirementSet.rigid(gpus),
                    "total_samples": _number("total_steps", steps, positive=True) * batch,
                    "tenant": tenant,
                    "priority_weight": _number("priority_weight", weight, positive=True),
                }
                slo_value = _number("SLO", slo, lowest=-_MAX_VALUE)
                fields["slo"] = slo_value if slo_value > 0 else None
                builder.rows.append((_number("arrival_time", arrival), lineno, fields))
            except (ValueError, ArithmeticError) as exc:
                raise TraceError(path, lineno, str(exc)) from None
    return builder.build()


def _timestamp(text: str) -> float:
    """Seconds: a number, or a date-time such as '2017-10-09 07:01:55' (taken as UTC)."""
    try:
        return _number("timestamp", text, lowest=-_MAX_VALUE)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"timestamp must be seconds or a date-time, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _csv_rows(
    path: str | Path, required: tuple[str, ...], builder: _Builder
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, {column: value}) of every data row of a CSV file with a header naming `required`."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh)
        rows = builder.lines(reader, lambda: reader.line_num)
        header_line, header = next(rows, (0, []))
        if not header_line:
            return  # an empty file: the reader reports the empty trace
        names = [h.strip().lower() for h in header]
        missing = [c for c in required if c not in names]
        if missing:
            raise TraceError(path, header_line, f"header lacks column(s) {', '.join(missing)}: {header!r}")
        for lineno, fields in rows:
            if len(fields) != len(names):
                raise TraceError(path, lineno, f"expected {len(names)} columns, got {len(fields)}")
            yield lineno, dict(zip(names, fields, strict=True))


def read_philly_csv(
    path: str | Path, world: World, rng_seed: int = 0, limit: int | None = None, gpu_type: str | None = None
) -> list[WorkloadJob]:
    """philly.csv (timestamp, duration, num_gpus, gpu_time, cluster): tenant = cluster; `limit` keeps the
    earliest jobs. total_samples = duration x reference rate at num_gpus (see the module docstring)."""
    if limit is not None and (not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    builder = _Builder(path, world, gpu_type)
    for lineno, row in _csv_rows(path, ("timestamp", "duration", "num_gpus", "gpu_time", "cluster"), builder):
        try:
            fields = {
                "requirements": RequirementSet.rigid(_gpus("num_gpus", row["num_gpus"])),
                "duration_s": _number("duration", row["duration"], positive=True),
                "tenant": row["cluster"].strip() or "default",
            }
            _number("gpu_time", row["gpu_time"])
            builder.rows.append((_timestamp(row["timestamp"]), lineno, fields))
        except (ValueError, ArithmeticError) as exc:
            raise TraceError(path, lineno, str(exc)) from None
    builder.rows.sort(key=lambda r: (r[0], r[1]))
    if limit is not None:
        del builder.rows[limit:]
    rng, models = random.Random(rng_seed), [m.name for m in world.models()]

    def pick(fields: dict[str, Any]) -> None:
        fields["model"] = models[rng.randrange(len(models))]

    return builder.build(pick)


def read_tiresias_csv(
    path: str | Path, world: World, rng_seed: int = 0, gpu_type: str | None = None
) -> list[WorkloadJob]:
    """A Tiresias job CSV (job_id, num_gpu, submit_time, iterations, model_name, duration, interval).

    The file's job ids are kept; a model name the world knows (loosely: 'vgg11' = 'VGG11') is kept, any
    other is replaced by a model drawn per job. total_samples = duration x reference rate at num_gpu.
    """
    builder = _Builder(path, world, gpu_type)
    required = ("job_id", "num_gpu", "submit_time", "model_name", "duration")
    seen: set[str] = set()
    for lineno, row in _csv_rows(path, required, builder):
        try:
            job_id = row["job_id"].strip()
            if not job_id or job_id in seen:
                raise ValueError(f"job_id must be non-empty and unique, got {row['job_id']!r}")
            seen.add(job_id)
            fields = {
                "job_id": job_id,
                "requirements": RequirementSet.rigid(_gpus("num_gpu", row["num_gpu"])),
                "duration_s": _number("duration", row["duration"], positive=True),
                "model_name": row["model_name"].strip(),
            }
            builder.rows.append((_number("submit_time", row["submit_time"]), lineno, fields))
        except (ValueError, ArithmeticError) as exc:
            raise TraceError(path, lineno, str(exc)) from None
    rng, models = random.Random(rng_seed), [m.name for m in world.models()]

    def pick(fields: dict[str, Any]) -> None:
        name = fields.pop("model_name")
        drawn = models[rng.randrange(len(models))]
        try:
            fields["model"] = world.model(name).name
        except ValueError:
            fields["model"] = drawn

    return builder.build(pick)


_READERS: dict[str, Callable[..., list[WorkloadJob]]] = {
    "gavel": read_gavel_trace,
    "philly": read_philly_csv,
    "tiresias": read_tiresias_csv,
}


def read_trace(path: str | Path, fmt: str, world: World, **kw: Any) -> list[WorkloadJob]:
    """Read a trace of format `fmt` (gavel | philly | tiresias); keywords go to the reader."""
    reader = _READERS.get(fmt)
    if reader is None:
        raise ValueError(f"unknown trace format {fmt!r} (known: {', '.join(_READERS)})")
    return reader(path, world, **kw)


def workload_from_spec(spec: str, world: World, seed: int = 0) -> list[WorkloadJob]:
    """The workload a `parse_workload_spec` string names; `seed` applies where the spec gives none."""
    args: dict[str, Any] = parse_workload_spec(spec)
    kind = args.pop("kind")
    if kind == "poisson":
        tenants, gpu_types = args.get("tenants", ("default",)), args.get("gpu_types", ())
        return poisson_workload(world, args["jobs"], args["rate"], args.get("seed", seed), tenants, gpu_types)
    if kind == "gang":
        return gang_workload(
            world,
            args["jobs"],
            args["rate"],
            args.get("seed", seed),
            args.get("big_every", 40),
            args.get("big", (16, 32)),
            args.get("tenants", ("default",)),
        )
    path = args.pop("path")
    if kind in ("philly", "tiresias"):
        args["rng_seed"] = args.pop("seed", seed)
    return read_trace(path, kind, world, **args)
