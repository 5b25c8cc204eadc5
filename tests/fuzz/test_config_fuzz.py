"""Property-based fuzzing of the cluster's TOML configuration file.

Extends tests/unit/test_config.py (junk Python dicts into four sections) with: whole TOML documents
written by a small TOML writer (tests/fuzz/_config_fuzz_helpers.py) from dicts with the real keys of every
section ([master] and [scheduler] keys come from their dataclasses), and random text mutations of the
shipped configs (configs/lab.toml and friends: lines deleted, duplicated, swapped, values of another type,
junk lines, truncation, bytes that are not UTF-8). The property: the loader either returns a config or
raises ConfigError whose message starts with the file and names a key that the document holds (or a
required one it lacks); TOML and UTF-8 errors name the file (and the TOML line). Never another exception
type. The agent's config: tests/fuzz/test_config_fuzz_agent.py.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hopsmgr.config import ClusterConfig, ConfigError, load_cluster_config, parse_cluster_config
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master.settings import MasterSettings
from tests.fuzz._config_fuzz_helpers import FUZZ, KEY, TEXT, VALUES, key_in, tally, toml_document, toml_value

REPO = Path(__file__).resolve().parents[2]
SEEDS = [
    REPO / "configs" / "lab.toml",
    REPO / "configs" / "demo.toml",
    REPO / "hopsmgr" / "data" / "demo-cluster.toml",
]


def same(a: Any, b: Any) -> bool:
    """Equality with nan == nan (to check the writer against tomllib)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# -- what an error must say ----------------------------------------------------------------------------------


def check_cluster_error(err: ConfigError, source: str, doc: Any | None) -> None:
    text = str(err)
    assert text.startswith(f"{source}: "), text
    if doc is None:  # the text is not a TOML document (or not UTF-8): only the file can be named
        assert err.key == "" and err.reason.startswith(("not valid TOML", "not UTF-8")), text
        tally(f"ConfigError: {err.reason[:12]}")
        return
    assert err.key, f"no key named: {text}"
    assert text.startswith(f"{source}: {err.key}: "), text
    assert key_in(doc, err.key), f"{err.key!r} is not in the document: {text}"
    root = re.split(r"[.[]", err.key)[0]
    tally(f"ConfigError at {root if root in SECTION_KEYS else 'an unknown key'}")


def check_cluster_config(config: ClusterConfig) -> None:
    tally("loaded")
    assert config.servers and config.total_gpus > 0 and config.tenants
    assert len({s.id for s in config.servers}) == len(config.servers)
    assert sum(t.guaranteed_gpus for t in config.tenants) <= config.total_gpus


# -- strategies ----------------------------------------------------------------------------------------------

SCHEDULER_KEYS = tuple("lambda" if f.name == "lambda_" else f.name for f in fields(SchedulerSettings))
MASTER_KEYS = tuple(f.name for f in fields(MasterSettings))
SERVER_KEYS = (
    "id",
    "gpu_type",
    "gpus",
    "host_model",
    "order",
    "calibration",
    "address",
    "ssh_port",
    "ssh_user",
)
GROUP_KEYS = ("prefix", "count", "gpu_type", "gpus", "host_model", "order", "calibration")
TENANT_KEYS = ("name", "guaranteed_gpus", "cap_gpus", "weight")
CALIBRATION_KEYS = ("compute_factor", "memory_factor", "data_factor", "link_gbps", "net_gbps")
SECTION_KEYS = {
    "cluster": ("name",),
    "scheduler": SCHEDULER_KEYS,
    "master": MASTER_KEYS,
    "servers": SERVER_KEYS,
    "server_groups": GROUP_KEYS,
    "tenants": TENANT_KEYS,
}


@st.composite
def valid_cluster(draw: st.DrawFn) -> dict[str, Any]:
    ids = st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True)
    gpu_type = st.sampled_from(["v100", "k80", "a100", "rtx3090"])
    calibration = st.dictionaries(st.sampled_from(CALIBRATION_KEYS), st.floats(0.1, 100), max_size=3)
    servers = []
    for sid in draw(st.lists(ids, min_size=1, max_size=3, unique=True)):
        server: dict[str, Any] = {"id": sid, "gpu_type": draw(gpu_type), "gpus": draw(st.integers(1, 8))}
        if draw(st.booleans()):
            server["calibration"] = draw(calibration)
        if draw(st.booleans()):
            server["address"], server["ssh_port"] = "10.0.0.1", draw(st.integers(1, 65535))
        servers.append(server)
    doc: dict[str, Any] = {"cluster": {"name": draw(TEXT.filter(str.strip))}, "servers": servers}
    if draw(st.booleans()):
        doc["server_groups"] = [
            {"prefix": "g-", "count": draw(st.integers(1, 4)), "gpu_type": "k80", "gpus": 2}
        ]
    doc["scheduler"] = {
        "round_seconds": 60,
        "lambda": 1.0,
        "priority": draw(st.sampled_from(["fifo", "sjf"])),
    }
    doc["master"] = {"listen": "127.0.0.1:0", "heartbeat_interval_s": 1.0, "suspect_after_s": 3.0}
    doc["tenants"] = [{"name": "a", "guaranteed_gpus": 1, "cap_gpus": 4}, {"name": "b", "weight": 2.0}]
    return doc


@st.composite
def mutated_cluster(draw: st.DrawFn) -> dict[str, Any]:
    doc = draw(valid_cluster())
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from([*SECTION_KEYS, "extra"]))
        if section == "extra":  # an unknown top-level key, or a section of the wrong type
            doc[draw(st.sampled_from([*SECTION_KEYS, "clusters", "server"]) | KEY)] = draw(VALUES)
            continue
        holder = doc.setdefault(section, [{}] if section in ("servers", "server_groups", "tenants") else {})
        if isinstance(holder, list):
            if not holder or not all(isinstance(h, dict) for h in holder):
                continue
            holder = holder[draw(st.integers(0, len(holder) - 1))]
        if not isinstance(holder, dict):
            continue
        key = draw(st.sampled_from(SECTION_KEYS[section]) | KEY)
        how = draw(st.sampled_from(["set", "set", "delete", "calibration"]))
        if how == "delete":
            holder.pop(key, None)
        elif how == "calibration" and section in ("servers", "server_groups"):
            holder["calibration"] = draw(
                st.dictionaries(st.sampled_from(CALIBRATION_KEYS) | KEY, VALUES, max_size=3)
            )
        else:
            holder[key] = draw(VALUES)
    return doc


# -- cluster config: documents written from dicts ------------------------------------------------------------


@FUZZ
@given(doc=mutated_cluster())
def test_toml_documents_load_or_raise_config_error_naming_file_and_key(
    tmp: Path, doc: dict[str, Any]
) -> None:
    text = toml_document(doc)
    note(text)
    assert same(tomllib.loads(text), doc), "the test's TOML writer is wrong"
    path = tmp / "fuzz.toml"
    path.write_text(text, encoding="utf-8")
    try:
        config = load_cluster_config(path)
    except ConfigError as err:
        check_cluster_error(err, str(path), doc)
        with pytest.raises(ConfigError) as again:  # the same verdict for the decoded document
            parse_cluster_config(tomllib.loads(text), str(path))
        assert str(again.value) == str(err)
    else:
        check_cluster_config(config)
        assert parse_cluster_config(tomllib.loads(text), str(path)) == config


# -- cluster config: text mutations of the shipped files ----------------------------------------------------

JUNK_LINES = [
    "[", "[[servers]]", "[[servers]", "[servers]", "[master]", "[scheduler]", "[[tenants]]", "key = ", "= 1",
    'gpus = "8"', "gpus = 8.0", "gpus = -1", "id = 1", "listen = 8470", "insecure = 1", "lambda = nan",
    'x = """', "a.b.c = 1", "servers = []", "tenants = 5", "gpus = 1e999", "#", "\x00", "\ufeff", "[cluster]",
]  # fmt: skip
ASSIGN = re.compile(r"^(\s*[A-Za-z0-9_.\"-]+\s*=\s*)(.*)$")


@st.composite
def mutated_text(draw: st.DrawFn, seed: str) -> bytes:
    lines = seed.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["delete", "duplicate", "swap", "retype", "junk", "retype", "truncate"]))
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        if not lines:
            lines = [draw(st.sampled_from(JUNK_LINES))]
        elif how == "delete":
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "retype":
            assigns = [k for k, line in enumerate(lines) if ASSIGN.match(line)]
            if assigns:
                k = draw(st.sampled_from(assigns))
                head = ASSIGN.match(lines[k]).group(1)  # type: ignore[union-attr]
                lines[k] = head + draw(st.one_of(VALUES.map(toml_value), st.sampled_from(JUNK_LINES), TEXT))
        elif how == "junk":
            lines.insert(i, draw(st.sampled_from(JUNK_LINES) | TEXT))
        elif how == "truncate":
            text = "\n".join(lines)
            cut = draw(st.integers(0, len(text)))
            lines = text[:cut].splitlines()
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if draw(st.integers(0, 7)) == 0:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80abc"])) + data[at:]
    return data


@FUZZ
@given(data=st.data(), which=st.sampled_from(range(len(SEEDS))))
def test_mutated_shipped_configs_load_or_raise_config_error(
    tmp: Path, data: st.DataObject, which: int
) -> None:
    seed = SEEDS[which].read_text(encoding="utf-8")
    raw = data.draw(mutated_text(seed))
    path = tmp / SEEDS[which].name
    path.write_bytes(raw)
    try:
        doc: Any = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        doc = None
    try:
        config = load_cluster_config(path)
    except ConfigError as err:
        check_cluster_error(err, str(path), doc)
        if doc is None and err.reason.startswith("not valid TOML"):
            assert re.search(r"line \d+|end of document", err.reason), err  # where in the file
    else:
        assert doc is not None
        check_cluster_config(config)


def test_seed_configs_load() -> None:
    for path in SEEDS:
        check_cluster_config(load_cluster_config(path))


# -- the test's TOML writer ---------------------------------------------------------------------------------


def test_writer_round_trips_awkward_values() -> None:
    doc = {"a": {"k y": 'q"\\\x00\x7f\u00e9', "n": [math.inf, -math.inf, 1e-5, -0.0], "t": dt.time(1, 2)}}
    parsed = tomllib.loads(toml_document(doc))
    assert parsed["a"]["k y"] == doc["a"]["k y"] and parsed["a"]["n"] == doc["a"]["n"]
