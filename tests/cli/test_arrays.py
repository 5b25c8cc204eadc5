"""`hopsmgr submit --array`: the index forms, their limits, and one body per index."""

from __future__ import annotations

import argparse

import pytest

from hopsmgr.cli.arrays import MAX_ARRAY_JOBS, array_bodies, parse_array
from hopsmgr.protocol import parse_submission


@pytest.mark.parametrize(
    ("text", "indices"),
    [("0-3", (0, 1, 2, 3)), ("5", (5,)), ("1,3,5", (1, 3, 5)), ("0-15:4", (0, 4, 8, 12)),
     ("3,0-2,2", (0, 1, 2, 3)), (" 7 , 9 ", (7, 9))],
)  # fmt: skip
def test_array_indices_take_slurms_forms(text: str, indices: tuple[int, ...]) -> None:
    assert parse_array(text) == indices


@pytest.mark.parametrize(
    ("text", "needle"),
    [("0-9%2", "not supported"), ("3-1", "LOW <= HIGH"), ("0-4:0", "STEP > 0"), ("a-b", "expected indices"),
     ("1,,2", "expected indices"), (f"0-{MAX_ARRAY_JOBS}", "at most"), ("2000000", "go up to")],
)  # fmt: skip
def test_bad_array_indices_say_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=needle):
        parse_array(text)


def test_each_index_gets_a_named_body_the_master_accepts() -> None:
    body = {"command": ["/opt/venv/bin/python", "train.py"], "gpus": [1], "batch_size": 8, "iterations": 10}
    bodies = array_bodies(body, (0, 2))
    assert [(b["name"], b["array_index"]) for b in bodies] == [("python[0]", 0), ("python[2]", 2)]
    assert array_bodies({**body, "name": "sweep"}, (4,))[0]["name"] == "sweep[4]"
    for b in bodies:
        assert parse_submission(b).array_index == b["array_index"]
