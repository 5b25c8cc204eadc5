"""hopsmgr.config: example files load, bad input gives a ConfigError naming file, key and value."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hopsmgr.config import (
    ClusterConfig,
    ConfigError,
    load_cluster_config,
    load_default_cluster_config,
    parse_cluster_config,
)
from hopsmgr.core.model import TenantQuota
from hopsmgr.core.settings import SchedulerSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "configs").rglob("*.toml"))

GOOD = """\
[cluster]
name = "t"

[[servers]]
id = "a1"
gpu_type = "v100"
gpus = 8

[[servers]]
id = "b1"
gpu_type = "k80"
gpus = 4
[servers.calibration]
data_factor = 0.8

[[server_groups]]
prefix = "g-"
count = 2
gpu_type = "rtx3090"
gpus = 4
host_model = "A"

[scheduler]
round_seconds = 120
lambda = 2

[[tenants]]
name = "x"
guaranteed_gpus = 8
cap_gpus = 12

[[tenants]]
name = "y"
guaranteed_gpus = 4
"""


def write(tmp_path: Path, text: str, name: str = "cluster-under-test.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- good input -----------------------------------------------------------------------------------------


def test_example_files_exist() -> None:
    names = {p.relative_to(REPO / "configs").as_posix() for p in EXAMPLES}
    assert {"demo.toml", "lab.toml", "sim/paper-64.toml", "sim/paper-512.toml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads(path: Path) -> None:
    config = load_cluster_config(path)
    assert config.source == str(path)
    assert config.total_gpus == sum(s.gpus for s in config.servers) > 0
    assert len({s.id for s in config.servers}) == len(config.servers)
    assert sum(t.guaranteed_gpus for t in config.tenants) <= config.total_gpus


@pytest.mark.parametrize(
    ("name", "gpus", "servers", "types"),
    [
        ("sim/paper-64.toml", 64, 10, ("gtx1080ti", "rtx3090", "titanxp")),
        ("sim/paper-512.toml", 512, 64, ("gtx1080ti", "rtx3090", "titanxp")),
    ],
)
def test_paper_clusters(name: str, gpus: int, servers: int, types: tuple[str, ...]) -> None:
    config = load_cluster_config(REPO / "configs" / name)
    assert config.total_gpus == gpus
    assert len(config.servers) == servers
    assert config.gpu_types() == types
    assert all(s.calibration.net_gbps == 12.5 for s in config.servers)
    rtx = [s for s in config.servers if s.gpu_type == "rtx3090"]
    by_model = {s.host_model: s.calibration.data_factor for s in rtx}
    assert by_model["A"] < max(by_model.values())  # the newer-CPU model loads data faster


def test_demo_and_lab_shapes() -> None:
    demo = load_cluster_config(REPO / "configs" / "demo.toml")
    assert len(demo.servers) == 3 and len(demo.gpu_types()) == 3 and len(demo.tenants) == 2
    lab = load_cluster_config(REPO / "configs" / "lab.toml")
    assert len(lab.servers) == 4 and len(lab.gpu_types()) == 2 and len(lab.tenants) == 2
    assert all(t.guaranteed_gpus > 0 for t in lab.tenants)


def test_embedded_default_loads() -> None:
    config = load_default_cluster_config()
    assert isinstance(config, ClusterConfig)
    assert len(config.gpu_types()) >= 2
    assert len({(s.gpu_type, s.host_model) for s in config.servers}) > len(config.gpu_types())
    assert len(config.tenants) == 2
    assert "default-cluster.toml" in config.source


def test_good_file_parses_fully(tmp_path: Path) -> None:
    config = load_cluster_config(write(tmp_path, GOOD))
    assert config.name == "t"
    assert [s.id for s in config.servers] == ["a1", "b1", "g-01", "g-02"]
    assert [s.order for s in config.servers] == [1, 2, 3, 4]
    assert config.total_gpus == 20
    assert config.gpu_types() == ("k80", "rtx3090", "v100")
    b1 = config.servers[1]
    assert b1.calibration.data_factor == 0.8 and b1.calibration.source == "hint"
    assert config.servers[0].calibration.source == "default"
    assert config.servers[2].host_model == "A"
    assert config.scheduler == SchedulerSettings(round_seconds=120.0, lambda_=2.0)
    assert isinstance(config.scheduler.lambda_, float)
    assert config.tenant_map() == {
        "x": TenantQuota("x", 8, 12, 1.0),
        "y": TenantQuota("y", 4, None, 1.0),
    }


def test_the_weights_knee_is_read_from_the_scheduler_table(tmp_path: Path) -> None:
    config = load_cluster_config(
        write(tmp_path, GOOD.replace("lambda = 2", "lambda = 2\nlambda_knee = 1.5\nlambda_below = 0.25"))
    )
    assert (config.scheduler.lambda_, config.scheduler.lambda_knee, config.scheduler.lambda_below) == (
        2.0,
        1.5,
        0.25,
    )
    assert load_cluster_config(write(tmp_path, GOOD)).scheduler.lambda_knee == 0.0  # off unless set


def test_minimal_inline_defaults() -> None:
    config = parse_cluster_config({"servers": [{"id": "s", "gpu_type": "v100", "gpus": 2}]})
    assert config.source == "<inline>"
    assert config.name == "cluster"
    assert config.scheduler == SchedulerSettings()
    assert config.tenants == (TenantQuota("default"),)
    assert config.servers[0].order == 1


def test_name_defaults_to_file_stem_and_explicit_order(tmp_path: Path) -> None:
    text = '[[servers]]\nid = "s"\ngpu_type = "v100"\ngpus = 2\norder = 7\n'
    config = load_cluster_config(write(tmp_path, text, "rack9.toml"))
    assert config.name == "rack9"
    assert config.servers[0].order == 7


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_cluster_config(write(tmp_path, GOOD))
    with pytest.raises(AttributeError):
        config.name = "other"  # type: ignore[misc]


# -- bad input ------------------------------------------------------------------------------------------

BAD: list[tuple[str, str, str, str, str]] = [
    # (case id, old text -> new text applied to GOOD, expected dotted key, expected value repr)
    (
        "unknown top key",
        '[cluster]\nname = "t"',
        '[cluster]\nname = "t"\n[extra]\na = 1',
        "extra",
        "{'a': 1}",
    ),
    ("unknown cluster key", 'name = "t"', 'name = "t"\nnmae = "u"', "cluster.nmae", "'u'"),
    ("unknown server key", "gpus = 8\n", 'gpus = 8\ngpu_typ = "x"\n', "servers[0].gpu_typ", "'x'"),
    (
        "unknown calibration key",
        "data_factor = 0.8",
        "data_fctor = 0.8",
        "servers[1].calibration.data_fctor",
        "0.8",
    ),
    ("unknown group key", "count = 2", "count = 2\ncolor = 3", "server_groups[0].color", "3"),
    ("unknown scheduler key", "round_seconds = 120", "round_second = 120", "scheduler.round_second", "120"),
    ("unknown tenant key", "cap_gpus = 12", "cap_gpu = 12", "tenants[0].cap_gpu", "12"),
    ("gpus zero", "gpus = 8", "gpus = 0", "servers[0].gpus", "0"),
    ("gpus too many", "gpus = 8", "gpus = 65", "servers[0].gpus", "65"),
    ("gpus bool", "gpus = 8", "gpus = true", "servers[0].gpus", "True"),
    ("gpus string", "gpus = 8", 'gpus = "8"', "servers[0].gpus", "'8'"),
    ("gpus float", "gpus = 8", "gpus = 8.0", "servers[0].gpus", "8.0"),
    ("missing gpu_type", 'gpu_type = "v100"\n', "", "servers[0].gpu_type", "nothing"),
    ("uppercase gpu_type", 'gpu_type = "v100"', 'gpu_type = "V100"', "servers[0].gpu_type", "'V100'"),
    ("bad id chars", 'id = "a1"', 'id = "a 1"', "servers[0].id", "'a 1'"),
    ("duplicate id", 'id = "b1"', 'id = "a1"', "servers[1].id", "'a1'"),
    ("group duplicates id", 'id = "b1"', 'id = "g-02"', "server_groups[0].prefix", "'g-02'"),
    ("factor zero", "data_factor = 0.8", "data_factor = 0.0", "servers[1].calibration.data_factor", "0.0"),
    ("factor negative", "data_factor = 0.8", "data_factor = -1", "servers[1].calibration.data_factor", "-1"),
    (
        "factor string",
        "data_factor = 0.8",
        'data_factor = "fast"',
        "servers[1].calibration.data_factor",
        "'fast'",
    ),
    ("factor nan", "data_factor = 0.8", "data_factor = nan", "servers[1].calibration.data_factor", "nan"),
    (
        "calibration not table",
        "[servers.calibration]\ndata_factor = 0.8",
        "calibration = 3",
        "servers[1].calibration",
        "3",
    ),
    ("group count zero", "count = 2", "count = 0", "server_groups[0].count", "0"),
    ("group order negative", "count = 2", "count = 2\norder = -1", "server_groups[0].order", "-1"),
    ("cluster not table", '[cluster]\nname = "t"', 'cluster = "t"', "cluster", "'t'"),
    ("scheduler negative lambda", "lambda = 2", "lambda = -1", "scheduler.lambda", "-1"),
    ("scheduler sigma", "lambda = 2", "sigma = 0.5", "scheduler.sigma", "0.5"),
    ("scheduler bool as number", "lambda = 2", "gap = true", "scheduler.gap", "True"),
    ("scheduler priority", "lambda = 2", 'priority = "random"', "scheduler.priority", "'random'"),
    ("scheduler rnum float", "lambda = 2", "rnum = 2.5", "scheduler.rnum", "2.5"),
    ("scheduler reserve share", "lambda = 2", "reserve_share = 1.5", "scheduler.reserve_share", "1.5"),
    ("scheduler reserve min gpus", "lambda = 2", "reserve_min_gpus = 0", "scheduler.reserve_min_gpus", "0"),
    ("scheduler reserve lr", "lambda = 2", "reserve_after_lr = -1.0", "scheduler.reserve_after_lr", "-1.0"),
    ("scheduler lr guard", "lambda = 2", "lr_guard = -0.5", "scheduler.lr_guard", "-0.5"),
    ("scheduler critical path", "lambda = 2", "critical_path = 1", "scheduler.critical_path", "1"),
    ("scheduler move gain", "lambda = 2", "move_min_gain = -0.1", "scheduler.move_min_gain", "-0.1"),
    ("scheduler gain base", "lambda = 2", 'gain_base = "largest"', "scheduler.gain_base", "'largest'"),
    ("scheduler speed value", "lambda = 2", 'speed_value = "fast"', "scheduler.speed_value", "'fast'"),
    ("scheduler lambda knee", "lambda = 2", "lambda_knee = -1.0", "scheduler.lambda_knee", "-1.0"),
    ("scheduler lr hysteresis", "lambda = 2", "lr_hysteresis = -0.5", "scheduler.lr_hysteresis", "-0.5"),
    ("scheduler lambda below", "lambda = 2", "lambda_below = inf", "scheduler.lambda_below", "inf"),
    (
        "scheduler backfill factor",
        "lambda = 2",
        "backfill_p90_factor = 0.5",
        "scheduler.backfill_p90_factor",
        "0.5",
    ),
    ("scheduler mixed types", "lambda = 2", 'mixed_types = "yes"', "scheduler.mixed_types", "'yes'"),
    ("scheduler reservations", "lambda = 2", "reservations = 1", "scheduler.reservations", "1"),
    ("scheduler window int", "lambda = 2", "window = 1", "scheduler.window", "1"),
    ("scheduler profiling", "lambda = 2", "profiling_iterations = 5", "scheduler.profiling_iterations", "5"),
    ("tenant duplicate", 'name = "y"', 'name = "x"', "tenants[1].name", "'x'"),
    (
        "tenant negative guarantee",
        "guaranteed_gpus = 4",
        "guaranteed_gpus = -4",
        "tenants[1].guaranteed_gpus",
        "-4",
    ),
    ("tenant cap below", "cap_gpus = 12", "cap_gpus = 7", "tenants[0].cap_gpus", "7"),
    (
        "type cap unknown type",
        "cap_gpus = 12",
        "cap_gpus = 12\ncap_gpus_by_type = { a100 = 2 }",
        "tenants[0].cap_gpus_by_type.a100",
        "2",
    ),
    (
        "type cap negative",
        "cap_gpus = 12",
        "cap_gpus = 12\ncap_gpus_by_type = { v100 = -1 }",
        "tenants[0].cap_gpus_by_type.v100",
        "-1",
    ),
    (
        "type cap fraction",
        "cap_gpus = 12",
        "cap_gpus = 12\ncap_gpus_by_type = { k80 = 1.5 }",
        "tenants[0].cap_gpus_by_type.k80",
        "1.5",
    ),
    (
        "type guarantee over the type",
        "cap_gpus = 12",
        "cap_gpus = 12\nguaranteed_gpus_by_type = { k80 = 5 }",
        "tenants[0].guaranteed_gpus_by_type.k80",
        "5",
    ),
    (
        "type guarantee over the cap",
        "cap_gpus = 12",
        "cap_gpus = 12\ncap_gpus_by_type = { v100 = 2 }\nguaranteed_gpus_by_type = { v100 = 3 }",
        "tenants[0].guaranteed_gpus_by_type.v100",
        "3",
    ),
    (
        "type guarantee beside a cap on another type",
        "guaranteed_gpus = 4",
        "guaranteed_gpus = 4\ncap_gpus_by_type = { k80 = 1 }\nguaranteed_gpus_by_type = { v100 = 4, k80 = 2 }",
        "tenants[1].guaranteed_gpus_by_type.k80",
        "2",
    ),
    (
        "type guarantees over cap_gpus",
        "cap_gpus = 12",
        "cap_gpus = 12\nguaranteed_gpus_by_type = { v100 = 2, k80 = 4, rtx3090 = 7 }",
        "tenants[0].guaranteed_gpus_by_type.v100",
        "2",
    ),
    (
        "type guarantee with a zero cap",
        "guaranteed_gpus = 4",
        "guaranteed_gpus = 0\ncap_gpus = 0\nguaranteed_gpus_by_type = { v100 = 1 }",
        "tenants[1].guaranteed_gpus_by_type.v100",
        "1",
    ),
    (
        "type guarantees over the cluster",
        "guaranteed_gpus = 4",
        "guaranteed_gpus = 4\nguaranteed_gpus_by_type = { rtx3090 = 8, k80 = 1 }",
        "tenants[1].guaranteed_gpus_by_type.rtx3090",
        "8",
    ),
    (
        "guarantee over the caps per type",
        "cap_gpus = 12",
        "cap_gpus = 12\ncap_gpus_by_type = { v100 = 0, rtx3090 = 2 }",
        "tenants[0].guaranteed_gpus",
        "8",
    ),
    (
        "type caps not a table",
        "cap_gpus = 12",
        "cap_gpus = 12\ncap_gpus_by_type = 3",
        "tenants[0].cap_gpus_by_type",
        "3",
    ),
    (
        "tenant weight zero",
        "guaranteed_gpus = 4",
        "guaranteed_gpus = 4\nweight = 0",
        "tenants[1].weight",
        "0",
    ),
    ("guarantees exceed", "guaranteed_gpus = 4", "guaranteed_gpus = 13", "tenants[1].guaranteed_gpus", "13"),
    ("tenant missing name", 'name = "y"\n', "", "tenants[1].name", "nothing"),
    ("cluster name int", 'name = "t"', "name = 5", "cluster.name", "5"),
]


@pytest.mark.parametrize(("old", "new", "key", "value"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(tmp_path: Path, old: str, new: str, key: str, value: str) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    err = info.value
    message = str(err)
    assert message.startswith(f"{path}: {key}: "), message
    assert f"(got {value})" in message, message
    assert err.file == str(path) and err.key == key and repr(err.value) == value
    assert err.reason and err.reason in message


def test_no_servers() -> None:
    with pytest.raises(ConfigError, match=r"^x\.toml: servers: at least one server"):
        parse_cluster_config({"servers": []}, source="x.toml")
    with pytest.raises(ConfigError, match=r"servers: .*\(got nothing\)"):
        parse_cluster_config({"cluster": {"name": "c"}}, source="x.toml")


def test_servers_not_array() -> None:
    with pytest.raises(ConfigError, match=r"^x\.toml: servers: must be an array of tables \(got 'a'\)"):
        parse_cluster_config({"servers": "a"}, source="x.toml")
    with pytest.raises(ConfigError, match=r"^x\.toml: servers\[0\]: must be a table \(got 3\)"):
        parse_cluster_config({"servers": [3]}, source="x.toml")


def test_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^<inline>: must be a table \(got \[1, 2\]\)"):
        parse_cluster_config([1, 2])  # type: ignore[arg-type]


def test_huge_int_is_config_error() -> None:
    data = {"servers": [{"id": "s", "gpu_type": "v", "gpus": 1, "calibration": {"link_gbps": 10**400}}]}
    with pytest.raises(ConfigError, match=r"servers\[0\]\.calibration\.link_gbps"):
        parse_cluster_config(data)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("gpus = 4\n", "gpus 4\n", 1))
    bad_line = GOOD.splitlines().index("gpus = 4") + 1
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid TOML")
    assert f"line {bad_line}" in message
    assert "(got 'gpus 4')" in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    assert str(info.value).startswith(f"{path}: cannot read the file")
    assert info.value.file == str(path)


def test_directory_and_non_utf8(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_cluster_config(tmp_path)
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[cluster]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_cluster_config(path)


def test_error_pickles_and_is_value_error() -> None:
    err = ConfigError("f.toml", "servers[0].gpus", 0, "must be an integer in [1, 64]")
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) == "f.toml: servers[0].gpus: must be an integer in [1, 64] (got 0)"


# -- junk never escapes as anything but ConfigError -----------------------------------------------------

KEYS = [
    "cluster", "servers", "server_groups", "scheduler", "tenants", "name", "id", "gpu_type", "gpus",
    "host_model", "order", "calibration", "compute_factor", "data_factor", "net_gbps", "prefix", "count",
    "lambda", "round_seconds", "priority", "rnum", "gap", "window", "guaranteed_gpus", "cap_gpus", "weight",
]  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.integers(min_value=-3, max_value=70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["v100", "a1", "latency_ratio", "g-", ""])
)
JUNK = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=30,
)


def _valid_base() -> dict[str, Any]:
    return {
        "servers": [{"id": "a", "gpu_type": "v100", "gpus": 4}],
        "server_groups": [{"prefix": "g", "count": 2, "gpu_type": "k80", "gpus": 2}],
        "scheduler": {"lambda": 1.0},
        "tenants": [{"name": "t", "guaranteed_gpus": 2}],
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), JUNK, max_size=6))
def test_junk_dicts_only_raise_config_error(data: dict[str, Any]) -> None:
    try:
        parse_cluster_config(data, source="junk.toml")
    except ConfigError as err:
        assert str(err).startswith("junk.toml: ")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    section=st.sampled_from(["servers", "server_groups", "scheduler", "tenants"]),
    field=st.sampled_from(KEYS),
    junk=JUNK,
)
def test_junk_in_valid_document_only_raises_config_error(section: str, field: str, junk: object) -> None:
    data = copy.deepcopy(_valid_base())
    target = data[section][0] if isinstance(data[section], list) else data[section]
    target[field] = junk
    try:
        config = parse_cluster_config(data, source="junk.toml")
    except ConfigError as err:
        assert str(err).startswith("junk.toml: ")
    else:
        assert config.total_gpus > 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("planner", '"gpu"'),
        ("plan_deadline_s", "-1"),
        ("plan_deadline_s", "true"),
        ("plan_deadline_s", "7200"),
    ],
)
def test_planner_settings_are_checked_naming_the_key(tmp_path: Path, key: str, value: str) -> None:
    text = '[[servers]]\nid = "a"\ngpu_type = "v100"\ngpus = 4\n\n[master]\n' + f"{key} = {value}\n"
    with pytest.raises(ConfigError, match=rf"master\.{key}"):
        load_cluster_config(write(tmp_path, text))


def test_caps_per_gpu_type_are_read_sorted_and_absent_by_default(tmp_path: Path) -> None:
    text = GOOD.replace(
        "cap_gpus = 12", "cap_gpus = 12\ncap_gpus_by_type = { v100 = 4, k80 = 0, rtx3090 = 8 }", 1
    )
    x, y = load_cluster_config(write(tmp_path, text)).tenants
    assert x.type_caps == (("k80", 0), ("rtx3090", 8), ("v100", 4))
    assert x.cap_of_type("v100") == 4 and x.cap_of_type("a100") is None
    assert y.type_caps == ()


def test_guarantees_per_gpu_type_are_read_sorted(tmp_path: Path) -> None:
    text = GOOD.replace('name = "y"', 'name = "y"\nguaranteed_gpus_by_type = { v100 = 2, k80 = 1 }', 1)
    _, y = load_cluster_config(write(tmp_path, text)).tenants
    assert y.type_guarantees == (("k80", 1), ("v100", 2))
