"""A tiny transformer language model trained with torch under hopsmgr: AdamW, dropout, exact resume.

A 2-layer, 2-head causal transformer (embedding 64, vocabulary 128, sequences of 32 tokens; torch's
`nn.TransformerEncoder` with a causal mask) learns synthetic sequences: each one counts from a random
start in a random stride, modulo the vocabulary, so the next token is predictable once the model has
seen two. The batch of iteration `i` comes from a generator seeded with (seed, i) alone, so the data
does not depend on where a run started. Dropout draws from torch's global RNG, whose state goes into
the checkpoint with the model and the AdamW state, so an interrupted and resumed run ends with the
same parameters, bit for bit, as an uninterrupted one on the same hardware and software; "final
digest" (the sha256 of the parameter bytes) shows it.

    python examples/lm_train.py --iters 200 --batch-size 16

Runs on the GPU when CUDA is available (under hopsmgr, only when the node gave the job its devices
through CUDA_VISIBLE_DEVICES), else on the CPU with `--threads` threads (default `HOPS_THREADS`, else 1).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hopsmgr import runtime

VOCAB = 128
SEQ = 32
DIM = 64
HEADS = 2
LAYERS = 2
MAX_STRIDE = 8


class TinyLM(nn.Module):
    """Token and position embeddings, a causal pre-norm transformer encoder, a linear head."""

    mask: torch.Tensor

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.positions = nn.Parameter(0.02 * torch.randn(SEQ, DIM))
        layer = nn.TransformerEncoderLayer(
            DIM, HEADS, dim_feedforward=4 * DIM, dropout=dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.tokens(tokens) + self.positions[:n]
        x = self.encoder(x, mask=self.mask[:n, :n], is_causal=True)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def generator(seed: int, stream: str, index: int) -> torch.Generator:
    """A CPU generator that depends only on (seed, stream, index)."""
    key = hashlib.sha256(f"{seed}:{stream}:{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))


def make_batch(seed: int, iteration: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of `iteration` (on the CPU): inputs and next-token targets, each batch_size x SEQ."""
    g = generator(seed, "batch", iteration)
    start = torch.randint(0, VOCAB, (batch_size, 1), generator=g)
    stride = torch.randint(1, MAX_STRIDE + 1, (batch_size, 1), generator=g)
    seqs = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return seqs[:, :-1], seqs[:, 1:]


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


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """On CUDA, the math attention kernel: the fused ones' backward passes may not be deterministic."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


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
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate before HOPS_LR_SCALE")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
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
    model = TinyLM(args.dropout).to(device)
    # one process on one device: each step takes the samples of the attempt's GPUs together (the
    # per-GPU batch x HOPS_WORLD_GPUS / HOPS_BASE_GPUS), so it does the work the master counts
    batch = rt.step_batch(args.batch_size)
    lr = args.lr * rt.lr_scale
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=args.weight_decay)
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
            inputs, targets = make_batch(args.seed, it, batch)
            inputs, targets = inputs.to(device), targets.to(device)
            sync()
        with attention_kernels(device):
            with rt.phase("forward"):
                logits = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
                sync()
            with rt.phase("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                sync()
        with rt.phase("update"):
            if args.clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip)
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
