"""Where an event loop blocks: every callback that ran longer than a threshold, with the code it was in.

A benchmark aid (not product code). `watch(threshold_ms)` wraps asyncio's `Handle._run` to note when
each callback starts and starts a watcher thread that, whenever the current callback has run past the
threshold, records the main thread's stack once (the innermost frames of our code); when the callback
ends, its duration (wall and the loop thread's CPU time) is added to that record. `report()` gives the blocks grouped by where they were
caught, longest total first. The watcher needs the interpreter lock to look, which a blocking
callback hands over every switch interval (5 ms), so a block is caught a few ms after it passes the
threshold, never missed.
"""

from __future__ import annotations

import asyncio.events
import gc
import sys
import threading
import time
import traceback
from collections import defaultdict
from typing import Any

_current: list[Any] = [None, 0.0, None]  # handle, start, caught stack
_blocks: list[tuple[float, float, str]] = []  # wall ms, CPU ms of the loop's thread, where
_gc: dict[int, list[float]] = defaultdict(list)  # generation -> pause ms (collections on any thread)
_gc_start = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        _gc[info["generation"]].append((time.perf_counter() - _gc_start[0]) * 1000)


def _where(frame: Any) -> str:
    frames = [
        f for f in traceback.extract_stack(frame) if "/hopsmgr/" in f.filename or "/aiohttp/" in f.filename
    ]
    ours = [f for f in frames if "/hopsmgr/" in f.filename][-4:] or frames[-3:]
    return " < ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(ours))


def watch(threshold_ms: float = 20.0) -> None:
    main = threading.get_ident()
    original = asyncio.events.Handle._run
    threshold = threshold_ms / 1000

    def timed(self: Any) -> None:
        cpu = time.thread_time()
        _current[0], _current[1], _current[2] = self, time.perf_counter(), None
        try:
            original(self)
        finally:
            took = time.perf_counter() - _current[1]
            if took >= threshold:
                where = _current[2] or f"(not caught) {self!r}"[:160]
                _blocks.append((took * 1000, (time.thread_time() - cpu) * 1000, where))
            _current[0] = None

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    gc.callbacks.append(_on_gc)

    def watcher() -> None:
        while True:
            time.sleep(0.002)
            handle, start = _current[0], _current[1]
            if handle is not None and _current[2] is None and time.perf_counter() - start >= threshold:
                frame = sys._current_frames().get(main)
                if frame is not None and _current[0] is handle:
                    _current[2] = _where(frame)

    threading.Thread(target=watcher, name="loopwatch", daemon=True).start()


def reset() -> None:
    _blocks.clear()
    _gc.clear()


def report(top: int = 25) -> dict[str, Any]:
    by_place: dict[str, list[float]] = defaultdict(list)
    cpu_of: dict[str, float] = defaultdict(float)
    for ms, cpu_ms, place in _blocks:
        by_place[place].append(ms)
        cpu_of[place] += cpu_ms
    rows = sorted(by_place.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "blocks": len(_blocks),
        "blocked_ms": round(sum(b[0] for b in _blocks), 1),
        "blocked_cpu_ms": round(sum(b[1] for b in _blocks), 1),
        "gc": {
            f"gen{g}": {"count": len(v), "total_ms": round(sum(v), 1), "max_ms": round(max(v), 1)}
            for g, v in sorted(_gc.items())
        },
        "top": [
            {
                "where": place,
                "count": len(v),
                "total_ms": round(sum(v), 1),
                "cpu_ms": round(cpu_of[place], 1),
                "max_ms": round(max(v), 1),
            }
            for place, v in rows
        ],
    }
