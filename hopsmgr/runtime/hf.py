"""Hugging Face `transformers.Trainer` under hopsmgr: one callback and one resume call.

    from hopsmgr.runtime.hf import HopsCallback

    hops = HopsCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[hops])
    trainer.train(resume_from_checkpoint=hops.resume_checkpoint(args.output_dir))

What it gives: profiling (in profile mode the data, forward+backward and optimizer times of each
optimizer step; the run exits 0 after `HOPS_PROFILE_ITERS` steps), progress (`progress.json`: one
iteration is one optimizer step, so submit with `--batch-size` = per-device batch x gradient
accumulation steps and `--iters` = max_steps), checkpoint-on-signal (on SIGUSR1, SIGTERM or the request
file the Trainer saves its own checkpoint at the end of the current step, which goes into a verified
hopsmgr checkpoint, and the process exits 75) and resume (`resume_checkpoint` unpacks the newest one
into `<output_dir>/checkpoint-<step>` for `trainer.train(resume_from_checkpoint=...)`: model,
optimizer, scheduler, RNG states and the position in the epoch).

Importing this module imports transformers; `hopsmgr.runtime` itself never does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from hopsmgr.runtime import bundle
from hopsmgr.runtime.core import Runtime, init

KIND = "transformers-trainer"


class HopsCallback(TrainerCallback):
    """A `TrainerCallback` linking a Trainer to hopsmgr (see the module's documentation)."""

    def __init__(self, runtime: Runtime | None = None, *, iters: float | None = None) -> None:
        """`iters`: the job's iterations at its smallest GPU count (`--iters`; by default the
        Trainer's max_steps, as the job is submitted): training stops once the runtime's work reaches
        them, so an attempt on more GPUs (each step doing more of them) ends sooner."""
        self.runtime = runtime if runtime is not None else init()
        self.iters = iters
        self._last_end: float | None = None
        self._step_begin = 0.0
        self._pre_optimizer = 0.0
        self._saving = False

    def resume_checkpoint(self, output_dir: str | Path) -> str | None:
        """The Trainer checkpoint directory to resume from (unpacked from the newest hopsmgr
        checkpoint into `output_dir`), or None when the job has none yet. Call before `train()`."""
        _, state = self.runtime.resume()
        found = bundle.unbundle(state, KIND)
        if found is None:
            return None
        step, files = found
        return str(bundle.unpack_dir(files, Path(output_dir) / f"checkpoint-{step}"))

    # -- Trainer events -------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rt = self.runtime
        if self.iters is None and int(getattr(args, "max_steps", 0) or 0) > 0:
            self.iters = int(args.max_steps)
        if rt.iteration != state.global_step:
            rt.start_at(int(state.global_step))
        self._last_end = time.perf_counter()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        if self._last_end is not None:  # the Trainer fetched this step's batches since the last step
            self.runtime.record_phase("data", now - self._last_end)
        self._step_begin = now

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._pre_optimizer = time.perf_counter()
        # forward and backward of every micro-batch: the Trainer gives no event between the two
        self.runtime.record_phase("forward", self._pre_optimizer - self._step_begin)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.runtime.record_phase("update", time.perf_counter() - self._pre_optimizer)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rt = self.runtime
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        rt.count(samples)  # in profile mode: exits 0 once the profile is written
        if self.iters is not None and rt.mode == "run" and rt.done(self.iters):
            control.should_training_stop = True
        if rt.checkpoint_requested:
            if rt.mode == "profile" or rt.settings.checkpoint_dir is None:
                rt.exit_checkpointed(None)
            control.should_save = True  # the Trainer saves after this step, then calls on_save
            control.should_training_stop = True
            self._saving = True
        self._last_end = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._saving:
            return
        step = int(state.global_step)
        files = bundle.pack_dir(Path(args.output_dir) / f"checkpoint-{step}")
        saved = self.runtime.save_checkpoint(bundle.bundle(KIND, step, files))
        self.runtime.exit_checkpointed(saved)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.runtime.finish()
