"""A fake NVML module for discovery tests: the one place where the agent's tests stand in for hardware.

It implements the subset of pynvml that hopsmgr_agent.devices calls, with pynvml's names and error classes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class FakeNVML:
    """The subset of pynvml that discovery uses, over a described set of GPUs.

    `gpus`: (name, PCI bus id); `links`: per GPU, the bus id at the far end of each NVLink link (None:
    NVLink not supported on that GPU); `topology`: NVML common-ancestor level per pair, absent = unsupported.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(
        self,
        gpus: list[tuple[str, str]],
        links: list[list[str] | None] | None = None,
        topology: dict[tuple[int, int], int] | None = None,
        init_error: Exception | None = None,
    ) -> None:
        self.gpus = gpus
        self.links = links or [None] * len(gpus)
        self.topology = topology or {}
        self.init_error = init_error
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h][0]

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08x}-fake"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=141 << 30, used=(1 << 30) * h, free=0)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h][1].encode())

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=10 * h, memory=5 * h)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        remotes = self.links[h]
        if remotes is None:
            raise NVMLError_NotSupported()
        if link >= len(remotes):
            raise NVMLError_InvalidArgument()
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        remotes = self.links[h]
        assert remotes is not None
        return SimpleNamespace(busId=remotes[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        if (a, b) not in self.topology:
            raise NVMLError_NotSupported()
        return self.topology[(a, b)]


BUS = ["00000000:19:00.0", "00000000:3B:00.0"]
