"""A hand-written PyTorch loop under hopsmgr with `hopsmgr.runtime.loop.TrainLoop`.

A two-layer MLP (16 -> 64 -> 4) classifies synthetic points by the sign pattern of two fixed random
projections, with AdamW, a cosine learning-rate schedule and dropout (so resuming must restore the
RNG as well). The batch of iteration `i` is drawn from a generator seeded by (seed, i), so the data
does not depend on where an attempt started. The hopsmgr part: build a `TrainLoop`, call `resume()`,
loop over `loop.iterations(N)` with the phases timed.

    python examples/loop_train.py --iters 100 --batch-size 32

Prints `iter <n> loss <x>`, then `final loss <x>` and `final digest <sha256 of the parameters>`.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import math
import os
import time

import torch
from torch import nn

from hopsmgr import runtime
from hopsmgr.runtime.loop import TrainLoop

FEATURES, CLASSES = 16, 4


def batch(seed: int, iteration: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    projections = torch.randn(FEATURES, 2, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration + 1)
    x = torch.randn(size, FEATURES, generator=g)
    signs = (x @ projections > 0).long()
    return x, signs[:, 0] * 2 + signs[:, 1]


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().cpu().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="wait this long per iteration (a slower input pipeline)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("HOPS_THREADS", "1")))
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = runtime.init()
    # cosine decay over the job's work (rt.work: iterations at the smallest GPU count), so it ends with
    # the work whatever GPU counts the attempts get (a step count would stop half way on 2 GPUs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda _: 0.5 * (1 + math.cos(math.pi * min(1.0, rt.work / max(args.iters, 1))))
    )
    last = {"loss": float("nan")}
    # one process on one device: each step takes the samples of the attempt's GPUs together (the
    # per-GPU batch x HOPS_WORLD_GPUS / HOPS_BASE_GPUS), so it does the work the master counts
    size = rt.step_batch(args.batch_size)
    loop = TrainLoop(
        model,
        optimizer,
        scheduler=scheduler,
        batch_size=size,
        runtime=rt,
        extra_state=lambda: dict(last),
        load_extra=last.update,
    )
    start = loop.resume()
    if start:
        print(f"resumed at iteration {start}", flush=True)
    model.train()
    for it in loop.iterations(args.iters):
        with loop.phase("data"):
            x, y = batch(args.seed, it, size)
            if args.step_seconds > 0:
                time.sleep(args.step_seconds)
        with loop.phase("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with loop.phase("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with loop.phase("update"):
            optimizer.step()
            scheduler.step()
        last["loss"] = loss.item()
        if args.log_every > 0 and (it + 1) % args.log_every == 0:
            print(f"iter {it + 1} loss {last['loss']:.4f}", flush=True)
    print(f"final loss {last['loss']:.6f}", flush=True)
    print(f"final digest {digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
