"""The job-side runtime: phase timing, iteration counting, progress, profiling and checkpoint-on-request.

Settings come from `HOPS_*` environment variables set by the node wrapper (hopsmgr.runtime.settings);
with none set the script runs standalone and writes no files. A checkpoint request (SIGUSR1, SIGTERM,
or the file `<attempt dir>/checkpoint.request`) only sets a flag; the next `step()` saves a checkpoint
and exits with `EXIT_CHECKPOINTED`. In profile mode `step()` writes `profile.json` after the requested
number of iterations and exits 0 without a checkpoint.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from hopsmgr import nodecontract as nc
from hopsmgr.nodecontract import EXIT_CHECKPOINTED, PROFILE_FILE, PROGRESS_FILE, REQUEST_FILE
from hopsmgr.runtime import balance, checkpoint
from hopsmgr.runtime.files import atomic_write_json
from hopsmgr.runtime.settings import Settings
from hopsmgr.runtime.stats import mean, two_means

PHASES = ("data", "forward", "backward", "update", "comm", "wait")
PROGRESS_INTERVAL_S = 0.5
PACE_WINDOW = 20
WARMUP_ITERS = 2


def cuda_sync() -> None:
    """`torch.cuda.synchronize()` when torch is already imported and CUDA is initialised; else nothing.

    Never imports torch itself.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return
    initialised = getattr(cuda, "is_initialized", None)
    if cuda.is_available() and (initialised is None or initialised()):
        cuda.synchronize()


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else 0.0


@dataclass
class _Step:
    seconds: float
    samples: float
    phases: dict[str, float] = field(default_factory=dict)


class Runtime:
    """One training process's link to hopsmgr. Build it with `Runtime.from_env()` (or `init()`)."""

    def __init__(self, settings: Settings | None = None, *, install_signals: bool = True) -> None:
        self._s = settings or Settings()
        self._iteration = 0
        self._start_iteration = 0
        self._work = 0.0
        self._start_work = 0.0
        self._samples = 0.0
        self._requested = False
        self._recent: deque[_Step] = deque(maxlen=PACE_WINDOW)
        self._profiled: list[_Step] = []
        self._current: dict[str, float] = {}
        self._first_phase_t0: float | None = None
        self._iter_start = time.perf_counter()
        self._last_progress = -math.inf
        self._sync = self._s.mode == "profile"
        if self._s.attempt_dir is not None:
            self._s.attempt_dir.mkdir(parents=True, exist_ok=True)
        if install_signals:
            self._install_signals()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, install_signals: bool = True) -> Runtime:
        return cls(Settings.from_env(env), install_signals=install_signals)

    # --- read-only facts -------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self._s

    @property
    def mode(self) -> str:
        return self._s.mode

    @property
    def gpus(self) -> int:
        return self._s.gpus

    @property
    def lr_scale(self) -> float:
        return self._s.lr_scale

    @property
    def emulated_speed(self) -> float:
        return self._s.emulated_speed

    @property
    def share(self) -> float:
        """This process's share of the global batch: `HOPS_RANK_SHARES` at its index (`HOPS_FIRST_RANK`
        + `LOCAL_RANK` when the master set `HOPS_FIRST_RANK`, else `RANK`); 1/N when unset."""
        shares = self.shares()
        if self._s.share_rank >= len(shares):
            raise ValueError(
                f"rank index {self._s.share_rank} is outside the {len(shares)} shares of {nc.RANK_SHARES}"
            )
        return shares[self._s.share_rank]

    def shares(self, world_size: int | None = None) -> tuple[float, ...]:
        """Every rank's share for `world_size` ranks (default `WORLD_SIZE`): `HOPS_RANK_SHARES`, or equal."""
        n = self._s.world_size if world_size is None else world_size
        given = self._s.rank_shares
        if not given:
            return balance.equal_shares(n)
        if len(given) != n:
            raise ValueError(f"{nc.RANK_SHARES} has {len(given)} shares for a world of {n} ranks")
        return given

    @property
    def node_share(self) -> float:
        """The share of the global batch of this node's GPUs together (one process per node, as with
        the plain launcher): `HOPS_RANK_SHARES` from `HOPS_FIRST_RANK` for `HOPS_GPUS` ranks, out of
        `HOPS_WORLD_GPUS`; GPUs / world GPUs with equal shares."""
        shares = self.shares(self._s.world_gpus)
        first = self._s.first_rank
        return sum(shares[first : first + self._s.gpus])

    def local_batch_size(
        self, global_batch: int, rank: int | None = None, world_size: int | None = None
    ) -> int:
        """How many of the `global_batch` samples rank `rank` (default: this process's index, as in
        `share`) trains on each step."""
        where = self.local_batch_slice(global_batch, rank, world_size)
        return where.stop - where.start

    def local_batch_slice(
        self, global_batch: int, rank: int | None = None, world_size: int | None = None
    ) -> slice:
        """Where rank `rank`'s samples lie in the global batch (ranks take consecutive runs in rank order)."""
        shares = self.shares(world_size)
        return balance.local_slice(global_batch, shares, self._s.share_rank if rank is None else rank)

    def loss_scale(self, global_batch: int, rank: int | None = None, world_size: int | None = None) -> float:
        """What rank `rank` multiplies its mean loss by before `backward()` so that DDP's average of the
        ranks' gradients is the gradient of the mean loss over the global batch: N * b / B (1 for equal
        shares that divide the batch)."""
        n = self._s.world_size if world_size is None else world_size
        local = self.local_batch_size(global_batch, rank, n)
        return balance.loss_scale(local, global_batch, n)

    @property
    def iteration(self) -> int:
        """Absolute iteration count: resumed iterations plus the steps of this process."""
        return self._iteration

    @property
    def work_per_step(self) -> float:
        """The job's work one step of this attempt does, in iterations at its smallest GPU count (the
        unit of `--iters`): `HOPS_WORLD_GPUS / HOPS_BASE_GPUS`. The per-GPU batch stays fixed when the
        count changes (HOPS.md), so a step on twice the GPUs processes twice the samples."""
        return self._s.world_gpus / self._s.base_gpus

    def step_batch(self, per_gpu_batch: int) -> int:
        """The samples one step takes when a single process trains on one device for the whole
        attempt: `per_gpu_batch` x `work_per_step`, rounded (at least 1). What the attempt's GPUs would
        process together, so each step does the work the master counts (a data-parallel script, whose
        ranks each take `per_gpu_batch`, does not need it)."""
        return max(1, round(per_gpu_batch * self.work_per_step))

    @property
    def work(self) -> float:
        """The job's work done, in iterations at its smallest GPU count (the unit of `--iters`): the
        resumed work plus `work_per_step` for each step of this process. Loop while it is below the
        job's iterations, and a job given more GPUs than its smallest count ends sooner."""
        return self._work

    def done(self, total: float) -> bool:
        """True once the job's work reaches `total` iterations at its smallest GPU count."""
        # a rounding margin: 3 steps of 1/3 are one iteration of work, not 0.999...
        return self._work >= total - 1e-9 * max(1.0, abs(total))

    @property
    def checkpoint_requested(self) -> bool:
        if self._requested:
            return True
        d = self._s.attempt_dir
        return d is not None and (d / REQUEST_FILE).exists()

    # --- signals ---------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._requested = True

    def _install_signals(self) -> None:
        """SIGTERM and SIGUSR1 set the request flag.

        SIGUSR1 stays blocked in this thread (the wrapper starts jobs with it blocked) and a daemon
        thread takes it with `sigwait`, so processes the job later starts inherit the block and survive
        a checkpoint request sent to the whole process group. The handler also covers delivery to
        threads that had it unblocked before the runtime started.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        if hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigwait"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            threading.Thread(target=self._sigwait, name="hopsmgr-sigusr1", daemon=True).start()

    def _sigwait(self) -> None:
        while True:
            signal.sigwait({signal.SIGUSR1})
            self._requested = True

    def request_checkpoint(self) -> None:
        """Ask for a checkpoint-and-exit at the next `step()` (what SIGUSR1 does)."""
        self._requested = True

    # --- the training loop -----------------------------------------------------------------------
    def resume(self) -> tuple[int, Any]:
        """Load the newest verified checkpoint: (iteration, state), or (0, None) when there is none."""
        if self._iteration != self._start_iteration:
            raise RuntimeError("resume() must be called before the first step()")
        found = checkpoint.load_latest_record(self._s.checkpoint_dir)
        it, work, state = found if found is not None else (0, 0.0, None)
        self._iteration = self._start_iteration = it
        self._work = self._start_work = work
        self._iter_start = time.perf_counter()
        return it, state

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase of the current iteration (data, forward, backward, update, comm, wait)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; expected one of {', '.join(PHASES)}")
        t0 = time.perf_counter()
        if self._first_phase_t0 is None:
            self._first_phase_t0 = t0
        try:
            yield
        finally:
            if self._sync:
                cuda_sync()
            self._current[name] = self._current.get(name, 0.0) + time.perf_counter() - t0

    def step(self, samples: float = 0.0, state: Callable[[], Any] | None = None) -> None:
        """Count one finished iteration of `samples` samples.

        May not return: exits 0 when profiling is done, or saves `state()` and exits
        `EXIT_CHECKPOINTED` when a checkpoint was requested.
        """
        self.count(samples)
        if self.checkpoint_requested:
            self._checkpoint_and_exit(state)

    def count(self, samples: float = 0.0) -> None:
        """`step()` without the checkpoint: count one finished iteration and write progress; in profile
        mode exit 0 once the profile is complete. For integrations whose framework writes its own
        checkpoints: they test `checkpoint_requested`, save, then call `exit_checkpointed`."""
        now = time.perf_counter()
        # the first iteration of a process starts at its first phase (not at setup) when phases are used
        begin = self._iter_start
        if not self._recent and self._first_phase_t0 is not None:
            begin = self._first_phase_t0
        rec = _Step(now - begin, float(samples), self._current)
        self._current = {}
        self._first_phase_t0 = None
        self._iter_start = now
        self._iteration += 1
        self._work += self.work_per_step
        self._samples += rec.samples
        self._recent.append(rec)
        if self._s.mode == "profile":
            self._profiled.append(rec)
            if len(self._profiled) >= self._s.profile_iters:
                self._write_profile()
                self._write_progress()
                sys.exit(0)
        if now - self._last_progress >= PROGRESS_INTERVAL_S:
            self._write_progress()

    def record_phase(self, name: str, seconds: float) -> None:
        """Add `seconds` to phase `name` of the current iteration (for hooks that cannot wrap a phase
        in `phase()`: framework callbacks see its start and its end as two calls)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; expected one of {', '.join(PHASES)}")
        self._current[name] = self._current.get(name, 0.0) + max(0.0, float(seconds))

    def start_at(self, iteration: int, work: float | None = None) -> None:
        """Count from `iteration` (a framework resumed its own checkpoint at that step); before any step.
        `work` is the job's work done by then (`work`'s unit); without it, the work `resume()` restored
        (0 without one) plus this attempt's `work_per_step` for each step from its iteration to
        `iteration`."""
        if self._iteration != self._start_iteration:
            raise RuntimeError("start_at() must be called before the first step()")
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration must be an integer >= 0, got {iteration!r}")
        if work is None:
            work = max(0.0, self._work + (iteration - self._iteration) * self.work_per_step)
        elif (
            isinstance(work, bool) or not isinstance(work, int | float) or not math.isfinite(work) or work < 0
        ):
            raise ValueError(f"work must be a finite number >= 0, got {work!r}")
        self._iteration = self._start_iteration = iteration
        self._work = self._start_work = float(work)

    def exit_checkpointed(self, saved: Path | None = None) -> NoReturn:
        """Write the last progress record and exit `EXIT_CHECKPOINTED` (after a checkpoint was saved)."""
        where = f"to {saved}" if saved else "(no HOPS_CHECKPOINT_DIR: nothing saved)"
        if self._s.mode == "run":
            print(f"hopsmgr: checkpoint at iteration {self._iteration} {where}", file=sys.stderr)
        self._write_progress()
        sys.exit(EXIT_CHECKPOINTED)

    def save_checkpoint(self, state: Any) -> Path | None:
        """Save `state` at the current iteration now; None when no checkpoint directory is set."""
        if self._s.checkpoint_dir is None:
            return None
        return checkpoint.save(self._s.checkpoint_dir, self._iteration, state, work=self._work)

    def finish(self) -> None:
        """Write the final progress record; in profile mode, a job shorter than the profiling run writes
        the profile of the iterations it did (a run that measured none writes none)."""
        self._write_progress()
        if self._s.mode == "profile" and self._profiled:
            self._write_profile()

    def _checkpoint_and_exit(self, state: Callable[[], Any] | None) -> NoReturn:
        saved = None
        if self._s.mode == "run":
            saved = self.save_checkpoint(state() if state is not None else None)
        self.exit_checkpointed(saved)

    # --- records ---------------------------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        """The record `progress.json` holds."""
        recent = list(self._recent)
        seconds = sum(r.seconds for r in recent)
        return {
            "iteration": self._iteration,
            "start_iteration": self._start_iteration,
            "work": self._work,
            "start_work": self._start_work,
            "samples": self._samples,
            "samples_per_s": _finite(sum(r.samples for r in recent) / seconds) if seconds > 0 else 0.0,
            "iteration_s": _finite(mean([r.seconds for r in recent])),
            "td_s": _finite(mean([r.phases.get("data", 0.0) for r in recent])),
            "tw_s": _finite(mean([r.phases.get("wait", 0.0) for r in recent])),
            "time": time.time(),
            "mode": self._s.mode,
        }

    def profile(self) -> dict[str, Any]:
        """The record `profile.json` holds: phase means over the steps after the warm-up."""
        steps = self._profiled[WARMUP_ITERS:] if len(self._profiled) > WARMUP_ITERS else self._profiled

        def phase_mean(name: str) -> float:
            return _finite(mean([s.phases.get(name, 0.0) for s in steps]))

        split = two_means([s.phases.get("data", 0.0) for s in steps])
        seconds = sum(s.seconds for s in steps)
        return {
            "iterations": len(self._profiled),
            "measured": len(steps),
            "tf_s": phase_mean("forward"),
            "tb_s": phase_mean("backward"),
            "tu_s": phase_mean("update"),
            "tc_s": phase_mean("comm"),
            "tw_s": phase_mean("wait"),
            "td_s": phase_mean("data"),
            "td_hit_s": _finite(split.hit_s),
            "td_miss_s": _finite(split.miss_s),
            "p_cache": _finite(split.p_cache),
            "iteration_s": _finite(mean([s.seconds for s in steps])),
            "samples_per_s": _finite(sum(s.samples for s in steps) / seconds) if seconds > 0 else 0.0,
            "gpus": self._s.gpus,
            "emulated_speed": self._s.emulated_speed,
        }

    def _write_progress(self) -> None:
        self._last_progress = time.perf_counter()
        if self._s.attempt_dir is not None:
            # group-readable: where the job runs as its user, the wrapper reads it through the group
            atomic_write_json(self._s.attempt_dir / PROGRESS_FILE, self.progress(), durable=False, mode=0o640)

    def _write_profile(self) -> None:
        if self._s.attempt_dir is not None:
            atomic_write_json(self._s.attempt_dir / PROFILE_FILE, self.profile(), mode=0o640)


def init(env: Mapping[str, str] | None = None, *, install_signals: bool = True) -> Runtime:
    """`Runtime.from_env`: the usual way a training script starts."""
    return Runtime.from_env(env, install_signals=install_signals)
