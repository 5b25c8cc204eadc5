"""Argument parsing and local validation of the API commands: bad input exits 2 naming the flag and
value, and nothing reaches the master."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from hopsmgr.cli.argtypes import parse_gpus
from hopsmgr.cli.commands import submit_body
from hopsmgr.cli.main import build_parser

from .conftest import GOOD_TOKEN, FakeMaster, Result

SUBMIT = ["submit", "--batch-size", "32", "--iters", "1000"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("text", "counts"),
    [("4", [4]), ("1,2,4", [1, 2, 4]), ("4,1,2,2", [1, 2, 4]), (" 8 ", [8])],
)
def test_gpus_lists(text: str, counts: list[int]) -> None:
    body = submit_body(parse(*SUBMIT, "--gpus", text, "--", "python", "train.py"))
    assert body["gpus"] == counts


def test_gpus_range_expands_to_rnum_counts_default_4() -> None:
    assert submit_body(parse(*SUBMIT, "--gpus", "2-8", "--", "x"))["gpus"] == [2, 4, 6, 8]
    assert submit_body(parse(*SUBMIT, "--gpus", "2-8", "--rnum", "2", "--", "x"))["gpus"] == [2, 8]
    assert submit_body(parse(*SUBMIT, "--gpus", "4-4", "--", "x"))["gpus"] == [4]


def test_submit_body_carries_every_option() -> None:
    args = parse(
        "submit", "--gpus", "4", "--batch-size", "64", "--samples", "1e6", "--tenant", "vision",
        "--name", "bert", "--params", "110e6", "--workdir", "/srv/bert", "--env", "A=1",
        "--env", "B=x=y", "--launcher", "torchrun", "--one-server", "--", "python", "train.py", "--lr",
        "0.1",
    )  # fmt: skip
    assert submit_body(args) == {
        "command": ["python", "train.py", "--lr", "0.1"],
        "gpus": [4],
        "batch_size": 64,
        "samples": 1000000,
        "tenant": "vision",
        "name": "bert",
        "params": 110000000,
        "workdir": "/srv/bert",
        "env": {"A": "1", "B": "x=y"},
        "launcher": "torchrun",
        "one_server": True,
    }


def test_submit_options_after_the_separator_belong_to_the_command() -> None:
    body = submit_body(parse(*SUBMIT, "--gpus", "1", "--", "run", "--gpus", "9", "--iters", "2"))
    assert body["command"] == ["run", "--gpus", "9", "--iters", "2"]
    assert body["gpus"] == [1] and body["iterations"] == 1000 and "samples" not in body


@pytest.mark.parametrize("text", ["0", "a", "8-2", "1,,2", "", "-1", "0-4", "2.5", "1,0"])
def test_parse_gpus_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_gpus(text)
    assert repr(text) in str(info.value)


BAD_SUBMITS = {
    "gpus-zero": (["--gpus", "0", "--batch-size", "8", "--iters", "5", "--", "x"], ["--gpus", "'0'"]),
    "gpus-letter": (["--gpus", "a", "--batch-size", "8", "--iters", "5", "--", "x"], ["--gpus", "'a'"]),
    "gpus-reversed": (["--gpus", "8-2", "--batch-size", "8", "--iters", "5", "--", "x"], ["--gpus", "'8-2'"]),
    "gpus-empty-item": (
        ["--gpus", "1,,2", "--batch-size", "8", "--iters", "5", "--", "x"],
        ["--gpus", "'1,,2'"],
    ),
    "gpus-missing": (["--batch-size", "8", "--iters", "5", "--", "x"], ["--gpus"]),
    "no-command": (["--gpus", "4", "--batch-size", "8", "--iters", "5", "--"], ["command", "--"]),
    "no-separator-no-command": (["--gpus", "4", "--batch-size", "8", "--iters", "5"], ["command"]),
    "env-without-equals": (
        ["--gpus", "4", "--batch-size", "8", "--iters", "5", "--env", "FOO", "--", "x"],
        ["--env", "'FOO'"],
    ),
    "env-bad-key": (
        ["--gpus", "4", "--batch-size", "8", "--iters", "5", "--env", "1X=2", "--", "x"],
        ["--env", "'1X=2'"],
    ),
    "iters-and-samples": (
        ["--gpus", "4", "--batch-size", "8", "--iters", "5", "--samples", "9", "--", "x"],
        ["--iters", "--samples"],
    ),
    "neither-iters-nor-samples": (["--gpus", "4", "--batch-size", "8", "--", "x"], ["--iters", "--samples"]),
    "iters-negative": (["--gpus", "4", "--batch-size", "8", "--iters", "-5", "--", "x"], ["--iters", "'-5'"]),
    "iters-below-one": (
        ["--gpus", "4", "--batch-size", "8", "--iters", "1e-300", "--", "x"],
        ["--iters", "'1e-300'"],
    ),
    "samples-below-one": (
        ["--gpus", "4", "--batch-size", "8", "--samples", "0.5", "--", "x"],
        ["--samples", "'0.5'"],
    ),
    "batch-zero": (["--gpus", "4", "--batch-size", "0", "--iters", "5", "--", "x"], ["--batch-size", "'0'"]),
    "rnum-without-range": (
        ["--gpus", "1,2", "--rnum", "3", "--batch-size", "8", "--iters", "5", "--", "x"],
        ["--rnum", "1,2"],
    ),
    "rnum-zero": (
        ["--gpus", "2-8", "--rnum", "0", "--batch-size", "8", "--iters", "5", "--", "x"],
        ["--rnum", "'0'"],
    ),
    "relative-workdir": (
        ["--gpus", "4", "--batch-size", "8", "--iters", "5", "--workdir", "rel/dir", "--", "x"],
        ["--workdir", "'rel/dir'"],
    ),
    "bad-launcher": (
        ["--gpus", "4", "--batch-size", "8", "--iters", "5", "--launcher", "mpi", "--", "x"],
        ["--launcher", "'mpi'"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SUBMITS))
def test_bad_submit_exits_2_naming_flag_and_sends_nothing(
    cli: Callable[..., Result], master: FakeMaster, case: str
) -> None:
    argv, needles = BAD_SUBMITS[case]
    code, out, err = cli("submit", "--url", master.url, "--token", GOOD_TOKEN, *argv)
    assert code == 2, (out, err)
    assert out == ""
    assert "error" in err and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert master.requests == []


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["queue", "--state", "SLEEPING"], ["--state", "'SLEEPING'"]),
        (["queue", "--state", "RUNNING", "--all"], ["--all", "--state"]),
        (["logs", "j-1", "--tail", "0"], ["--tail", "'0'"]),
        (["logs"], ["job"]),
        (["token", "create", "--tenant", "vision"], ["--user"]),  # --tenant only for a new user
        (["user", "add", "ana"], ["--tenant"]),
        (["user", "set", "ana", "--role", "boss"], ["--role", "'boss'"]),
        (["token", "revoke"], ["id"]),
        (["drain"], ["node"]),
    ],
)
def test_other_bad_input_exits_2(
    cli: Callable[..., Result], master: FakeMaster, argv: list[str], needles: list[str]
) -> None:
    code, _, err = cli(*argv, "--url", master.url, "--token", GOOD_TOKEN)
    assert code == 2
    for needle in needles:
        assert needle in err, (needle, err)
    assert master.requests == []


def test_state_is_case_insensitive_and_repeatable() -> None:
    args = parse("queue", "--state", "running", "--state", "QUEUED")
    assert args.state == ["RUNNING", "QUEUED"]


def test_every_api_command_takes_the_connection_options() -> None:
    for argv in (["submit", "--gpus", "1", "--batch-size", "1", "--iters", "1"], ["queue"], ["show", "j"],
                 ["cancel", "j"], ["logs", "j"], ["explain", "j"], ["nodes"], ["drain", "n"],
                 ["undrain", "n"], ["quota"], ["cluster"], ["token", "create", "--user", "u", "--tenant", "t"]):  # fmt: skip
        args = parse(
            *argv[:1], *argv[1:], "--url", "http://h:1", "--token", "t", "--client-config", "c", "--json"
        )
        assert (args.url, args.token, args.client_config, args.json) == ("http://h:1", "t", "c", True), argv


def test_simulate_and_demo_are_still_there() -> None:
    assert parse("demo", "--jobs", "3").jobs == 3
    assert parse("simulate", "--cluster", "v100=1x4").cluster == "v100=1x4"


def test_submit_input_is_checked_before_the_token(cli: Callable[..., Result]) -> None:
    code, _, err = cli(
        "submit", "--gpus", "1,2", "--rnum", "3", "--batch-size", "8", "--iters", "5", "--", "x"
    )
    assert code == 2
    assert "--rnum" in err and "no API token" not in err


@pytest.mark.parametrize(
    ("text", "mib"),
    [("512M", 512), ("8G", 8192), ("1T", 1 << 20), ("64", 64), ("1.5G", 1536), ("2GiB", 2048)],
)
def test_mem_sizes(text: str, mib: int) -> None:
    from hopsmgr.cli.argtypes import parse_mem

    assert parse_mem(text) == mib


@pytest.mark.parametrize("text", ["", "8X", "-1G", "0", "2048T", "lots"])
def test_bad_mem_sizes_exit_2(cli: Callable[..., Result], master: FakeMaster, text: str) -> None:
    code, _, err = cli("submit", "--url", master.url, "--token", GOOD_TOKEN, "--gpus", "1", "--batch-size", "8",
                       "--iters", "5", "--mem", text, "--", "python", "x.py")  # fmt: skip
    assert code == 2 and "--mem" in err and not master.requests
