"""Which NVIDIA device files an attempt must not open: the node's GPUs it was not granted.

The master grants GPUs by NVML index (the agent's discovery) and the wrapper hands them to the job as
CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER=PCI_BUS_ID, so that CUDA counts GPUs as NVML does: in PCI
bus order. The driver lists each GPU under /proc/driver/nvidia/gpus/<PCI bus id>/information with its
`Device Minor`, the minor number of its /dev/nvidia<minor> (major 195). Sorting those directories by
bus id gives NVML's order, so index i is the i-th minor. The control files (nvidiactl 195:255,
nvidia-modeset 195:254) and nvidia-uvm stay open: every CUDA process needs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NVIDIA_MAJOR = 195
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)


def minors_by_index(driver_gpus: Path = DRIVER_GPUS) -> list[int]:
    """The device minor of each GPU the driver lists, in NVML index order; [] without the driver."""
    try:
        entries = sorted(p for p in driver_gpus.iterdir() if p.is_dir())
    except OSError:
        return []
    minors = []
    for entry in entries:
        try:
            found = _MINOR.search((entry / "information").read_text())
        except OSError:
            continue
        if found:
            minors.append(int(found.group(1)))
    return minors


@dataclass(frozen=True)
class DeviceRules:
    """The device numbers to deny, and a line for the job's log saying what is enforced."""

    deny: tuple[tuple[int, int], ...]
    note: str


def rules_for(env: Mapping[str, str], driver_gpus: Path = DRIVER_GPUS) -> DeviceRules:
    """The rules for a job whose environment is `env` (the spec's, with the grant)."""
    minors = minors_by_index(driver_gpus)
    if not minors:
        return DeviceRules((), "")  # no NVIDIA driver here: nothing to restrict
    granted = env.get("CUDA_VISIBLE_DEVICES")
    if granted is None:
        return DeviceRules((), "hopsmgr: no GPUs named for this attempt: the node's GPUs are not restricted")
    ids = [part.strip() for part in granted.split(",") if part.strip()]
    if not all(part.isdigit() and int(part) < len(minors) for part in ids):
        return DeviceRules(
            (),
            f"hopsmgr: GPUs {granted!r} are not indices of this node's {len(minors)} GPUs: only "
            "CUDA_VISIBLE_DEVICES restricts them",
        )
    allowed = {minors[int(part)] for part in ids}
    deny = tuple((NVIDIA_MAJOR, m) for m in minors if m not in allowed)
    return DeviceRules(deny, "")
