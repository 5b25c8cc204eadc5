"""Shared by the tests of `hopsmgr simulate` (test_cli_simulate.py, test_cli_simulate_bad_input.py): running
the CLI in-process, a small inline paper-world cluster and workload, and writing Gavel traces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hopsmgr.cli.main import main

PAPER_CLUSTER = "rtx3090=2x4,titanxp=1x4"  # inline, paper world: no shared data; 8-GPU jobs fit
SMALL = "poisson:jobs=4,rate=30"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_trace(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def gavel_line(job_type: str, steps: int, scale_factor: int, arrival: float) -> str:
    """One line of a Gavel trace: the 10 tab-separated columns of shared/data/gavel/traces/*/*.trace."""
    return "\t".join(
        [
            job_type,
            "python3 main.py --batch_size 64",
            "image_classification/cifar10",
            "--num_steps",
            "1",
            str(steps),
            str(scale_factor),
            "1",
            "-1.000000",
            str(arrival),
        ]
    )
