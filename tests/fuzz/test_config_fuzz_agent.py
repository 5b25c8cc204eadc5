"""Property-based fuzzing of the agent's TOML configuration file, and regression tests for what the fuzzing
of both configuration files found.

Agent documents with the real keys (node, master, the token or its file, the devices and their tables, the
optional keys) are written by the TOML writer of tests/fuzz/_config_fuzz_helpers.py after random changes:
keys deleted, set to values of any type or to tables, the token file missing, a directory, not UTF-8, a
path with a NUL byte. The property, as for the cluster file (tests/fuzz/test_config_fuzz.py): parsing the
document and loading the file either return an AgentConfig or raise ConfigError whose message starts with
the file and names a key that the document holds (or a required one it lacks). Never another exception
type.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from hopsmgr_agent.config import AgentConfig, load_agent_config, parse_agent_config
from hypothesis import given, note
from hypothesis import strategies as st

from hopsmgr.config import ConfigError, load_cluster_config
from tests.fuzz._config_fuzz_helpers import FUZZ, KEY, VALUES, key_in, tally, toml_document

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


# -- regression tests: what the property tests found, here and in test_config_fuzz.py (fixed in fb2c0ab) ---
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
