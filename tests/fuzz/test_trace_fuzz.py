"""Property-based fuzzing of the trace readers (hopsmgr/sim/traces.py): mutations of small valid traces.

tests/sim/test_traces.py appends junk lines after a good one. Here every reader (Gavel, both its 10-
and 7-column forms; Philly; Tiresias) gets small valid traces mutated the way files go wrong: a field
replaced (numbers out of range, NaN, 1e400, words, unicode, empty), lines deleted, duplicated, swapped,
joined, cut short or inserted (junk, blank, comments), separators changed, stray CSV quotes, headers
renamed, re-cased or reordered, a BOM, NUL bytes, bytes that are not UTF-8, CR or CRLF line ends.

The property: the reader returns jobs (sorted by arrival, the first at 0, positive finite work, a GPU
count in range) or raises TraceError whose message is "<file>:<line>: <reason>" with a line inside the
file; never another exception. A second test mutates exactly one field of one line (without quotes,
separators or line breaks): an error must then name that very line. Runs on the paper world (Gavel job
types mapped to its models), so it needs no shared data.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, note, settings
from hypothesis import strategies as st

from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.traces import MAX_GPUS, TraceError, read_gavel_trace, read_philly_csv, read_tiresias_csv
from hopsmgr.sim.workload import WorkloadJob

WORLD = paper_world()
MODEL_MAP = {"ResNet-50 (batch size 64)": "ResNet50", "LM (batch size 20)": "DistilBERT"}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# format -> (separator, header line or None, good data lines)
TRACES: dict[str, tuple[str, str | None, list[str]]] = {
    "gavel10": (
        "\t",
        None,
        [
            "ResNet-50 (batch size 64)\tpython3 main.py\timagenet\t--num\t1\t2931\t2\t1\t-1.000000\t5",
            "LM (batch size 20)\tpython main.py\twiki\t--steps\t1\t1000\t1\t2\t3600\t0",
            "ResNet-50 (batch size 64)\tpython3 main.py\timagenet\t--num\t1\t50\t4\t1\t-1\t12.5",
        ],
    ),
    "gavel7": (
        "\t",
        None,
        [
            "LM (batch size 20)\tpython main.py\t--steps\t1\t1000\t7.0\t4",
            "ResNet-50 (batch size 64)\tpython3 main.py\t--num\t1\t300\t0\t1",
        ],
    ),
    "philly": (
        ",",
        "timestamp,duration,num_gpus,gpu_time,cluster",
        [
            "2017-10-09 07:01:55,66.0,1,66.0,11cb48",
            "2017-10-09 08:00:00,3600,8,28800,6214e9",
            "1507532515,10,2,20,",
        ],
    ),
    "tiresias": (
        ",",
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval",
        ["0,1,0,606,vgg19,164,30", "1,8,5,100,resnet50,3600,30", "x7,2,2.5,1,unknown,10,0"],
    ),
}
READERS: dict[str, Callable[[Path], list[WorkloadJob]]] = {
    "gavel10": lambda p: read_gavel_trace(p, WORLD, model_map=MODEL_MAP),
    "gavel7": lambda p: read_gavel_trace(p, WORLD, model_map=MODEL_MAP),
    "philly": lambda p: read_philly_csv(p, WORLD, rng_seed=3),
    "tiresias": lambda p: read_tiresias_csv(p, WORLD, rng_seed=3),
}
FIELD_TOKENS = [
    "", " ", "0", "1", "-1", "-0", "2.5", "1e400", "-1e400", "1e15", "1e16", "nan", "NaN", "inf", "-inf", "8",
    str(MAX_GPUS), str(MAX_GPUS + 1), "99999999999999999999", "0x10", "1_000", "x", "ResNet-50 (batch size 64)",
    "vgg11", "2017-13-45 99:99:99", "2017-10-09T07:01:55+05:00", "9999-12-31 23:59:59", "0001-01-01", "\u00e9",
    "\U0001f600", "١٢", "\u2007", "True",
]  # fmt: skip
CLEAN = st.text(
    st.characters(exclude_categories=["Cs", "Cc", "Zl", "Zp"], exclude_characters='\t,"'), max_size=12
)
JUNK = st.text(max_size=60)


def tally(what: str) -> None:
    """Count an outcome in hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    if currently_in_test_context():
        event(what)


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tracefuzz") as d:
        yield Path(d)


def physical_lines(data: bytes) -> int:
    text = data.decode("utf-8", errors="replace")
    return len(re.split(r"\r\n|\r|\n", text))


def check_read(fmt: str, path: Path, data: bytes) -> list[WorkloadJob] | TraceError:
    path.write_bytes(data)
    try:
        jobs = READERS[fmt](path)
    except TraceError as err:
        assert str(err).startswith(f"{path}:{err.line}: ") and err.reason, str(err)
        assert 0 <= err.line <= physical_lines(data), f"line {err.line} of a file of {physical_lines(data)}"
        tally(f"{fmt}: TraceError")
        return err
    assert jobs, "a trace without jobs must raise TraceError"
    tally(f"{fmt}: parsed")
    arrivals = [j.arrival_s for j in jobs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    for job in jobs:
        assert 0 < job.total_samples < float("inf"), job
        assert 1 <= job.requirements.minimum <= MAX_GPUS, job
        assert job.model in {m.name for m in WORLD.models()}, job
    return jobs


# -- any mutation ---------------------------------------------------------------------------------------------


@st.composite
def mutated_trace(draw: st.DrawFn, fmt: str) -> bytes:
    sep, header, good = TRACES[fmt]
    rows = [line.split(sep) for line in good]
    if header is not None and draw(st.integers(0, 3)) == 0:  # columns in another order: still valid
        order = draw(st.permutations(range(len(header.split(sep)))))
        names = header.split(sep)
        header = sep.join(names[i] for i in order)
        rows = [[r[i] for i in order] for r in rows]
    lines = ([header] if header is not None else []) + [sep.join(r) for r in rows]
    first_data = 1 if header is not None else 0
    for _ in range(draw(st.integers(1, 4))):
        how = draw(
            st.sampled_from(
                ["field", "field", "field", "delete", "duplicate", "swap", "join", "cut", "insert", "sep",
                 "quote", "header"]
            )
        )  # fmt: skip
        if not lines:
            lines.append(draw(JUNK))
            continue
        i = draw(st.integers(0, len(lines) - 1))
        if how == "field":
            k = draw(st.integers(first_data, len(lines) - 1)) if len(lines) > first_data else i
            cells = lines[k].split(sep)
            c = draw(st.integers(0, len(cells) - 1))
            cells[c] = draw(st.sampled_from(FIELD_TOKENS) | CLEAN | JUNK)
            lines[k] = sep.join(cells)
        elif how == "delete":
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "join" and i + 1 < len(lines):
            lines[i : i + 2] = [lines[i] + draw(st.sampled_from(["", sep, " "])) + lines[i + 1]]
        elif how == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif how == "insert":
            lines.insert(i, draw(st.sampled_from(["", "   ", "# comment", sep * 6, sep * 9, "\x00"]) | JUNK))
        elif how == "sep":
            other = "," if sep == "\t" else "\t"
            lines[i] = lines[i].replace(sep, draw(st.sampled_from([other, sep + sep, ";", " "])), 1)
        elif how == "quote":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + '"' + lines[i][at:]
        elif how == "header" and header is not None and lines:
            cells = lines[0].split(sep)
            c = draw(st.integers(0, len(cells) - 1))
            cells[c] = draw(
                st.sampled_from([cells[c].upper(), f" {cells[c]} ", cells[c] + "x", "", cells[0]])
            )
            lines[0] = sep.join(cells)
    ending = draw(st.sampled_from(["\n", "\n", "\r\n", "\r"]))
    data = (ending.join(lines) + draw(st.sampled_from([ending, ""]))).encode("utf-8")
    if draw(st.integers(0, 5)) == 0:
        at = draw(st.integers(0, len(data)))
        data = (
            data[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80", b"\xef\xbb\xbf"]))
            + data[at:]
        )
    if draw(st.integers(0, 15)) == 0:
        data = b"\xef\xbb\xbf" + data  # a byte-order mark
    return data


@FUZZ
@given(fmt=st.sampled_from(sorted(TRACES)), data=st.data())
def test_mutated_traces_parse_or_raise_trace_error_naming_file_and_line(
    tmp: Path, fmt: str, data: st.DataObject
) -> None:
    raw = data.draw(mutated_trace(fmt))
    note(repr(raw))
    check_read(fmt, tmp / f"trace.{fmt}", raw)


# -- one field of one line: the error names that line --------------------------------------------------------


@FUZZ
@given(fmt=st.sampled_from(sorted(TRACES)), data=st.data())
def test_one_bad_field_is_reported_on_its_own_line(tmp: Path, fmt: str, data: st.DataObject) -> None:
    sep, header, good = TRACES[fmt]
    lines = ([header] if header is not None else []) + list(good)
    first = 1 if header is not None else 0
    k = data.draw(st.integers(first, len(lines) - 1), label="line index")
    cells = lines[k].split(sep)
    c = data.draw(st.integers(0, len(cells) - 1), label="column")
    cells[c] = data.draw(st.sampled_from(FIELD_TOKENS) | CLEAN, label="value")
    lines[k] = sep.join(cells)
    result: Any = check_read(fmt, tmp / f"one.{fmt}", ("\n".join(lines) + "\n").encode("utf-8"))
    if isinstance(result, TraceError):
        if "unique" in str(result):  # the new value repeats another line's id: either line may be named
            return
        assert result.line == k + 1, f"the bad field is on line {k + 1}, the error says {result}"


def test_the_unmutated_traces_parse(tmp: Path) -> None:
    for fmt, (_sep, header, good) in TRACES.items():
        lines = ([header] if header is not None else []) + good
        jobs = check_read(fmt, tmp / f"good.{fmt}", ("\n".join(lines) + "\n").encode())
        assert isinstance(jobs, list) and len(jobs) == len(good), (fmt, jobs)
