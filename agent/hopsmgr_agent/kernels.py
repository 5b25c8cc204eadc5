"""The calibration kernels: small, timed torch workloads, each returning one number.

Every kernel allocates its data first, runs once to warm up (allocator, kernel selection, caches), then is
timed in three short windows of repeated calls; the best window counts (interference only ever slows a
kernel down). On a GPU each window ends with torch.cuda.synchronize, so queued work is included.
`torch` is passed in by the caller (imported lazily there), so importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

ROUNDS = 3  # timing windows per kernel; the fastest counts


def timed(fn: Callable[[], object], sync: Callable[[], object], window_s: float) -> tuple[float, int]:
    """Seconds per call of `fn` (best of ROUNDS windows of about window_s / ROUNDS each) and calls timed."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-7)
    per_round = max(1, min(100_000, int(window_s / ROUNDS / once)))
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / per_round)
    return best, 2 + ROUNDS * per_round


def syncer(torch: Any, dev: Any) -> Callable[[], object]:
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def matmul_tflops(torch: Any, dev: Any, dtype: Any, n: int, window_s: float) -> tuple[float, int]:
    """n x n matrix product: 2 n^3 floating-point operations per call -> TFLOP/s."""
    a = torch.randn(n, n, device=dev, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device=dev, dtype=torch.float32).to(dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    seconds, calls = timed(lambda: torch.mm(a, b, out=c), syncer(torch, dev), window_s)
    return 2.0 * n**3 / seconds / 1e12, calls


def cpu_half_is_fast(torch: Any, dtype: Any) -> tuple[bool, float, float]:
    """Whether the CPU has a native path for `dtype` matmul (at least half the fp32 rate), and both rates."""
    half, _ = matmul_tflops(torch, torch.device("cpu"), dtype, 512, 0.15)
    full, _ = matmul_tflops(torch, torch.device("cpu"), torch.float32, 512, 0.15)
    return half >= 0.5 * full, half, full


def memory_copy_gbps(torch: Any, dev: Any, nbytes: int, window_s: float) -> tuple[float, int]:
    """Copy one large tensor into another: each call reads and writes nbytes -> GB/s of traffic."""
    src = torch.ones(nbytes // 4, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds, calls = timed(lambda: dst.copy_(src), syncer(torch, dev), window_s)
    return 2.0 * src.numel() * 4 / seconds / 1e9, calls


def host_device_gbps(torch: Any, dev: Any, nbytes: int, window_s: float) -> tuple[float, float, int]:
    """Pinned host memory <-> GPU copies: (host-to-device GB/s, device-to-host GB/s, calls)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    sync = syncer(torch, dev)
    up, calls_up = timed(lambda: device.copy_(host, non_blocking=True), sync, window_s / 2)
    down, calls_down = timed(lambda: host.copy_(device, non_blocking=True), sync, window_s / 2)
    return nbytes / up / 1e9, nbytes / down / 1e9, calls_up + calls_down


def peer_copy_gbps(torch: Any, src_dev: Any, dst_dev: Any, nbytes: int, window_s: float) -> tuple[float, int]:
    """GPU-to-GPU copy (peer-to-peer where the driver allows, else through the host) -> GB/s."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=src_dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dst_dev)

    def sync() -> None:
        torch.cuda.synchronize(src_dev)
        torch.cuda.synchronize(dst_dev)

    seconds, calls = timed(lambda: dst.copy_(src), sync, window_s)
    return nbytes / seconds / 1e9, calls


@contextlib.contextmanager
def _one_thread(torch: Any) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def data_loading_per_core(torch: Any, window_s: float, batch: int = 32) -> tuple[float, int]:
    """Samples/s that one CPU core turns decoded uint8 images into a training batch.

    Per sample: a random 224x224 crop of a 3x256x256 image and a random horizontal flip; per batch: uint8
    to float, scale to [0, 1], normalise with the ImageNet mean and std. One thread, as in one DataLoader
    worker; the node's rate is this times its usable cores (workers scale about linearly until memory
    bandwidth runs out). JPEG decoding itself is not included: it needs image libraries the agent lacks.
    """
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, 256, 256), dtype=torch.uint8, generator=gen)
    crops = torch.empty(batch, 3, 224, 224, dtype=torch.uint8)
    out = torch.empty(batch, 3, 224, 224, dtype=torch.float32)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

    def step() -> None:
        ys = torch.randint(0, 33, (batch,), generator=gen).tolist()
        xs = torch.randint(0, 33, (batch,), generator=gen).tolist()
        flips = (torch.rand(batch, generator=gen) < 0.5).tolist()
        for k in range(batch):
            crop = images[k, :, ys[k] : ys[k] + 224, xs[k] : xs[k] + 224]
            crops[k].copy_(crop.flip(-1) if flips[k] else crop)
        out.copy_(crops)
        out.div_(255.0).sub_(mean).div_(std)

    with _one_thread(torch):
        seconds, calls = timed(step, lambda: None, window_s)
    return batch / seconds, calls


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def disk_read_gbps(directory: str, nbytes: int) -> tuple[float, bool]:
    """Write nbytes to a temporary file in `directory`, fsync, drop it from the page cache where the OS
    allows (posix_fadvise DONTNEED), and time reading it back: (GB/s, whether the cache was dropped)."""
    os.makedirs(directory, exist_ok=True)
    block = os.urandom(8 << 20)
    fd, path = tempfile.mkstemp(prefix=".calibration-", dir=directory)
    try:
        left = nbytes
        while left:
            left -= os.write(fd, block[: min(left, len(block))])
        os.fsync(fd)
        dropped = False
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped = True
        os.lseek(fd, 0, os.SEEK_SET)
        buf = bytearray(len(block))
        view = memoryview(buf)
        t0 = time.perf_counter()
        total = 0
        while True:
            got = os.readv(fd, [view])
            if got == 0:
                break
            total += got
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return total / max(elapsed, 1e-9) / 1e9, dropped
