"""The dashboard's memory of the recent past: GPUs used per tenant and RAQLR, sampled every few seconds.

Kept in the master's memory (the last `KEEP` samples, a few hours), for the "usage over time" and
"RAQLR over time" charts; the pages filter it by the tenants the API shows the viewer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from hopsmgr.master.controller import Controller
from hopsmgr.master.views import current_raqlr, used_gpus

SAMPLE_S = 10.0
KEEP = 1080  # three hours at SAMPLE_S


@dataclass(frozen=True, slots=True)
class Sample:
    time: float
    raqlr: float | None
    used: dict[str, int]  # GPUs held per tenant


class History:
    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=KEEP)

    def sample(self, ctl: Controller) -> None:
        held = used_gpus(ctl)
        used = {name: held.get(name, 0) for name in sorted(ctl.state.tenants)}
        self.samples.append(Sample(ctl.clock(), current_raqlr(ctl), used))

    def series(self, tenant: str) -> list[tuple[float, float]]:
        return [(s.time, float(s.used.get(tenant, 0))) for s in self.samples]

    def raqlr(self) -> list[tuple[float, float]]:
        return [(s.time, s.raqlr) for s in self.samples if s.raqlr is not None]


def sampler(ctl: Controller, history: History, every_s: float = SAMPLE_S) -> object:
    """An aiohttp cleanup context: samples `ctl` into `history` while the app runs."""

    async def run() -> None:
        while True:
            history.sample(ctl)
            await asyncio.sleep(every_s)

    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context
