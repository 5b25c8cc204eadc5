"""`hopsmgr submit`'s Slurm habits: `--time` durations, `--after` job ids, and `#HOPS` lines at the
head of a submitted script (like `#SBATCH`), parsed before the command line's options so those win."""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
from pathlib import Path


class UsageError(Exception):
    """Bad command-line input found after parsing (exit status 2, nothing sent)."""


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`--time`: 90s, 30m, 2h, 1d, or Slurm's forms: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    value = text.strip().lower()
    bad = argparse.ArgumentTypeError(
        f"expected a duration such as 30m, 2h, 1d, 90 (minutes), 1:30:00 or 1-12:00, got {text!r}"
    )
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value)
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
        if not m:
            raise bad
        days, a, b, c = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        if days is not None:  # D-HH[:MM[:SS]]
            seconds = int(days) * 86400 + a * 3600 + int(b or 0) * 60 + int(c or 0)
        elif c is not None:  # HH:MM:SS
            seconds = a * 3600 + int(b or 0) * 60 + int(c)
        elif b is not None:  # MM:SS
            seconds = a * 60 + int(b)
        else:  # MINUTES
            seconds = a * 60
    if not (math.isfinite(seconds) and seconds > 0):
        raise bad
    return seconds


DIRECTIVE = "#HOPS"


def script_directives(path: str) -> list[str]:
    """The options of the `#HOPS ...` lines at the head of a script (like `#SBATCH`): after an optional
    `#!` line, the lines up to the first that is neither blank nor a comment."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read(1 << 16).splitlines()
    except OSError:
        return []
    options: list[str] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if number == 1 and text.startswith("#!"):
            continue
        if text and not text.startswith("#"):
            break
        if text.startswith(DIRECTIVE) and (len(text) == len(DIRECTIVE) or text[len(DIRECTIVE)].isspace()):
            try:
                options += shlex.split(text[len(DIRECTIVE) :], comments=True)
            except ValueError as exc:
                raise UsageError(f"{path} line {number}: {exc}: {line!r}") from None
    return options


def with_script_directives(
    parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace
) -> argparse.Namespace:
    """`hopsmgr submit job.sh`: parse the script's `#HOPS` options before the command line's, so the
    command line wins (argparse keeps the last value of an option)."""
    command = [c for c in getattr(args, "command", None) or [] if c != "--"][:1]
    submitting = getattr(getattr(args, "api_func", None), "__name__", "") == "cmd_submit"
    if not submitting or not command or not Path(command[0]).is_file():
        return args
    options = script_directives(command[0])
    if not options:
        return args
    if "--" in options or any(not o.startswith("-") and i == 0 for i, o in enumerate(options)):
        raise UsageError(f"{command[0]}: #HOPS lines hold options only, got {' '.join(options)!r}")
    at = argv.index("submit")
    merged = parser.parse_args([*argv[: at + 1], *options, *argv[at + 1 :]])
    merged.directives = options
    return merged


def job_ids(text: str) -> tuple[str, ...]:
    ids = tuple(part.strip() for part in text.split(","))
    if not ids or any(not re.fullmatch(r"j-[0-9]{6,9}", j) for j in ids):
        raise argparse.ArgumentTypeError(f"expected job ids such as j-000042 (comma-separated), got {text!r}")
    return ids


def script_command(command: list[str]) -> list[str]:
    """A script submitted with #HOPS lines (`hopsmgr submit job.sh`) runs by its absolute path."""
    first = command[0]
    if not os.access(first, os.X_OK):
        raise UsageError(
            f"{first} is not executable: chmod +x {first} (it runs as a program, with its #! line)"
        )
    return [os.path.abspath(first), *command[1:]]
