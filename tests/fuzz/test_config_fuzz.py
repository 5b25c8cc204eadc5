"""Property-based fuzzing of the TOML configurations: the cluster file and the agent file.

Extends tests/unit/test_config.py (junk Python dicts into four sections) with: whole TOML documents
written by a small TOML writer from dicts with the real keys of every section ([master] and
[scheduler] keys come from their dataclasses), random text mutations of the shipped configs
(configs/lab.toml and friends: lines deleted, duplicated, swapped, values of another type, junk lines,
truncation, bytes that are not UTF-8), and the agent's config. The property: the loader either returns
a config or raises ConfigError whose message starts with the file and names a key that the document
holds (or a required one it lacks); TOML and UTF-8 errors name the file (and the TOML line). Never
another exception type.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, note, settings
from hypothesis import strategies as st

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hopsmgr_agent.config import AgentConfig, load_agent_config, parse_agent_config

from hopsmgr.config import ClusterConfig, ConfigError, load_cluster_config, parse_cluster_config
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master.settings import MasterSettings

REPO = Path(__file__).resolve().parents[2]
SEEDS = [
    REPO / "configs" / "lab.toml",
    REPO / "configs" / "demo.toml",
    REPO / "hopsmgr" / "data" / "demo-cluster.toml",
]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# -- a small TOML writer ------------------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    return key if _BARE.fullmatch(key) else toml_string(key)


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {value!r}")


def toml_document(doc: Mapping[str, Any]) -> str:
    """Top-level scalars first, then [tables] and [[arrays of tables]]; anything nested is inline."""
    lines: list[str] = []
    tables: list[str] = []
    for key, value in doc.items():
        if isinstance(value, dict):
            tables.append(f"[{toml_key(key)}]")
            tables += [f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                tables.append(f"[[{toml_key(key)}]]")
                tables += [f"{toml_key(k)} = {toml_value(v)}" for k, v in item.items()]
        else:
            lines.append(f"{toml_key(key)} = {toml_value(value)}")
    return "\n".join([*lines, *tables]) + "\n"


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


def key_in(node: Any, key: str) -> bool:
    """Whether a dotted key ("servers[2].calibration.net_gbps") leads through the document `node`; the
    last name may be absent (a required key that is missing). Names may hold '.' or '[' themselves."""
    if isinstance(node, dict):
        for key_name, value in node.items():
            name = key_name or '""'  # an empty key is shown as ""
            if key == name:
                return True
            if key.startswith(name + ".") and key_in(value, key[len(name) + 1 :]):
                return True
            if key.startswith(name + "[") and key_in(value, key[len(name) :]):
                return True
        return bool(re.fullmatch(r"[A-Za-z_]+", key))  # a required key that is missing
    match = re.match(r"\[(\d+)\]", key)
    if isinstance(node, list) and match and int(match.group(1)) < len(node):
        item, rest = node[int(match.group(1))], key[match.end() :]
        return rest == "" or key_in(item, rest[1:] if rest.startswith(".") else rest)
    return False


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


def tally(what: str) -> None:
    """Count an outcome in hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    if currently_in_test_context():
        event(what)


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="configfuzz") as d:
        yield Path(d)


# -- strategies ----------------------------------------------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
KEY = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # "" too: a valid TOML key
SCALARS = st.one_of(
    st.booleans(),
    st.integers(),
    st.integers(-3, 70),
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 10**30, 65536]),
    st.floats(),
    st.sampled_from([0.0, -0.0, 1e-300, 1e308, 0.5]),
    TEXT,
    st.sampled_from(["", "v100", "a b", "gpu01", "127.0.0.1:0", "0.0.0.0:1", "ssh", "local", "fifo", "auto"]),
    st.datetimes(),
    st.dates(),
    st.times(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEY, inner, max_size=3),
    max_leaves=8,
)
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


# -- agent config --------------------------------------------------------------------------------------------

AGENT_KEYS = (
    "node", "master", "cluster_token_file", "cluster_token", "workdir", "devices", "gpu_type", "calibrate",
    "calibration_budget_s", "probe_port", "peers", "emulated", "cpu", "tls_ca",
)  # fmt: skip
# paths the agent may be given: missing, a directory, with a NUL byte (see also the regression tests)
TOKEN_FILE_VALUES = st.sampled_from(["", "token", "missing/file", "/", ".", "/nonexistent/x", "a\x00b"])


@st.composite
def agent_document(draw: st.DrawFn, token_file: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "node": draw(st.sampled_from(["gpu01", "n-1", "a.b"])),
        "master": draw(st.sampled_from(["http://127.0.0.1:8470", "https://head01:8470"])),
        "workdir": "/var/lib/hopsmgr/node",
        "devices": draw(st.sampled_from(["emulated", "cpu", "nvml"])),
    }
    if draw(st.booleans()):
        doc["cluster_token_file"] = str(token_file)
    else:
        doc["cluster_token"] = "x" * 43
    if doc["devices"] == "emulated":
        doc["emulated"] = {"gpu_type": "v100", "count": draw(st.integers(1, 8)), "speed": 1.0}
    elif doc["devices"] == "cpu" and draw(st.booleans()):
        doc["cpu"] = {"gpu_type": "cpu", "count": 2}
    optional = {
        "calibrate": st.sampled_from(["start", "never"]),
        "calibration_budget_s": st.integers(1, 3600),
        "probe_port": st.integers(0, 65535),
        "peers": st.lists(st.sampled_from(["gpu02:8471", "[::1]:1", "h:65535"]), max_size=3),
        "tls_ca": st.just("/etc/hopsmgr/tls/ca.pem"),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        doc[key] = draw(optional[key])
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(AGENT_KEYS) | KEY)
        how = draw(st.sampled_from(["set", "set", "delete", "table"]))
        if how == "delete":
            doc.pop(key, None)
        elif key == "cluster_token_file":  # a path, a file that is not UTF-8, or not a string at all
            bad = token_file.parent / "not-utf8.token"
            doc[key] = draw(TOKEN_FILE_VALUES | st.just(str(bad)) | VALUES)
        elif how == "table" and key in ("emulated", "cpu"):
            doc[key] = draw(
                st.dictionaries(st.sampled_from(["gpu_type", "count", "speed"]) | KEY, VALUES, max_size=3)
            )
        else:
            doc[key] = draw(VALUES)
    return doc


@FUZZ
@given(data=st.data())
def test_agent_configs_load_or_raise_config_error_naming_file_and_key(tmp: Path, data: st.DataObject) -> None:
    token_file = tmp / "cluster.token"
    token_file.write_text("t" * 43 + "\n")
    (tmp / "not-utf8.token").write_bytes(b"\xff\xfe" * 20)
    doc = data.draw(agent_document(token_file))
    text = toml_document(doc)
    note(text)
    path = tmp / "agent.toml"
    path.write_text(text, encoding="utf-8")
    for how in ("parse", "load"):
        try:
            config = (
                parse_agent_config(copy.deepcopy(doc), str(path))
                if how == "parse"
                else load_agent_config(str(path))
            )
        except ConfigError as err:
            message = str(err)
            assert message.startswith(f"{path}: {err.key}: "), message
            assert err.key and key_in(doc, err.key), f"{err.key!r} is not in the document: {message}"
            root = re.split(r"[.[]", err.key)[0]
            tally(f"ConfigError at {root if root in AGENT_KEYS else 'an unknown key'}")
        else:
            assert isinstance(config, AgentConfig)
            tally("loaded")
            assert config.node == doc["node"] and config.master.startswith(("http://", "https://"))
            assert config.devices in ("nvml", "cpu", "emulated") and config.workdir.startswith("/")


# -- regression tests: what the property tests above found (fixed in fb2c0ab) -----------------------------
# The agent's cluster_token_file raised ValueError (NUL in the path), UnicodeDecodeError (a file that is not
# UTF-8) or TypeError (not a string) instead of ConfigError; cluster_token = 5, tls_ca = [1], a hostless
# master URL and a NUL in workdir were accepted; an empty TOML key was refused without being named.


@pytest.mark.parametrize("case", ["nul-in-path", "not-utf8-file", "not-a-string"])
def test_agent_token_file_problems_are_config_errors(tmp: Path, case: str) -> None:
    bad = tmp / "bad.token"
    bad.write_bytes(b"\xff\xfe" * 20)
    value: Any = {"nul-in-path": str(tmp / "a\x00b"), "not-utf8-file": str(bad), "not-a-string": 5}[case]
    doc = {"node": "n1", "master": "http://127.0.0.1:1", "workdir": "/w", "cluster_token_file": value}
    doc["emulated"] = {"gpu_type": "v100", "count": 1}
    with pytest.raises(ConfigError) as info:
        parse_agent_config(doc, "agent.toml")
    assert info.value.key == "cluster_token_file"


@pytest.mark.parametrize(
    ("key", "value"),
    [("cluster_token", 5), ("tls_ca", [1]), ("master", "https://"), ("workdir", "/var/a\x00b")],
)
def test_agent_config_refuses_values_of_the_wrong_type(key: str, value: Any) -> None:
    doc: dict[str, Any] = {
        "node": "n1",
        "master": "http://127.0.0.1:1",
        "workdir": "/w",
        "cluster_token": "t" * 43,
    }
    doc["emulated"] = {"gpu_type": "v100", "count": 1}
    doc[key] = value
    with pytest.raises(ConfigError) as info:
        parse_agent_config(doc, "agent.toml")
    assert info.value.key == key


@pytest.mark.parametrize("which", ["cluster", "cluster-section", "agent"])
def test_an_empty_key_is_named_in_the_error(tmp: Path, which: str) -> None:
    path = tmp / "empty-key.toml"
    if which == "agent":
        path.write_text('node = "n1"\nmaster = "http://h:1"\nworkdir = "/w"\ncluster_token = "t"\n"" = 1\n')
        with pytest.raises(ConfigError) as info:
            load_agent_config(str(path))
    else:
        extra = '"" = 1\n[[servers]]\n' if which == "cluster" else '[[servers]]\n"" = 1\n'
        path.write_text(extra + 'id = "a"\ngpu_type = "v100"\ngpus = 1\n')
        with pytest.raises(ConfigError) as info:
            load_cluster_config(path)
    assert '""' in str(info.value) or "''" in str(info.value), str(info.value)


def test_writer_round_trips_awkward_values() -> None:
    doc = {"a": {"k y": 'q"\\\x00\x7f\u00e9', "n": [math.inf, -math.inf, 1e-5, -0.0], "t": dt.time(1, 2)}}
    parsed = tomllib.loads(toml_document(doc))
    assert parsed["a"]["k y"] == doc["a"]["k y"] and parsed["a"]["n"] == doc["a"]["n"]
