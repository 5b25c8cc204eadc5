"""GPU discovery through NVML (nvidia-ml-py): what GPUs this server has and how they are connected.

`discover()` returns an `Inventory`: per GPU its name, UUID, memory, PCI bus id, compute capability and
current utilisation, and between GPUs the NVLink links (direct, or through an NVSwitch) and the PCIe
topology level of their closest common ancestor. Queries a driver or GPU does not support
(NVMLError_NotSupported and friends) are recorded as unknown, never fatal. NVML that is missing
altogether (no bindings, no driver, no GPU) raises `DeviceError` with what is missing and what to do.

`pynvml` is imported lazily, and the NVML module is a parameter: unit tests pass a fake module, which is
the only place where this agent fakes hardware. `gpu_type_of()` maps a device name reported by NVML or
torch ("NVIDIA A100-SXM4-80GB") to a hopsmgr GPU type name ("a100").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

_TOPOLOGY = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}
# Form factor, memory size and packaging words that do not change the GPU type: "SXM4", "PCIE", "80GB", ...
_VARIANT = re.compile(r"sxm\d*|pcie|\d+gb|nvl|hbm\d*e?|mig.*|\(tm\)")
_SUGGEST = (
    'On a machine without NVIDIA GPUs set devices = "emulated" (demos and tests) or devices = "cpu" '
    "(CPU-only work) in the agent config."
)


class DeviceError(RuntimeError):
    """GPU discovery cannot run here; the message says what is missing and what to do."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    pci_bus_id: str
    compute_capability: tuple[int, int] | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    memory_used_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    """This server's GPUs as NVML sees them."""

    driver_version: str
    gpus: tuple[GpuInfo, ...]
    # (i, j) with i < j -> active NVLink links joining GPU i and GPU j directly
    nvlink_pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    # GPU index -> active NVLink links to something that is not a GPU here (an NVSwitch)
    nvswitch_links: dict[int, int] = field(default_factory=dict)
    # (i, j) with i < j -> closest common ancestor: internal|single|multiple|hostbridge|node|system
    topology: dict[tuple[int, int], str] = field(default_factory=dict)

    @property
    def gpu_type(self) -> str:
        """The hopsmgr type of this server's GPUs (a server is scheduled as one GPU type)."""
        types = {gpu_type_of(g.name) for g in self.gpus}
        if len(types) != 1:
            names = ", ".join(sorted({g.name for g in self.gpus}))
            raise DeviceError(
                f"this server mixes GPU models ({names}); hopsmgr schedules a server as one GPU type: "
                'set gpu_type = "..." in the agent config to name the type to report'
            )
        return types.pop()

    def nvlinked(self, i: int, j: int) -> bool:
        """Whether GPUs i and j reach each other over NVLink (directly or through NVSwitches)."""
        pair = (min(i, j), max(i, j))
        if self.nvlink_pairs.get(pair, 0) > 0:
            return True
        return self.nvswitch_links.get(i, 0) > 0 and self.nvswitch_links.get(j, 0) > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "gpus": [asdict(g) for g in self.gpus],
            "nvlink_pairs": {f"{i}-{j}": n for (i, j), n in sorted(self.nvlink_pairs.items())},
            "nvswitch_links": {str(i): n for i, n in sorted(self.nvswitch_links.items())},
            "topology": {f"{i}-{j}": t for (i, j), t in sorted(self.topology.items())},
        }


def gpu_type_of(name: str) -> str:
    """A device name as NVML or torch reports it -> the hopsmgr GPU type name.

    Lowercase; vendor and product-line words dropped ("NVIDIA", "Tesla", "GeForce", "Quadro"); form factor,
    memory size and packaging dropped ("SXM2", "PCIE", "16GB", "HBM3", "NVL"); the rest joined:
    "NVIDIA H200" -> "h200", "Tesla V100-SXM2-16GB" -> "v100", "NVIDIA GeForce RTX 3090" -> "rtx3090",
    "NVIDIA GeForce GTX 1080 Ti" -> "gtx1080ti", "NVIDIA TITAN Xp" -> "titanxp".
    """
    words = [w for w in re.split(r"[\s_-]+", name.strip().lower()) if w]
    kept = [w for w in words if w not in _VENDOR_WORDS and not _VARIANT.fullmatch(w)]
    result = re.sub(r"[^a-z0-9.]", "", "".join(kept))
    return (result or re.sub(r"[^a-z0-9.]", "", name.lower()) or "gpu")[:64]


def load_nvml() -> Any:
    """Import the NVML bindings, or explain what to install."""
    try:
        import pynvml
    except ImportError as exc:
        raise DeviceError(
            'devices = "nvml" needs NVIDIA\'s NVML Python bindings, which are not installed: pip install '
            f"nvidia-ml-py (or the agent's [gpu] extra). {_SUGGEST}"
        ) from exc
    return pynvml


def discover(nvml: Any | None = None) -> Inventory:
    """Query NVML for this server's GPUs. `nvml` defaults to the real `pynvml` module."""
    nvml = load_nvml() if nvml is None else nvml
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as exc:
        raise DeviceError(
            f"NVML could not start ({type(exc).__name__}: {exc}): the NVIDIA driver and its library "
            f"libnvidia-ml.so.1 must be installed and loaded (check with nvidia-smi). {_SUGGEST}"
        ) from exc
    try:
        return _inventory(nvml, error)
    except error as exc:
        raise DeviceError(f"NVML query failed ({type(exc).__name__}: {exc}). {_SUGGEST}") from exc
    finally:
        _optional(nvml, error, lambda: nvml.nvmlShutdown())


def _inventory(nvml: Any, error: type[BaseException]) -> Inventory:
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        raise DeviceError(f"NVML is working but finds no GPU on this machine. {_SUGGEST}")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus = tuple(_gpu(nvml, error, i, h) for i, h in enumerate(handles))
    by_bus = {_bus_key(g.pci_bus_id): g.index for g in gpus}
    pairs: dict[tuple[int, int], int] = {}
    switch: dict[int, int] = {}
    for gpu, handle in zip(gpus, handles, strict=True):
        for remote in _nvlink_remotes(nvml, error, handle):
            peer = by_bus.get(_bus_key(remote))
            if peer is None:
                switch[gpu.index] = switch.get(gpu.index, 0) + 1
            elif peer != gpu.index:
                key = (min(gpu.index, peer), max(gpu.index, peer))
                pairs[key] = pairs.get(key, 0) + 1
    # each direct link is seen from both of its ends
    nvlink_pairs = {k: (n + 1) // 2 for k, n in pairs.items()}
    topology: dict[tuple[int, int], str] = {}
    for i in range(count):
        for j in range(i + 1, count):
            level = _optional(
                nvml, error, lambda i=i, j=j: nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
            )
            if level is not None:
                topology[(i, j)] = _TOPOLOGY.get(int(level), str(level))
    driver = _optional(nvml, error, lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    return Inventory(str(driver or ""), gpus, nvlink_pairs, switch, topology)


def _gpu(nvml: Any, error: type[BaseException], index: int, handle: Any) -> GpuInfo:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    cc = _optional(nvml, error, lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    util = _optional(nvml, error, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    pci = _optional(nvml, error, lambda: nvml.nvmlDeviceGetPciInfo(handle))
    return GpuInfo(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=str(_optional(nvml, error, lambda: _text(nvml.nvmlDeviceGetUUID(handle))) or ""),
        memory_total_bytes=int(memory.total),
        pci_bus_id=_text(pci.busId) if pci is not None else "",
        compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
        utilization_gpu_pct=float(util.gpu) if util is not None else None,
        utilization_memory_pct=float(util.memory) if util is not None else None,
        memory_used_bytes=int(memory.used) if getattr(memory, "used", None) is not None else None,
    )


def _nvlink_remotes(nvml: Any, error: type[BaseException], handle: Any) -> Iterable[str]:
    """PCI bus ids at the far end of each active NVLink link of one GPU (none where NVLink is absent)."""
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except AttributeError:
            return  # bindings without NVLink queries
        except error as exc:
            if _unsupported(nvml, exc) or _invalid(nvml, exc) or _missing_function(nvml, exc):
                return  # no NVLink on this GPU, or no link with this number: links are numbered densely
            raise
        if state != enabled:
            continue
        remote = _optional(nvml, error, lambda link=link: nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
        yield _text(remote.busId) if remote is not None else f"unknown-{link}"


def _optional(nvml: Any, error: type[BaseException], query: Any) -> Any:
    """Run one NVML query; None where the GPU, the driver or the bindings do not support it."""
    try:
        return query()
    except AttributeError:
        return None
    except error as exc:
        if _unsupported(nvml, exc) or _invalid(nvml, exc) or _missing_function(nvml, exc):
            return None
        raise


def _unsupported(nvml: Any, exc: BaseException) -> bool:
    cls = getattr(nvml, "NVMLError_NotSupported", None)
    return cls is not None and isinstance(exc, cls)


def _invalid(nvml: Any, exc: BaseException) -> bool:
    cls = getattr(nvml, "NVMLError_InvalidArgument", None)
    return cls is not None and isinstance(exc, cls)


def _missing_function(nvml: Any, exc: BaseException) -> bool:
    cls = getattr(nvml, "NVMLError_FunctionNotFound", None)
    return cls is not None and isinstance(exc, cls)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus_key(bus_id: str) -> str:
    """Normalise a PCI bus id ("00000000:17:00.0", "0000:17:00.0") to compare NVML's two spellings."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)", bus_id.strip())
    if m is None:
        return bus_id.strip().lower()
    domain, bus, dev, fn = (int(x or "0", 16) for x in m.groups())
    return f"{domain:x}:{bus:x}:{dev:x}.{fn:x}"
