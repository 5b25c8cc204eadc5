"""`hopsmgr submit` for scripts without the runtime (`--no-runtime`, `--time`, `--checkpoint-signal`,
`--grace`) and for scripts that carry their options in `#HOPS` lines; through the real CLI against the
tiny master of conftest, checking the body that reaches it (or that nothing does)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hopsmgr.cli.scripts import parse_duration
from hopsmgr.protocol import parse_submission

from .conftest import GOOD_TOKEN, FakeMaster, Result


def submitted(master: FakeMaster) -> dict[str, object]:
    (seen,) = [r for r in master.requests if r.method == "POST" and r.path == "/api/v1/jobs"]
    assert isinstance(seen.body, dict)
    parse_submission(seen.body)  # what the master's own schema accepts
    return seen.body


def test_no_runtime_needs_neither_batch_size_nor_iters(
    cli: Callable[..., Result], master: FakeMaster
) -> None:
    code, _, err = cli(
        "submit", "--url", master.url, "--token", GOOD_TOKEN, "--gpus", "2", "--no-runtime", "--time", "2h",
        "--checkpoint-signal", "SIGUSR1", "--grace", "120", "--", "python", "train.py",
    )  # fmt: skip
    assert code == 0, err
    body = submitted(master)
    assert body["runtime"] is False and body["time_s"] == 7200.0
    assert body["checkpoint_signal"] == "SIGUSR1" and body["grace_s"] == 120.0
    assert "batch_size" not in body and "iterations" not in body


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--gpus", "1", "--", "x"], ["--batch-size", "unless --no-runtime"]),
        (["--gpus", "1", "--batch-size", "8", "--", "x"], ["--iters --samples"]),
        (["--gpus", "1", "--no-runtime", "--iters", "5", "--", "x"], ["--iters", "run time"]),
        (["--gpus", "1", "--no-runtime", "--batch-size", "5", "--", "x"], ["--batch-size"]),
        (["--gpus", "1", "--batch-size", "8", "--iters", "5", "--checkpoint-signal", "SIGUSR1", "--", "x"],
         ["--checkpoint-signal", "only with --no-runtime"]),
        (["--gpus", "1", "--no-runtime", "--grace", "5", "--", "x"], ["--grace", "needs --checkpoint-signal"]),
        (["--gpus", "1", "--no-runtime", "--checkpoint-signal", "SIGKILL", "--", "x"], ["--checkpoint-signal"]),
        (["--gpus", "1", "--no-runtime", "--time", "soon", "--", "x"], ["--time", "'soon'"]),
        (["--no-runtime", "--", "x"], ["--gpus", "#HOPS"]),
    ],
)  # fmt: skip
def test_bad_combinations_exit_2_and_send_nothing(
    cli: Callable[..., Result], master: FakeMaster, argv: list[str], needles: list[str]
) -> None:
    code, _, err = cli("submit", "--url", master.url, "--token", GOOD_TOKEN, *argv)
    assert code == 2, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert master.requests == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("30m", 1800), ("90s", 90), ("1d", 86400), ("1.5h", 5400), ("90", 5400),
     ("10:30", 630), ("1:30:00", 5400), ("1-12", 129600), ("1-12:30", 131400), ("2-00:00:10", 172810)],
)  # fmt: skip
def test_time_takes_slurm_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "-5m", "2w", "1:2:3:4", "h"])
def test_time_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a duration"):
        parse_duration(text)


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_a_script_carries_its_options_in_hops_lines_and_the_command_line_wins(
    cli: Callable[..., Result], master: FakeMaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = script(
        tmp_path / "job.sh",
        "#!/bin/sh\n"
        "# a training job\n"
        "#HOPS --gpus 1,2,4 --no-runtime\n"
        "#HOPS --time 3h   # the expected run time\n"
        "#HOPS --name 'my job' --env A=1\n"
        "\n"
        "python train.py\n"
        "#HOPS --tenant ignored-after-the-first-command\n",
    )
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(
        "submit", "--url", master.url, "--token", GOOD_TOKEN, "--time", "30m", "job.sh", "--lr", "3"
    )
    assert code == 0, err
    body = submitted(master)
    assert body["command"] == [str(job), "--lr", "3"]
    assert body["gpus"] == [1, 2, 4] and body["runtime"] is False and body["name"] == "my job"
    assert body["time_s"] == 1800.0  # the command line's --time wins over the script's
    assert body["env"] == {"A": "1"} and body["workdir"] == str(tmp_path)
    assert "tenant" not in body


def test_a_bad_hops_line_or_a_script_that_cannot_run_exits_2(
    cli: Callable[..., Result], master: FakeMaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    script(tmp_path / "bad.sh", "#!/bin/sh\n#HOPS --gpus 'unclosed\ntrue\n")
    code, _, err = cli("submit", "--url", master.url, "--token", GOOD_TOKEN, "bad.sh")
    assert code == 2 and "bad.sh line 2" in err and "quotation" in err
    script(tmp_path / "plain.sh", "#!/bin/sh\n#HOPS --gpus 1 --no-runtime\ntrue\n").chmod(0o644)
    code, _, err = cli("submit", "--url", master.url, "--token", GOOD_TOKEN, "plain.sh")
    assert code == 2 and "chmod +x plain.sh" in err
    script(tmp_path / "opts.sh", "#!/bin/sh\n#HOPS --gpus 4 --gpus 5 --bogus\ntrue\n")
    code, _, err = cli("submit", "--url", master.url, "--token", GOOD_TOKEN, "opts.sh")
    assert code == 2 and "--bogus" in err
    assert master.requests == []
    assert os.getcwd() == str(tmp_path)
