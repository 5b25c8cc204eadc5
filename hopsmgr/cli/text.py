"""Plain-text pieces the CLI's tables and key-value blocks are made of: durations, times, numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from hopsmgr import durations

DASH = "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Columns left-aligned and separated by two spaces; trailing spaces stripped."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in (headers, *rows):
        line = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row))
        lines.append(indent + line.rstrip())
    return "\n".join(lines)


def duration(seconds: float | None) -> str:
    """A short human duration: 45s, 3m20s, 1h05m, 2d03h; "-" for null."""
    return DASH if seconds is None else durations.duration(float(seconds)) or DASH


def timestamp(value: float | None) -> str:
    """Unix seconds as ISO 8601 local time to the second; "-" for null."""
    if value is None:
        return DASH
    return datetime.fromtimestamp(float(value)).astimezone().isoformat(timespec="seconds")


def number(value: Any, digits: int = 2) -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def yes_no(value: Any) -> str:
    if value is None:
        return DASH
    return "yes" if value else "no"


def percent(fraction: float | None) -> str:
    if fraction is None:
        return DASH
    return f"{float(fraction) * 100:.0f}%"


def gpus(counts: Sequence[int] | None) -> str:
    """A requirement set: "4" or "1,2,4"."""
    if not counts:
        return DASH
    return ",".join(str(c) for c in counts)


def placement(value: Mapping[str, int] | None) -> str:
    """{"node-a": 2, "node-b": 2} -> "node-a:2,node-b:2"."""
    if not value:
        return DASH
    return ",".join(f"{node}:{count}" for node, count in value.items())


def value_text(value: Any) -> str:
    """Any JSON value on one line: objects as k=v pairs, lists comma-joined, null as "-"."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={value_text(v)}" for k, v in value.items()) or DASH
    if isinstance(value, (list, tuple)):
        return ",".join(value_text(v) for v in value) or DASH
    return str(value)


def key_values(pairs: Sequence[tuple[str, str]], indent: str = "") -> str:
    width = max((len(k) for k, _ in pairs), default=0) + 1
    return "\n".join(f"{indent}{(k + ':').ljust(width)} {v}".rstrip() for k, v in pairs)
