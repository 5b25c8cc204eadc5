"""Agent config: the device modes, calibration keys and probe settings, and errors naming file, key, value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hopsmgr_agent.config import load_agent_config, parse_agent_config

from hopsmgr.config import ConfigError

BASE: dict[str, Any] = {
    "node": "n1",
    "master": "http://127.0.0.1:8470",
    "cluster_token": "t",
    "workdir": "/w",
}


def parse(**extra: Any) -> Any:
    return parse_agent_config({**BASE, **extra}, "agent.toml")


def test_defaults_keep_the_existing_emulated_behaviour() -> None:
    c = parse(emulated={"gpu_type": "v100", "count": 2})
    assert (c.devices, c.gpu_type, c.count, c.speed) == ("emulated", "v100", 2, 1.0)
    assert (c.calibrate, c.calibration_budget_s, c.probe_port, c.peers) == ("start", 60.0, 0, ())


def test_cpu_mode_defaults_and_overrides() -> None:
    c = parse(devices="cpu")
    assert (c.devices, c.gpu_type, c.count) == ("cpu", "cpu", 1)
    c = parse(devices="cpu", cpu={"gpu_type": "xeon", "count": 2})
    assert (c.gpu_type, c.count) == ("xeon", 2)


def test_nvml_mode_with_type_override_calibration_and_probe() -> None:
    c = parse(
        devices="nvml",
        gpu_type="a100",
        calibrate="never",
        calibration_budget_s=20,
        probe_port=8471,
        peers=["gpu02:8471", "10.0.0.3:9000", "[fe80::1]:8471"],
    )
    assert (c.devices, c.gpu_type, c.calibrate, c.calibration_budget_s) == ("nvml", "a100", "never", 20.0)
    assert c.probe_port == 8471
    assert c.peers == (("gpu02", 8471), ("10.0.0.3", 9000), ("fe80::1", 8471))


@pytest.mark.parametrize(
    ("extra", "key", "value"),
    [
        ({"devices": "gpu"}, "devices", "'gpu'"),
        ({"devices": "cpu", "gpu_type": "h100"}, "gpu_type", "'h100'"),
        ({"devices": "nvml", "gpu_type": ""}, "gpu_type", "''"),
        ({"devices": "cpu", "cpu": {"count": 0}}, "cpu.count", "0"),
        ({"devices": "cpu", "cpu": {"count": True}}, "cpu.count", "True"),
        ({"devices": "cpu", "cpu": {"gpu_type": 3}}, "cpu.gpu_type", "3"),
        ({"devices": "cpu", "cpu": {"speed": 1.0}}, "cpu.speed", "1.0"),
        ({"devices": "cpu", "cpu": "fast"}, "cpu", "'fast'"),
        ({"devices": "nvml", "calibrate": "always"}, "calibrate", "'always'"),
        ({"devices": "nvml", "calibration_budget_s": 0}, "calibration_budget_s", "0"),
        ({"devices": "nvml", "calibration_budget_s": "60"}, "calibration_budget_s", "'60'"),
        ({"devices": "nvml", "probe_port": 70000}, "probe_port", "70000"),
        ({"devices": "nvml", "probe_port": -1}, "probe_port", "-1"),
        ({"devices": "nvml", "peers": "gpu02:8471"}, "peers", "'gpu02:8471'"),
        ({"devices": "nvml", "peers": ["gpu02"]}, "peers[0]", "'gpu02'"),
        ({"devices": "nvml", "peers": ["ok:1", "gpu02:0"]}, "peers[1]", "'gpu02:0'"),
        ({"devices": "nvml", "peers": [":8471"]}, "peers[0]", "':8471'"),
        ({"devices": "nvml", "peers": [8471]}, "peers[0]", "8471"),
        ({"devices": "nvml", "calibration": "start"}, "calibration", "'start'"),
        # an empty key is named as "" (found by tests/fuzz/test_config_fuzz.py)
        ({"emulated": {"": []}}, 'emulated.""', "[]"),
        ({"devices": "cpu", "cpu": {"": 1}}, 'cpu.""', "1"),
    ],
)
def test_errors_name_file_key_and_value(extra: dict[str, Any], key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(**extra)
    assert info.value.file == "agent.toml" and info.value.key == key
    assert f"agent.toml: {key}: " in str(info.value) and f"(got {value})" in str(info.value)


def test_toml_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        'node = "cpu01"\nmaster = "http://127.0.0.1:8470"\ncluster_token = "t"\n'
        f'workdir = "{tmp_path}"\ndevices = "cpu"\ncalibration_budget_s = 15\nprobe_port = 8471\n'
        'peers = ["cpu02:8471"]\n[cpu]\ncount = 2\n'
    )
    c = load_agent_config(str(path))
    assert (c.devices, c.count, c.calibration_budget_s, c.peers) == ("cpu", 2, 15.0, (("cpu02", 8471),))


def test_several_masters_as_a_list_or_comma_separated() -> None:
    emu = {"gpu_type": "v100", "count": 1}
    listed = parse(master=["http://head01:8470/", "https://head02:8470"], emulated=emu)
    joined = parse(master="http://head01:8470, https://head02:8470", emulated=emu)
    assert listed.masters == joined.masters == ("http://head01:8470", "https://head02:8470")
    assert parse(emulated=emu).masters == ("http://127.0.0.1:8470",)


@pytest.mark.parametrize("value", [["http://head01:8470", "ftp://head02"], "http://head01:8470,", []])
def test_a_bad_master_list_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse(master=value, emulated={"gpu_type": "v100", "count": 1})
    assert info.value.key == "master"
