"""Calibrate a server: run the kernels, keep the raw measurements, derive the scheduler's factors.

`run_calibration()` measures, on the node's GPUs (or its CPU when it has none): matmul TFLOP/s in fp32
and fp16/bf16, device memory bandwidth, host<->device bandwidth (GPU only), GPU-to-GPU copy bandwidth
between every pair (B_link; none with one GPU), TCP bandwidth to peer agents' probe ports (B_net),
data-loading samples/s and disk read bandwidth. The run is bounded by a budget: each kernel's timing
window and data sizes scale with it, and kernels that no longer fit are skipped with a note (the most
important run first). The result is a `CalibrationReport`; `report.factors()` is the heartbeat's
calibration dict (see hopsmgr_agent.nominal for what the factors are relative to).

Standalone: `python -m hopsmgr_agent.calibrate --device auto --budget 60 --json FILE` prints a table and
the wall time (bench/ uses it as calibration_s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any

from hopsmgr_agent import kernels
from hopsmgr_agent.devices import gpu_type_of
from hopsmgr_agent.nominal import DEFAULT_NET_GBPS, REFERENCE_DATA_PER_GPU, nominal_for
from hopsmgr_agent.probe import ProbeError, measure_peer, parse_peer

MIB = 1 << 20


class CalibrationError(RuntimeError):
    """Calibration cannot run here (no torch, no CUDA for a GPU run); the message says what to do."""


class Cancelled(Exception):
    """The caller asked the run to stop (the agent is shutting down)."""


@dataclass(frozen=True, slots=True)
class Measurement:
    kernel: str  # matmul_fp32 | matmul_fp16 | matmul_bf16 | memory_copy | h2d | d2h | d2d | net | data | disk
    device: str  # where it ran: "gpu" | "cpu"
    target: str  # "cuda:0", "cuda:0->cuda:1", "cpu", "host:port", a directory
    value: float
    unit: str  # "TFLOP/s" | "GB/s" | "samples/s"
    size: int  # matrix order, bytes moved per call, or batch size
    calls: int = 0


@dataclass(slots=True)
class CalibrationReport:
    device: str  # "gpu" | "cpu"
    gpu_type: str
    gpus: int
    device_names: list[str]
    budget_s: float
    torch_version: str = ""
    started_at: float = 0.0
    wall_s: float = 0.0
    cpu_cores: int = 1
    measurements: list[Measurement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return "measured-gpu" if self.device == "gpu" else "measured-cpu"

    def values(self, kernel: str) -> list[float]:
        return [m.value for m in self.measurements if m.kernel == kernel]

    def factors(self) -> dict[str, float]:
        """The heartbeat's calibration dict (protocol CALIBRATION_KEYS); a key is left out when its
        kernel did not run, so the master keeps its default for it (link_gbps with one GPU)."""
        out: dict[str, float] = {}
        nominal = nominal_for(self.gpu_type)
        if nominal is not None:
            ratios = []
            if fp32 := self.values("matmul_fp32"):
                ratios.append(fmean(fp32) / nominal.fp32_tflops)
            half = [fmean(v) for v in (self.values("matmul_fp16"), self.values("matmul_bf16")) if v]
            if half and nominal.fp16_tflops:
                ratios.append(max(half) / nominal.fp16_tflops)
            if ratios:
                out["compute_factor"] = math.prod(ratios) ** (1 / len(ratios))
            if memory := self.values("memory_copy"):
                out["memory_factor"] = fmean(memory) / nominal.memory_gbps
        if data := self.values("data"):
            out["data_factor"] = fmean(data) / max(1, self.gpus) / REFERENCE_DATA_PER_GPU
        if link := self.values("d2d"):
            out["link_gbps"] = min(link)  # a ring all-reduce runs at its slowest link
        net = self.values("net")
        # the fastest peer bounds this node's own link from below; slower ones are limited by their side
        out["net_gbps"] = max(net) if net else DEFAULT_NET_GBPS
        return {k: float(f"{v:.4g}") for k, v in out.items() if math.isfinite(v) and v > 0}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "source": self.source, "factors": self.factors()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CalibrationReport:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["measurements"] = [Measurement(**m) for m in data.get("measurements", [])]
        return cls(**fields)


class _Budget:
    """Deadline and sizes for one run: timing windows of 3% of the budget (0.1-2 s), sizes scaled by
    budget / 60 s (down to 1/8), and a stop flag checked between kernels."""

    def __init__(self, budget_s: float, cancel: threading.Event | None) -> None:
        self.budget_s = budget_s
        self.deadline = time.perf_counter() + budget_s
        self.cancel = cancel
        self.window_s = min(2.0, max(0.1, 0.03 * budget_s))
        self.scale = min(1.0, max(0.125, budget_s / 60.0))

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def allows(self, need_s: float) -> bool:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled
        return self.left() >= need_s

    def size(self, full_bytes: int, floor_bytes: int) -> int:
        return max(floor_bytes, int(full_bytes * self.scale) // MIB * MIB)


def load_torch() -> Any:
    # count GPUs as NVML does (PCI bus order), as the jobs' CUDA_VISIBLE_DEVICES does (set before CUDA starts)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    try:
        import torch
    except ImportError as exc:
        raise CalibrationError(
            "calibration needs PyTorch, which is not installed: pip install 'hopsmgr-agent[gpu]' "
            '(or set calibrate = "never" in the agent config)'
        ) from exc
    return torch


def run_calibration(
    device: str = "auto",
    budget_s: float = 60.0,
    *,
    gpu_type: str = "",
    workdir: str | None = None,
    peers: Sequence[tuple[str, int]] = (),
    cancel: threading.Event | None = None,
    torch: Any = None,
) -> CalibrationReport:
    """Run every kernel that fits in `budget_s` on `device` ("gpu", "cpu" or "auto": GPUs if torch sees
    any). `gpu_type` defaults to the first GPU's name mapped by devices.gpu_type_of, or "cpu"."""
    t0 = time.perf_counter()  # the wall time includes importing torch: part of what a node spends
    torch = load_torch() if torch is None else torch
    budget = _Budget(budget_s, cancel)
    has_cuda = bool(torch.cuda.is_available())
    if device == "auto":
        device = "gpu" if has_cuda else "cpu"
    if device == "gpu" and not has_cuda:
        raise CalibrationError(
            f"torch {torch.__version__} sees no CUDA GPU (a CPU-only build, or no driver): install a CUDA "
            'build of torch, or run with devices = "cpu"'
        )
    if device == "gpu":
        devs = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        names = [str(torch.cuda.get_device_name(d)) for d in devs]
    else:
        devs, names = [torch.device("cpu")], [_cpu_name()]
    report = CalibrationReport(
        device=device,
        gpu_type=gpu_type or (gpu_type_of(names[0]) if device == "gpu" else "cpu"),
        gpus=len(devs),
        device_names=names,
        budget_s=budget_s,
        torch_version=str(torch.__version__),
        started_at=time.time(),
        cpu_cores=kernels.usable_cores(),
    )
    steps: list[Callable[[], None]] = [
        lambda: _matmuls(torch, report, devs, budget),
        lambda: _memory(torch, report, devs, budget),
        lambda: _data(torch, report, budget),
        lambda: _network(report, peers, budget),
        lambda: _links(torch, report, devs, budget),
        lambda: _host_device(torch, report, devs, budget),
        lambda: _disk(report, workdir or tempfile.gettempdir(), budget),
    ]
    for step in steps:
        budget.allows(0.0)  # raises Cancelled when asked to stop
        step()
    if nominal_for(report.gpu_type) is None:
        report.notes.append(
            f"no datasheet figures for GPU type {report.gpu_type!r} (hopsmgr_agent.nominal): "
            "compute_factor and memory_factor are not reported"
        )
    report.wall_s = time.perf_counter() - t0
    return report


def _add(
    report: CalibrationReport, kernel: str, dev: Any, value: float, unit: str, size: int, calls: int
) -> None:
    label = "gpu" if getattr(dev, "type", "cpu") == "cuda" else "cpu"
    report.measurements.append(Measurement(kernel, label, str(dev), value, unit, size, calls))


def _skip(report: CalibrationReport, kernel: str, why: str) -> None:
    report.notes.append(f"{kernel}: skipped, {why}")


def _matmuls(torch: Any, report: CalibrationReport, devs: list[Any], budget: _Budget) -> None:
    gpu = report.device == "gpu"
    n = (8192 if budget.scale >= 0.5 else 4096) if gpu else (2048 if budget.scale >= 0.5 else 1024)
    dtypes: list[tuple[str, Any]] = [("fp32", torch.float32)]
    if gpu:
        dtypes.append(("fp16", torch.float16))
        if all(torch.cuda.get_device_capability(d)[0] >= 8 for d in devs):
            dtypes.append(("bf16", torch.bfloat16))
        else:
            _skip(report, "matmul_bf16", "needs compute capability 8.0 or newer")
    else:
        _skip(report, "matmul_fp16", "no fast fp16 matmul on CPUs")
        fast, half, full = kernels.cpu_half_is_fast(torch, torch.bfloat16)
        if fast:
            dtypes.append(("bf16", torch.bfloat16))
        else:
            _skip(report, "matmul_bf16", f"{half:.3g} TFLOP/s vs {full:.3g} in fp32: no native bf16 here")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, whatever the process set
    try:
        for name, dtype in dtypes:
            for dev in devs:
                if not budget.allows(budget.window_s):
                    _skip(report, f"matmul_{name}", "out of budget")
                    break
                tflops, calls = kernels.matmul_tflops(torch, dev, dtype, n, budget.window_s / len(devs))
                _add(report, f"matmul_{name}", dev, tflops, "TFLOP/s", n, calls)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _memory(torch: Any, report: CalibrationReport, devs: list[Any], budget: _Budget) -> None:
    nbytes = budget.size(1 << 30, 256 * MIB) if report.device == "gpu" else budget.size(256 * MIB, 32 * MIB)
    for dev in devs:
        if not budget.allows(budget.window_s):
            return _skip(report, "memory_copy", "out of budget")
        gbps, calls = kernels.memory_copy_gbps(torch, dev, nbytes, budget.window_s / len(devs))
        _add(report, "memory_copy", dev, gbps, "GB/s", 2 * nbytes, calls)
    return None


def _data(torch: Any, report: CalibrationReport, budget: _Budget) -> None:
    if not budget.allows(budget.window_s):
        return _skip(report, "data", "out of budget")
    per_core, calls = kernels.data_loading_per_core(torch, budget.window_s)
    cores = report.cpu_cores
    report.measurements.append(
        Measurement("data", "cpu", f"cpu x{cores}", per_core * cores, "samples/s", 32, calls)
    )
    return None


def _network(report: CalibrationReport, peers: Sequence[tuple[str, int]], budget: _Budget) -> None:
    nbytes = budget.size(64 * MIB, 8 * MIB)
    for host, port in peers:
        if not budget.allows(1.0):
            return _skip(report, f"net {host}:{port}", "out of budget")
        try:
            gbps = measure_peer(host, port, nbytes, timeout_s=min(30.0, max(1.0, budget.left())))
        except ProbeError as exc:
            report.notes.append(str(exc))
            continue
        report.measurements.append(Measurement("net", "cpu", f"{host}:{port}", gbps, "GB/s", nbytes, 1))
    if not peers:
        report.notes.append(f"net: no peers configured, net_gbps is the default {DEFAULT_NET_GBPS}")
    return None


def _links(torch: Any, report: CalibrationReport, devs: list[Any], budget: _Budget) -> None:
    if len(devs) < 2:
        return _skip(report, "d2d", "one device: no intra-node link to measure")
    pairs = [(a, b) for i, a in enumerate(devs) for b in devs[i + 1 :]]
    nbytes = budget.size(256 * MIB, 64 * MIB)
    for a, b in pairs:
        if not budget.allows(budget.window_s / len(pairs) + 0.05):
            return _skip(report, "d2d", "out of budget")
        gbps, calls = kernels.peer_copy_gbps(torch, a, b, nbytes, max(0.05, budget.window_s / len(pairs)))
        report.measurements.append(Measurement("d2d", "gpu", f"{a}->{b}", gbps, "GB/s", nbytes, calls))
    return None


def _host_device(torch: Any, report: CalibrationReport, devs: list[Any], budget: _Budget) -> None:
    if report.device != "gpu":
        return _skip(report, "h2d/d2h", "no GPU")
    nbytes = budget.size(256 * MIB, 64 * MIB)
    for dev in devs:
        if not budget.allows(budget.window_s / len(devs)):
            return _skip(report, "h2d/d2h", "out of budget")
        up, down, calls = kernels.host_device_gbps(torch, dev, nbytes, budget.window_s / len(devs))
        _add(report, "h2d", dev, up, "GB/s", nbytes, calls)
        _add(report, "d2h", dev, down, "GB/s", nbytes, calls)
    return None


def _disk(report: CalibrationReport, directory: str, budget: _Budget) -> None:
    if not budget.allows(2.0):
        return _skip(report, "disk", "out of budget")
    nbytes = budget.size(256 * MIB, 32 * MIB)
    try:
        gbps, dropped = kernels.disk_read_gbps(directory, nbytes)
    except OSError as exc:
        return _skip(report, "disk", f"cannot write a test file in {directory}: {exc}")
    report.measurements.append(Measurement("disk", "cpu", directory, gbps, "GB/s", nbytes, 1))
    if not dropped:
        report.notes.append("disk: the page cache could not be dropped; the read may come from memory")
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def render(report: CalibrationReport) -> str:
    rows = [f"{'kernel':<12} {'device':<6} {'target':<28} {'value':>12} {'unit':<10} {'size':>12}"]
    for m in report.measurements:
        rows.append(
            f"{m.kernel:<12} {m.device:<6} {m.target[:28]:<28} {m.value:>12.4g} {m.unit:<10} {m.size:>12}"
        )
    rows += [f"note: {n}" for n in report.notes]
    rows.append(f"factors ({report.source}, gpu_type {report.gpu_type}): {json.dumps(report.factors())}")
    rows.append(f"calibration_s: {report.wall_s:.2f} (wall time, budget {report.budget_s:g} s)")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hopsmgr_agent.calibrate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for the whole run (default 60)")
    parser.add_argument("--gpu-type", default="", help="GPU type name (default: from the device name)")
    parser.add_argument("--peer", action="append", default=[], help="another agent's probe port, host:port")
    parser.add_argument("--workdir", default=None, help="directory for the disk test (default: temp dir)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the raw report here")
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error("--budget must be > 0")
    try:
        peers = [parse_peer(p) for p in args.peer]
    except ValueError as exc:
        parser.error(f"--peer: {exc}")
    try:
        report = run_calibration(
            args.device, args.budget, gpu_type=args.gpu_type, workdir=args.workdir, peers=peers
        )
    except CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json:
        write_report(report, args.json)
    return 0


def write_report(report: CalibrationReport, path: str) -> None:
    """Write the raw report as JSON, atomically (a reader never sees half a file)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(report.to_json(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
