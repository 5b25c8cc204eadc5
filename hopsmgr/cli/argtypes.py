"""The CLI's argument types: each parses one option's text or raises argparse.ArgumentTypeError with
the value it got, so argparse names the option and exits 2 before anything is sent."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from hopsmgr.core.lifecycle import JobState

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
GPUS_FORMS = "N, N,N,... or LOW-HIGH"


@dataclass(frozen=True)
class GpusArg:
    """A parsed `--gpus`: explicit counts, or a range LOW-HIGH expanded later with `--rnum`."""

    text: str
    counts: tuple[int, ...] = ()
    span: tuple[int, int] | None = None


def parse_gpus(text: str) -> GpusArg:
    """`--gpus`: "4" or "1,2,4" -> the counts; "2-8" -> the range (2, 8)."""
    value = text.strip()
    if re.fullmatch(r"\d+-\d+", value):
        low, high = (int(x) for x in value.split("-"))
        if low <= 0:
            raise argparse.ArgumentTypeError(f"a GPU count must be a positive integer, got {text!r}")
        if high < low:
            raise argparse.ArgumentTypeError(f"range LOW-HIGH needs LOW <= HIGH, got {text!r}")
        return GpusArg(text, span=(low, high))
    items = value.split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"empty GPU count in {text!r} (expected {GPUS_FORMS})")
    counts: list[int] = []
    for item in items:
        if not item.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected {GPUS_FORMS} with positive integers, got {text!r}")
        count = int(item)
        if count <= 0:
            raise argparse.ArgumentTypeError(f"every GPU count must be a positive integer, got {text!r}")
        counts.append(count)
    return GpusArg(text, counts=tuple(sorted(set(counts))))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_number(text: str) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def work_amount(text: str) -> int | float:
    """--iters and --samples: a number of at least 1 (a job of no work is a mistake, not a job)."""
    value = positive_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


_MEM_UNITS = {"M": 1, "G": 1024, "T": 1024 * 1024}


def parse_mem(text: str) -> int:
    """A memory size as MiB: 512M, 8G, 1T (a bare number is MiB)."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([MGT]?)i?B?", text.strip(), re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a size like 512M, 8G or 1T, got {text!r}")
    mib = float(match.group(1)) * _MEM_UNITS[match.group(2).upper() or "M"]
    if not 1 <= mib <= 1 << 30:
        raise argparse.ArgumentTypeError(f"must be between 1M and 1024T, got {text!r}")
    return int(mib)


def nonnegative_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if not ENV_KEY.match(key):
        raise argparse.ArgumentTypeError(f"KEY must match [A-Za-z_][A-Za-z0-9_]*, got {text!r}")
    return key, value


def absolute_dir(text: str) -> str:
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"expected an absolute path on the node, got {text!r}")
    return text


def job_state(text: str) -> str:
    value = text.strip().upper()
    if value not in JobState.__members__:
        known = ", ".join(JobState.__members__)
        raise argparse.ArgumentTypeError(f"unknown state {text!r} (known: {known})")
    return value


def gpu_counts(text: str) -> str:
    """`explain --gpus`: GPU counts separated by commas ("2,4"), each a positive integer."""
    items = [item.strip() for item in text.split(",")]
    if not items or any(not item.isdigit() or int(item) <= 0 for item in items):
        raise argparse.ArgumentTypeError(
            f"expected positive GPU counts separated by commas (2,4), got {text!r}"
        )
    return ",".join(items)
