"""Tests of `hopsmgr simulate` given bad input, run in-process through `hopsmgr.cli.main.main`.

Every bad input must give exit status 2, a message on stderr naming the bad value, and nothing written to
--out. The runs that succeed (and `hopsmgr demo`): tests/sim/test_cli_simulate.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hopsmgr.cli.main import main
from tests.sim._cli_simulate_helpers import PAPER_CLUSTER, SMALL, gavel_line, run, write_trace

# ------------------------------------------------------------------------------ simulate: bad input


def _bad_cases(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (arguments after `simulate`, texts stderr must contain)."""
    good_trace = gavel_line("ResNet50", 100, 1, 0)
    malformed = write_trace(tmp / "malformed.trace", [good_trace, "ResNet50\tonly three\tcolumns"])
    unknown_key = tmp / "unknown-key.toml"
    unknown_key.write_text(
        '[cluster]\nname = "x"\nbogus_key = 1\n\n[[servers]]\nid = "a"\ngpu_type = "rtx3090"\ngpus = 4\n'
    )
    missing_toml = tmp / "no-such-cluster.toml"
    workload = ["--workload", SMALL]
    return {
        "bad-inline-cluster": (["--cluster", "v100=2y4", *workload], ["v100=2y4"]),
        "unknown-policy": (["--cluster", PAPER_CLUSTER, *workload, "--policies", "hops,nosuch"], ["nosuch"]),
        "workload-and-trace": (
            ["--cluster", PAPER_CLUSTER, *workload, "--trace", str(malformed), "--format", "gavel"],
            ["--workload", "--trace"],
        ),
        "trace-without-format": (["--cluster", PAPER_CLUSTER, "--trace", str(malformed)], ["--format"]),
        "malformed-trace-line": (
            ["--cluster", PAPER_CLUSTER, "--trace", str(malformed), "--format", "gavel"],
            [f"{malformed}:2"],
        ),
        "bad-workload-spec": (
            ["--cluster", PAPER_CLUSTER, "--workload", "poisson:jobs=-1,rate=5"],
            ["jobs", "-1"],
        ),
        "missing-cluster-toml": (["--cluster", str(missing_toml), *workload], [str(missing_toml)]),
        "unknown-toml-key": (["--cluster", str(unknown_key), *workload], [str(unknown_key), "bogus_key"]),
        "zero-servers": (["--cluster", "rtx3090=0x4", *workload], ["rtx3090=0x4"]),
        "empty-policies": (["--cluster", PAPER_CLUSTER, *workload, "--policies", ","], ["--policies"]),
        "negative-server-sigma": (
            ["--cluster", PAPER_CLUSTER, *workload, "--server-sigma", "-0.1"],
            ["--server-sigma", "-0.1"],
        ),
    }


BAD_CASES = (
    "bad-inline-cluster",
    "unknown-policy",
    "workload-and-trace",
    "trace-without-format",
    "malformed-trace-line",
    "bad-workload-spec",
    "missing-cluster-toml",
    "unknown-toml-key",
    "zero-servers",
    "empty-policies",
    "negative-server-sigma",
)


@pytest.mark.parametrize("case", BAD_CASES)
def test_simulate_bad_input_exits_2_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    cases = _bad_cases(tmp_path)
    assert set(cases) == set(BAD_CASES)
    args, needles = cases[case]
    out = tmp_path / "out"
    code, stdout, stderr = run(capsys, "simulate", *args, "--out", str(out))
    assert code == 2, (stdout, stderr)
    assert "error" in stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)
    assert "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--round-seconds", "-5"],
        ["--round-seconds", "0"],
        ["--format", "csv", "--trace", "x.trace"],
        ["--seed", "three"],
    ],
    ids=["negative-round", "zero-round", "unknown-format", "non-integer-seed"],
)
def test_simulate_argparse_errors_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]
) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--cluster", PAPER_CLUSTER, "--out", str(out)]
    if "--trace" not in args:
        argv += ["--workload", SMALL]
    with pytest.raises(SystemExit) as info:
        main([*argv, *args])
    assert info.value.code == 2
    assert args[1] in capsys.readouterr().err
    assert not out.exists()


# The next cases are bad inputs too; today they end in a traceback (see the report of these tests).


def test_missing_trace_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such.trace"
    out = tmp_path / "out"
    code, _, stderr = run(
        capsys,
        "simulate",
        "--cluster",
        PAPER_CLUSTER,
        "--trace",
        str(missing),
        "--format",
        "gavel",
        "--out",
        str(out),
    )
    assert code == 2
    assert str(missing) in stderr
    assert not out.exists()


def test_missing_throughputs_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-throughputs.json"
    out = tmp_path / "out"
    code, _, stderr = run(
        capsys,
        "simulate",
        "--cluster",
        "v100=1x4",
        "--workload",
        SMALL,
        "--throughputs",
        str(missing),
        "--out",
        str(out),
    )
    assert code == 2
    assert str(missing) in stderr
    assert not out.exists()


def test_gpu_type_unknown_to_the_world_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # v100 with rtx3090 is not all-Gavel, so the paper world is chosen, which has no v100.
    out = tmp_path / "out"
    code, _, stderr = run(
        capsys, "simulate", "--cluster", "v100=1x4,rtx3090=1x4", "--workload", SMALL, "--out", str(out)
    )
    assert code == 2
    assert "v100" in stderr
    assert not out.exists()


@pytest.mark.parametrize("kind", ["poisson", "philly"])
def test_non_positive_limit_is_rejected(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "out"
    if kind == "poisson":
        source, limit = ["--workload", SMALL], "-1"  # today: silently drops the last job
    else:
        philly = tmp_path / "philly.csv"
        philly.write_text(
            "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,c1\n"
        )
        source, limit = ["--trace", str(philly), "--format", "philly"], "0"  # today: a ValueError traceback
    argv = [
        "simulate",
        "--cluster",
        PAPER_CLUSTER,
        *source,
        "--policies",
        "fifo",
        "--limit",
        limit,
        "--out",
        str(out),
    ]
    try:
        code = main(argv)
    except SystemExit as exc:  # an argparse-level rejection is fine too
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    assert "--limit" in capsys.readouterr().err
    assert not out.exists()


def test_out_that_cannot_be_created_exits_2_before_any_policy_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, stdout, stderr = run(
        capsys, "simulate", "--cluster", PAPER_CLUSTER, "--workload", SMALL, "--policies", "fifo",
        "--out", "/proc/hopsmgr-no-such-dir/out",
    )  # fmt: skip
    assert code == 2 and "--out: cannot create '/proc/hopsmgr-no-such-dir/out'" in stderr, stderr
    assert "fifo" not in stdout and "Traceback" not in stderr  # refused before the simulation


def test_out_naming_a_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.write_text("not a directory\n")
    code, _, stderr = run(
        capsys,
        "simulate",
        "--cluster",
        PAPER_CLUSTER,
        "--workload",
        SMALL,
        "--policies",
        "fifo",
        "--out",
        str(out),
    )
    assert code == 2
    assert str(out) in stderr
    assert out.read_text() == "not a directory\n"
