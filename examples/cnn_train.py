"""A small CNN trained with torch under hopsmgr: synthetic images, SGD with momentum, exact resume.

Two strided 3x3 convolutions and a linear layer classify synthetic 3x32x32 images into 10 classes:
each class has a fixed random template, and every image is a faint copy of its class's template in
noise. The batch of iteration `i` comes from a generator seeded with (seed, i) alone, so the data
does not depend on where a run started. Each iteration is timed in the runtime's phases (data,
forward, backward, update). A checkpoint (taken when hopsmgr asks for one) holds the model, the
optimizer, the RNG states and the last loss, so an interrupted and resumed run ends with the same
parameters, bit for bit, as an uninterrupted one on the same hardware and software; "final digest"
(the sha256 of the parameter bytes) shows it.

    python examples/cnn_train.py --iters 200 --batch-size 32

Runs on the GPU when CUDA is available (under hopsmgr, only when the node gave the job its devices
through CUDA_VISIBLE_DEVICES), else on the CPU with `--threads` threads (default `HOPS_THREADS`, else 1).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hopsmgr import runtime

CLASSES = 10
IMAGE = (3, 32, 32)


class SmallCNN(nn.Module):
    """conv(3->16, stride 2) -> ReLU -> conv(16->32, stride 2) -> ReLU -> linear(32*8*8 -> classes)."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(IMAGE[0], 16, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1)
        self.fc = nn.Linear(32 * (IMAGE[1] // 4) * (IMAGE[2] // 4), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        logits: torch.Tensor = self.fc(x.flatten(1))
        return logits


def generator(seed: int, stream: str, index: int) -> torch.Generator:
    """A CPU generator that depends only on (seed, stream, index)."""
    key = hashlib.sha256(f"{seed}:{stream}:{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))


def class_templates(seed: int) -> torch.Tensor:
    """One fixed random image per class."""
    return torch.randn((CLASSES, *IMAGE), generator=generator(seed, "templates", 0))


def make_batch(
    templates: torch.Tensor, seed: int, iteration: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of `iteration`: class templates plus noise, and their labels (on the CPU)."""
    g = generator(seed, "batch", iteration)
    labels = torch.randint(0, CLASSES, (batch_size,), generator=g)
    images = 0.25 * templates[labels] + torch.randn((batch_size, *IMAGE), generator=g)
    return images, labels


def pick_device(choice: str) -> torch.device:
    """`auto`: CUDA when available (under hopsmgr only with devices it assigned), else the CPU."""
    if choice != "auto":
        return torch.device(choice)
    assigned = not os.environ.get("HOPS_JOB_ID") or bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return torch.device("cuda" if assigned and torch.cuda.is_available() else "cpu")


def make_deterministic(device: torch.device, threads: int) -> None:
    """`threads` CPU threads and deterministic kernels only."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS first starts
    torch.set_num_threads(threads)
    # = torch.use_deterministic_algorithms(True), without importing the compiler's config (~1 s)
    torch.set_deterministic_debug_mode("error")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True


def to_cpu(obj: Any) -> Any:
    """`obj` with every tensor copied to the CPU, so a checkpoint loads on any device."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def digest(model: nn.Module) -> str:
    """sha256 of the raw bytes of all parameters, in `model.parameters()` order."""
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().cpu().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--iters",
        type=int,
        required=True,
        help="total iterations of the job, counted at its smallest GPU count",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01, help="learning rate before HOPS_LR_SCALE")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N iterations (0: never)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("HOPS_THREADS", "1")),
        help="CPU threads (default: HOPS_THREADS, else 1); results are bit-exact only for the same count",
    )
    args = p.parse_args(argv)
    if args.iters < 0 or args.batch_size < 1 or args.threads < 1:
        p.error("--iters must be >= 0, --batch-size and --threads >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rt = runtime.init()
    device = pick_device(args.device)
    make_deterministic(device, args.threads)
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"device {device}{name}", flush=True)
    sync: Callable[[], None] = runtime.cuda_sync if device.type == "cuda" else lambda: None

    torch.manual_seed(args.seed)
    model = SmallCNN().to(device)
    # one process on one device: each step takes the samples of the attempt's GPUs together (the
    # per-GPU batch x HOPS_WORLD_GPUS / HOPS_BASE_GPUS), so it does the work the master counts
    batch = rt.step_batch(args.batch_size)
    lr = args.lr * rt.lr_scale
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    templates = class_templates(args.seed)
    last_loss: torch.Tensor | float = float("nan")

    start, state = rt.resume()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        last_loss = float(state["loss"])
        print(f"resumed at iteration {start}", flush=True)
    for group in optimizer.param_groups:  # this attempt's scale, not the checkpoint's
        group["lr"] = lr

    def snapshot() -> dict[str, Any]:
        return {
            "iteration": rt.iteration,
            "model": to_cpu(model.state_dict()),
            "optimizer": to_cpu(optimizer.state_dict()),
            "rng": rng_state(),
            "loss": float(last_loss),
        }

    model.train()
    # rt.work counts iterations at the smallest GPU count (on more GPUs a step does more of them);
    # in profile mode step() exits 0 once the profile is written, whatever --iters says
    while not rt.done(args.iters) or rt.mode == "profile":
        it = rt.iteration
        with rt.phase("data"):
            images, labels = make_batch(templates, args.seed, it, batch)
            images, labels = images.to(device), labels.to(device)
            sync()
        with rt.phase("forward"):
            loss = F.cross_entropy(model(images), labels)
            sync()
        with rt.phase("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            sync()
        with rt.phase("update"):
            optimizer.step()
            sync()
        last_loss = loss.detach()
        if args.log_every > 0 and (it + 1) % args.log_every == 0:
            print(f"iter {it + 1} loss {last_loss.item():.4f}", flush=True)
        rt.step(samples=batch, state=snapshot)
    rt.finish()
    print(f"final loss {float(last_loss):.6f}", flush=True)
    print(f"final digest {digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
