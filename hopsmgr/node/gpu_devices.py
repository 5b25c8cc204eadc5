"""Which NVIDIA device files an isolated attempt must not open: every GPU of the node it was not granted.

The master grants GPUs by NVML index (the agent's discovery) and the wrapper hands them to the job as
CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER=PCI_BUS_ID, so that CUDA counts GPUs as NVML does: in PCI
bus order. The driver lists each GPU under /proc/driver/nvidia/gpus/<PCI bus id>/information with its
`Device Minor`, the minor number of its /dev/nvidia<minor> (major 195), and whether it is excluded
(NVML does not count an excluded GPU). The node's GPUs that NVML counts, in bus order, give index i's
minor. The control files (nvidiactl 195:255, nvidia-modeset 195:254) and nvidia-uvm stay open: every
CUDA process needs them.

Fail closed: a grant that cannot be mapped exactly (no grant, an id that is not an index of the node's
GPUs, a listing entry that cannot be read) fences off every GPU minor. Once the other GPUs' files are
denied, CUDA counts only the GPUs it can open, from 0 (as under Slurm's ConstrainDevices): the job's
CUDA_VISIBLE_DEVICES becomes the granted GPUs' positions among themselves (`visible`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NVIDIA_MAJOR = 195
GPU_MINORS = range(0, 254)  # 254 is nvidia-modeset, 255 nvidiactl
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
_EXCLUDED = re.compile(r"^GPU Excluded:\s*Yes\s*$", re.MULTILINE | re.IGNORECASE)


class ListingError(ValueError):
    """The driver's listing of the node's GPUs cannot be read exactly."""


@dataclass(frozen=True)
class NodeGpus:
    counted: tuple[int, ...]  # minors of the GPUs NVML counts, in index order
    excluded: tuple[int, ...]  # minors of GPUs the driver lists as excluded (no index)


def _bus_key(name: str) -> tuple[int, ...]:
    """A PCI bus id `dddd:bb:dd.f` as numbers (its order is the bus order)."""
    try:
        return tuple(int(part, 16) for part in re.split(r"[:.]", name))
    except ValueError:
        raise ListingError(f"{name!r} is not a PCI bus id") from None


def node_gpus(driver_gpus: Path = DRIVER_GPUS) -> NodeGpus | None:
    """The node's GPUs as the driver lists them; None without a listing (no NVIDIA driver here);
    ListingError when an entry cannot be read."""
    try:
        entries = [p for p in driver_gpus.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ListingError(f"{driver_gpus}: {exc.strerror or exc}") from None
    counted: list[int] = []
    excluded: list[int] = []
    for entry in sorted(entries, key=lambda p: _bus_key(p.name)):
        try:
            text = (entry / "information").read_text()
        except OSError as exc:
            raise ListingError(f"{entry}/information: {exc.strerror or exc}") from None
        found = _MINOR.search(text)
        if not found:
            raise ListingError(f"{entry}/information names no Device Minor")
        (excluded if _EXCLUDED.search(text) else counted).append(int(found.group(1)))
    return NodeGpus(tuple(counted), tuple(excluded))


@dataclass(frozen=True)
class DeviceRules:
    """The device numbers to deny, the job's CUDA_VISIBLE_DEVICES once they are denied, and a line for
    the job's log when its grant could not be mapped."""

    deny: tuple[tuple[int, int], ...]
    visible: str | None
    note: str


NO_RULES = DeviceRules((), None, "")


def rules_for(env: Mapping[str, str], driver_gpus: Path = DRIVER_GPUS) -> DeviceRules:
    """The rules for a job whose environment is `env` (the spec's, with the grant)."""
    granted = env.get("CUDA_VISIBLE_DEVICES")
    try:
        gpus = node_gpus(driver_gpus)
    except ListingError as exc:
        return _all_fenced(f"the node's GPU listing cannot be read ({exc})")
    if gpus is None or not (gpus.counted or gpus.excluded):
        return NO_RULES  # no NVIDIA driver here: nothing to fence
    if granted is None or not granted.strip():  # "": granted none (a node of slots, not GPUs)
        return _all_fenced("no GPUs were granted to this attempt")
    ids = [part.strip() for part in granted.split(",")]
    indices = [int(part) for part in ids if part.isascii() and part.isdigit()]
    if len(indices) != len(ids) or len(set(indices)) != len(indices) or max(indices) >= len(gpus.counted):
        return _all_fenced(f"GPUs {granted!r} are not indices of this node's {len(gpus.counted)} GPUs")
    allowed = {gpus.counted[i] for i in indices}
    deny = tuple((NVIDIA_MAJOR, m) for m in (*gpus.counted, *gpus.excluded) if m not in allowed)
    # CUDA then counts the granted GPUs alone, in bus (= index) order, from 0
    position = {i: k for k, i in enumerate(sorted(indices))}
    return DeviceRules(deny, ",".join(str(position[i]) for i in indices), "")


def _all_fenced(why: str) -> DeviceRules:
    return DeviceRules(
        tuple((NVIDIA_MAJOR, m) for m in GPU_MINORS),
        "",
        f"hopsmgr: {why}: every GPU of the node is fenced off for it",
    )
