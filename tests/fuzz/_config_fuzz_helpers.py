"""Shared by the configuration fuzz tests (test_config_fuzz.py: the cluster file; test_config_fuzz_agent.py:
the agent file): hypothesis' settings, a small TOML writer, the check that the key an error names is in the
document, an outcome tally for hypothesis' statistics, and strategies for TOML keys and values.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, currently_in_test_context, event, settings
from hypothesis import strategies as st

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


def tally(what: str) -> None:
    """Count an outcome in hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    if currently_in_test_context():
        event(what)


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
