"""A hand-written PyTorch training loop under hopsmgr in a few lines: `TrainLoop`.

    from hopsmgr.runtime.loop import TrainLoop

    loop = TrainLoop(model, optimizer, batch_size=32, scheduler=scheduler)
    loop.resume()                              # the newest checkpoint, if any
    for it in loop.iterations(args.iters):     # in profile mode: until the profile is written
        with loop.phase("data"): x, y = next_batch(it)
        with loop.phase("forward"): loss = loss_fn(model(x), y)
        with loop.phase("backward"): optimizer.zero_grad(); loss.backward()
        with loop.phase("update"): optimizer.step(); scheduler.step()

What it gives: profiling and progress (the runtime's phases and steps), checkpoint-on-signal (at the
end of the iteration in which SIGUSR1, SIGTERM or the request file arrived it saves the model, the
optimizer, the scheduler, torch's CPU and CUDA RNG states, Python's `random` state, numpy's when numpy
is loaded, and `extra_state()`, then exits 75) and resume (`resume()` loads all of them back and the
loop continues at the saved iteration). torch is imported when a loop is built, never by
`hopsmgr.runtime` itself.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from hopsmgr.runtime.core import Runtime, cuda_sync, init


def to_cpu(obj: Any) -> Any:
    """`obj` with every tensor copied to the CPU, so a checkpoint loads on any device."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def rng_state() -> dict[str, Any]:
    """The random states a training step may draw from: torch (CPU, CUDA), Python, numpy if loaded."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])


class TrainLoop:
    """One training loop's model, optimizer and (optional) scheduler, checkpointed and resumed whole.

    `batch_size`: samples of one iteration (for progress and throughput). `extra_state` returns more
    picklable state to save (e.g. the last loss); `load_extra` takes it back on resume.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        *,
        batch_size: float,
        scheduler: Any = None,
        runtime: Runtime | None = None,
        extra_state: Callable[[], Any] | None = None,
        load_extra: Callable[[Any], None] | None = None,
    ) -> None:
        import torch  # noqa: F401  (a loop needs torch: fail here, not at the first checkpoint)

        self.runtime = runtime if runtime is not None else init()
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.batch_size = float(batch_size)
        self.extra_state, self.load_extra = extra_state, load_extra

    @property
    def iteration(self) -> int:
        return self.runtime.iteration

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Time a phase of the current iteration (data, forward, backward, update, comm, wait)."""
        return self.runtime.phase(name)

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds (tensors on the CPU)."""
        return {
            "model": to_cpu(self.model.state_dict()),
            "optimizer": to_cpu(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": rng_state(),
            "extra": self.extra_state() if self.extra_state is not None else None,
        }

    def resume(self) -> int:
        """Load the newest verified checkpoint into the model, optimizer, scheduler and RNGs; the
        iteration to continue at (0 when there is none)."""
        it, state = self.runtime.resume()
        if state is None:
            return it
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        if self.load_extra is not None:
            self.load_extra(state.get("extra"))
        return it

    def iterations(self, total: int) -> Iterator[int]:
        """The iteration numbers from the current one until the job's work reaches `total` iterations
        at its smallest GPU count (`Runtime.work`: an attempt on twice those GPUs takes half the steps;
        in profile mode on until the profile is complete); after each body, the step: it may
        checkpoint and exit 75, or exit 0 when profiling is done. Ends with the final progress record."""
        rt = self.runtime
        while not rt.done(total) or rt.mode == "profile":
            yield rt.iteration
            cuda_sync()
            rt.step(self.batch_size, state=self.state)
        rt.finish()
