"""The master's figures: CPU and memory from /proc, /metrics values, and what its store and log recorded.

Part of bench/master_load.py (run that script, not this module). Helpers that turn what the master
left behind into flat result fields: its CPU seconds and memory (`proc_cpu_s`, `proc_status_mb`),
values of its /metrics text (`metric`), how its attempts ended (`ended_attempts`, from its SQLite
store), its warning and error log events (`log_events`) and its event-loop blocks of phase 2
(`loop_blocks`, from bench/loopwatch.py's report).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def proc_status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def metric(text: str, name: str, quantile: str | None = None) -> float | None:
    label = re.escape(f'{{quantile="{quantile}"}}') if quantile else ""
    match = re.search(rf"^{re.escape(name)}{label} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def ended_attempts(db: Path) -> dict[str, int]:
    """How the master recorded the attempts' ends (read from its store after it stopped)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            sql = "SELECT coalesce(end_reason, 'open'), count(*) FROM attempts GROUP BY 1 ORDER BY 1"
            return {f"attempts_{reason}": n for reason, n in conn.execute(sql)}
    except sqlite3.Error as exc:
        print(f"warning: cannot read {db}: {exc}", file=sys.stderr)
        return {}


def log_events(path: Path) -> dict[str, int]:
    """Counts of the master's warning and error log events (round_failed, node_suspect, ...)."""
    counts: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError, AttributeError):
            event = json.loads(line)
            if event.get("level") in ("warning", "error", "critical"):
                counts[f"log_{event['event']}"] = counts.get(f"log_{event['event']}", 0) + 1
    return counts


def loop_blocks(path: Path) -> dict[str, Any]:
    """The master's event-loop blocks of phase 2 (--loopwatch-ms): flat totals, the places printed."""
    if not path.exists():
        return {}
    found = json.loads(path.read_text())
    print(f"garbage collections of phase 2: {found['gc']}")
    print("event-loop blocks of phase 2 (count, total ms, CPU ms, max ms, where):")
    for row in found["top"]:
        print(
            f"  {row['count']:5d} {row['total_ms']:9.1f} {row['cpu_ms']:9.1f} {row['max_ms']:7.1f}  {row['where']}"
        )
    return {
        "loop_blocks": found["blocks"],
        "loop_blocked_ms": found["blocked_ms"],
        "loop_blocked_cpu_ms": found["blocked_cpu_ms"],
    }
