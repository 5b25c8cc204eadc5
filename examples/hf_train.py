"""A tiny GPT-2 trained with the Hugging Face Trainer under hopsmgr (`hopsmgr.runtime.hf`).

The model is built from a config (2 layers, embedding 32, vocabulary 64: nothing is downloaded) and
learns synthetic counting sequences (token t+1 follows token t, modulo the vocabulary). The hopsmgr
part is two lines: `HopsCallback(iters=...)` in the Trainer's callbacks and
`trainer.train(resume_from_checkpoint=hops.resume_checkpoint(output_dir))`.

    python examples/hf_train.py --iters 40 --batch-size 4

Under hopsmgr one iteration is one optimizer step at the job's smallest GPU count: submit with the
same `--iters` (max_steps) and `--batch-size` (per-device batch x gradient accumulation). On more GPUs
a step does more of the job's iterations: the global batch grows with the GPUs (this script trains on
one CPU device, so it takes the larger batch itself, `rt.step_batch`), and `HopsCallback` stops
training once they are done (`iters=`, by default max_steps). Prints `step <n> loss <x>` per step, then
`final step <n>` and `final digest <sha256 of the parameters>`.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built locally: never reach the Hub

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from hopsmgr.runtime.hf import HopsCallback

VOCAB = 64
SEQ = 16


class Counting(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """`size` sequences start, start+1, ... (mod VOCAB), each its own label (the model shifts them)."""

    def __init__(self, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, VOCAB, (size,), generator=g)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = (self.starts[i] + torch.arange(SEQ)) % VOCAB
        return {"input_ids": ids, "labels": ids.clone()}


class PrintSteps(TrainerCallback):  # type: ignore[misc]
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            print(f"step {state.global_step} loss {logs['loss']:.4f}", flush=True)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().cpu().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--iters", type=int, required=True, help="optimizer steps (the Trainer's max_steps)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", help="Trainer output (default: HOPS_CHECKPOINT_DIR/hf, else a temp dir)")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("HOPS_THREADS", "1")))
    base = os.environ.get("HOPS_CHECKPOINT_DIR")
    output_dir = args.output_dir or (os.path.join(base, "hf") if base else tempfile.mkdtemp())

    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    hops = HopsCallback(iters=args.iters)  # on more GPUs than the smallest count: fewer steps
    # on the CPU, one device: each step takes the samples of the attempt's GPUs together (per-device
    # batch x HOPS_WORLD_GPUS / HOPS_BASE_GPUS), so it does the work the master counts
    training = TrainingArguments(
        output_dir=output_dir,
        max_steps=args.iters,
        per_device_train_batch_size=hops.runtime.step_batch(args.batch_size),
        learning_rate=3e-3 * hops.runtime.lr_scale,
        logging_steps=1,
        save_strategy="no",  # hopsmgr asks for checkpoints when it needs one
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        data_seed=args.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Counting(256, args.seed),
        callbacks=[hops, PrintSteps()],
    )
    resume = hops.resume_checkpoint(output_dir)
    if resume is not None:
        print(f"resumed from {os.path.basename(resume)}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print(f"final step {trainer.state.global_step}", flush=True)
    print(f"final digest {digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
