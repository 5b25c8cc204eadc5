"""Job arrays (`hopsmgr submit --array 0-9`): one submission per index, as Slurm's `--array` makes.

Each job of an array is a job of its own (its id, its place in the queue; `cancel` takes them one by
one), named `NAME[INDEX]`, with HOPS_ARRAY_INDEX set to its index in its environment by the master
(the submission's `array_index`). Forms: `0-9`, `1,3,5`, `0-15:4` (every fourth), and lists of these.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from hopsmgr.protocol import MAX_ARRAY_INDEX

MAX_ARRAY_JOBS = 1000
_PART = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


def parse_array(text: str) -> tuple[int, ...]:
    """`--array`: the indices, ascending and distinct; ArgumentTypeError naming what is wrong."""
    if "%" in text:
        raise argparse.ArgumentTypeError(
            f"a limit of running array jobs (%N, Slurm's throttle) is not supported, got {text!r}"
        )
    indices: set[int] = set()
    for part in text.split(","):
        match = _PART.fullmatch(part.strip())
        if match is None:
            raise argparse.ArgumentTypeError(
                f"expected indices such as 0-9, 1,3,5 or 0-15:4, got {part.strip()!r} in {text!r}"
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        step = int(match.group(3)) if match.group(3) is not None else 1
        if high < low or step <= 0:
            raise argparse.ArgumentTypeError(
                f"range LOW-HIGH[:STEP] needs LOW <= HIGH and STEP > 0, got {part!r}"
            )
        if high > MAX_ARRAY_INDEX:
            raise argparse.ArgumentTypeError(f"array indices go up to {MAX_ARRAY_INDEX}, got {high}")
        indices.update(range(low, high + 1, step))
        if len(indices) > MAX_ARRAY_JOBS:
            raise argparse.ArgumentTypeError(
                f"an array holds at most {MAX_ARRAY_JOBS} jobs, {text!r} has more"
            )
    return tuple(sorted(indices))


def array_bodies(body: dict[str, Any], indices: tuple[int, ...]) -> list[dict[str, Any]]:
    """One submission body per index: named NAME[INDEX] (NAME: the body's, else the program's)."""
    name = body.get("name") or str(body["command"][0]).rsplit("/", 1)[-1][:120]
    return [{**body, "name": f"{name}[{i}]", "array_index": i} for i in indices]
