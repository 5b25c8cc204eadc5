"""PyTorch Lightning under hopsmgr: one callback and one resume call.

    from hopsmgr.runtime.lightning import HopsCallback

    hops = HopsCallback(batch_size=32)
    trainer = lightning.Trainer(max_steps=N, callbacks=[hops], ...)
    trainer.fit(model, data, ckpt_path=hops.ckpt_path(workdir))

What it gives: profiling (in profile mode the data, forward, backward and optimizer times of each
training batch; the run exits 0 after `HOPS_PROFILE_ITERS` optimizer steps), progress (one
iteration is one optimizer step, `trainer.global_step`: submit with `--iters` = max_steps and
`--batch-size` = the samples of one step), checkpoint-on-signal (on SIGUSR1 or the request file
Lightning saves its own full checkpoint at the end of the current batch, which goes into a verified
hopsmgr checkpoint, and the process exits 75) and resume (`ckpt_path` unpacks the newest one for
`trainer.fit(..., ckpt_path=...)`: weights, optimizers, schedulers, loop state).

Importing this module imports lightning; `hopsmgr.runtime` itself never does.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning

from hopsmgr.runtime import bundle
from hopsmgr.runtime.core import Runtime, init

KIND = "lightning"
FILE = "last.ckpt"


def _batch_len(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor (or list) found, else 0."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (list, tuple)) and batch and not hasattr(batch, "shape"):
        batch = batch[0]
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(batch) if isinstance(batch, (list, tuple)) else 0


class HopsCallback(lightning.pytorch.Callback):
    """A Lightning `Callback` linking a Trainer to hopsmgr (see the module's documentation).

    `batch_size`: samples of one optimizer step; by default counted from each batch (the length of
    its first tensor) and summed over gradient accumulation. `iters`: the job's iterations at its
    smallest GPU count (`--iters`; by default the Trainer's max_steps, as the job is submitted):
    training stops once the runtime's work reaches them, so an attempt on more GPUs ends sooner.
    """

    def __init__(
        self, runtime: Runtime | None = None, *, batch_size: int | None = None, iters: float | None = None
    ) -> None:
        self.runtime = runtime if runtime is not None else init()
        self.batch_size = batch_size
        self.iters = iters
        self._last_end: float | None = None
        self._t: dict[str, float] = {}
        self._samples = 0.0
        self._step = 0

    def ckpt_path(self, directory: str | Path | None = None) -> str | None:
        """The Lightning checkpoint to resume from (unpacked from the newest hopsmgr checkpoint into
        `directory`, default HOPS_CHECKPOINT_DIR), or None when the job has none yet."""
        _, state = self.runtime.resume()
        found = bundle.unbundle(state, KIND)
        if found is None:
            return None
        step, files = found
        where = directory or self.runtime.settings.checkpoint_dir or tempfile.mkdtemp()
        return str(bundle.unpack_dir(files, Path(where) / f"lightning-resume-{step}") / FILE)

    # -- Trainer hooks ----------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        rt = self.runtime
        self._step = int(trainer.global_step)
        if self.iters is None and int(getattr(trainer, "max_steps", -1) or -1) > 0:
            self.iters = int(trainer.max_steps)
        if rt.iteration != self._step:
            rt.start_at(self._step)
        self._last_end = time.perf_counter()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_end is not None:
            self.runtime.record_phase("data", now - self._last_end)
        self._t = {"start": now}
        self._samples += self.batch_size if self.batch_size is not None else _batch_len(batch)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        now = time.perf_counter()
        self.runtime.record_phase("forward", now - self._t.get("start", now))
        self._t["backward"] = now

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        now = time.perf_counter()
        self.runtime.record_phase("backward", now - self._t.get("backward", now))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._t["update"] = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rt = self.runtime
        now = time.perf_counter()
        if "update" in self._t:
            rt.record_phase("update", now - self._t["update"])
        if int(trainer.global_step) > self._step:  # an optimizer step ended with this batch
            self._step = int(trainer.global_step)
            samples = self.batch_size if self.batch_size is not None else self._samples
            self._samples = 0.0
            rt.count(samples)  # in profile mode: exits 0 once the profile is written
            if self.iters is not None and rt.mode == "run" and rt.done(self.iters):
                trainer.should_stop = True
            if rt.checkpoint_requested:
                self._checkpoint_and_exit(trainer)
        self._last_end = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.runtime.finish()

    def _checkpoint_and_exit(self, trainer: Any) -> None:
        rt = self.runtime
        if rt.mode == "profile" or rt.settings.checkpoint_dir is None:
            rt.exit_checkpointed(None)
        rt.settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-lightning-", suffix=".ckpt", dir=rt.settings.checkpoint_dir)
        os.close(fd)
        try:
            trainer.save_checkpoint(tmp)
            data = Path(tmp).read_bytes()
        finally:
            os.unlink(tmp)
        saved = rt.save_checkpoint(bundle.bundle(KIND, self._step, {FILE: data}))
        rt.exit_checkpointed(saved)
