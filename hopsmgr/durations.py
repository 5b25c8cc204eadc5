"""How a duration reads to a person, the same in the CLI's tables and on the dashboard's pages."""

from __future__ import annotations

import math


def duration(seconds: float, sep: str = "") -> str | None:
    """`seconds` in its two largest units: 45s, 3m20s, 1h05m, 2d03h (`sep` between the two:
    "3m 20s"); rounded to the second, negatives as 0s; None when it is not a finite number."""
    if not math.isfinite(seconds):
        return None
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{sep}{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{sep}{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{sep}{s % 86400 // 3600:02d}h"
