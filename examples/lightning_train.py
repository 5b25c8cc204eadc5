"""A small regression MLP trained with PyTorch Lightning under hopsmgr (`hopsmgr.runtime.lightning`).

A two-layer MLP (16 -> 32 -> 1) fits a fixed random linear function of synthetic inputs. The hopsmgr
part is two lines: `HopsCallback()` in the Trainer's callbacks and
`trainer.fit(model, data, ckpt_path=hops.ckpt_path())`.

The batch of step `i` is drawn from a generator seeded by (seed, i): Lightning resumes a mid-epoch
checkpoint at the right step but starts a plain DataLoader's epoch over, so data indexed by the step
(or a stateful loader) is what makes a resumed run end exactly like an uninterrupted one.

    python examples/lightning_train.py --iters 40 --batch-size 16

One iteration is one optimizer step at the job's smallest GPU count (`max_steps` = `--iters`). On
more GPUs a step does more of them: the global batch grows with the GPUs (this script trains on one
CPU device, so it takes the larger batch itself, `rt.step_batch`), and `HopsCallback` stops training
once the work of max_steps is done (`iters=` to give another count). Prints `step <n> loss <x>` per
step, then `final step <n>` and `final digest <sha256 of the parameters>`.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import tempfile
import time
from typing import Any

import lightning
import torch
from torch import nn

from hopsmgr.runtime.lightning import HopsCallback

FEATURES = 16


class Regressor(lightning.LightningModule):  # type: ignore[misc]
    def __init__(self, batch_size: int, seed: int, step_seconds: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
        self.batch_size, self.seed, self.step_seconds = batch_size, seed, step_seconds
        self.weights = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(seed))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.trainer.global_step + 1)
        x = torch.randn(self.batch_size, FEATURES, generator=g)
        y = x @ self.weights
        loss = nn.functional.mse_loss(self.net(x), y)
        print(f"step {self.trainer.global_step + 1} loss {loss.item():.4f}", flush=True)
        if self.step_seconds > 0:
            time.sleep(self.step_seconds)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def steps(iters: int) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    """One item per step (training_step draws the step's batch itself)."""
    return torch.utils.data.DataLoader(range(max(iters, 1)), batch_size=1)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().cpu().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--iters", type=int, required=True, help="optimizer steps (the Trainer's max_steps)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="wait this long per step (a slower input pipeline)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("HOPS_THREADS", "1")))
    lightning.seed_everything(args.seed, verbose=False)
    hops = HopsCallback()  # stops at max_steps' work: on more GPUs than the smallest count, sooner
    # on the CPU, one device: each step takes the samples of the attempt's GPUs together (the batch x
    # HOPS_WORLD_GPUS / HOPS_BASE_GPUS), so it does the work the master counts
    batch = hops.runtime.step_batch(args.batch_size)
    hops.batch_size = batch
    model = Regressor(batch, args.seed, args.step_seconds)
    trainer = lightning.Trainer(
        max_steps=args.iters,
        accelerator="cpu",
        devices=1,
        callbacks=[hops],
        logger=False,
        enable_checkpointing=False,  # hopsmgr asks for checkpoints when it needs one
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=os.environ.get("HOPS_CHECKPOINT_DIR") or tempfile.mkdtemp(),
    )
    ckpt = hops.ckpt_path()
    if ckpt is not None:
        print(f"resumed from step {hops.runtime.iteration}", flush=True)
    trainer.fit(model, steps(args.iters), ckpt_path=ckpt)
    print(f"final step {trainer.global_step}", flush=True)
    print(f"final digest {digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
