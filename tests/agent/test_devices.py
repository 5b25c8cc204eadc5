"""GPU discovery against a fake NVML module (the hardware edge), device-name mapping, and the agent's
device report in each mode."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hopsmgr_agent.config import parse_agent_config
from hopsmgr_agent.devices import DeviceError, discover, gpu_type_of
from hopsmgr_agent.main import Agent

from hopsmgr.protocol import parse_heartbeat
from tests.agent.fake_nvml import BUS, FakeNVML, NVMLError_LibraryNotFound
from tests.helpers.wire import through_json


def test_two_gpus_joined_by_nvlink() -> None:
    # GPU 0 has four links to GPU 1 and GPU 1 four back; NVML spells the remote bus id with a short domain
    nvml = FakeNVML(
        [("NVIDIA H200", BUS[0]), ("NVIDIA H200", BUS[1])],
        links=[["0000:3b:00.0"] * 4, ["0000:19:00.0"] * 4],
        topology={(0, 1): 10},
    )
    inv = discover(nvml)
    assert nvml.shutdown
    assert inv.driver_version == "550.54.15"
    assert [g.name for g in inv.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert inv.gpus[1].pci_bus_id == BUS[1] and inv.gpus[1].uuid == "GPU-00000001-fake"
    assert inv.gpus[0].memory_total_bytes == 141 << 30 and inv.gpus[0].compute_capability == (9, 0)
    assert inv.gpus[1].utilization_gpu_pct == 10.0 and inv.gpus[1].memory_used_bytes == 1 << 30
    assert inv.nvlink_pairs == {(0, 1): 4} and inv.nvswitch_links == {}
    assert inv.topology == {(0, 1): "single"}
    assert inv.nvlinked(1, 0)
    assert inv.gpu_type == "h200"
    assert inv.to_json()["nvlink_pairs"] == {"0-1": 4}


def test_nvswitch_links_and_unsupported_queries_are_tolerated() -> None:
    # GPUs 0 and 1 each reach an NVSwitch (a bus id that is not a GPU); GPU 2 has no NVLink and no topology
    switch = "00000000:C0:00.0"
    nvml = FakeNVML(
        [
            ("NVIDIA A100-SXM4-80GB", BUS[0]),
            ("NVIDIA A100-SXM4-80GB", BUS[1]),
            ("NVIDIA A100-SXM4-80GB", "0:5e:0.0"),
        ],
        links=[[switch] * 12, [switch] * 12, None],
    )
    inv = discover(nvml)
    assert inv.nvswitch_links == {0: 12, 1: 12} and inv.nvlink_pairs == {}
    assert inv.nvlinked(0, 1) and not inv.nvlinked(0, 2)
    assert inv.topology == {}
    assert inv.gpu_type == "a100"


@pytest.mark.parametrize(
    ("name", "gpu_type"),
    [
        ("NVIDIA H200", "h200"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("Tesla V100-PCIE-32GB", "v100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("Tesla K80", "k80"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("Tesla T4", "t4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA GeForce GTX 1080 Ti", "gtx1080ti"),
        ("NVIDIA TITAN Xp", "titanxp"),
        ("NVIDIA A10G", "a10g"),
    ],
)
def test_device_names_map_to_gpu_types(name: str, gpu_type: str) -> None:
    assert gpu_type_of(name) == gpu_type


def test_mixed_gpu_models_need_an_explicit_type() -> None:
    inv = discover(FakeNVML([("NVIDIA H200", BUS[0]), ("NVIDIA H100 80GB HBM3", BUS[1])]))
    with pytest.raises(DeviceError, match=r'mixes GPU models.*gpu_type = "\.\.\."'):
        _ = inv.gpu_type


def test_missing_bindings_name_the_package_and_suggest_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(DeviceError) as info:
        discover()
    assert "nvidia-ml-py" in str(info.value) and 'devices = "emulated"' in str(info.value)


def test_missing_driver_names_the_library_and_suggests_emulated() -> None:
    nvml = FakeNVML([], init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    with pytest.raises(DeviceError) as info:
        discover(nvml)
    message = str(info.value)
    assert "libnvidia-ml.so.1" in message and "NVMLError_LibraryNotFound" in message
    assert 'devices = "emulated"' in message


def test_no_gpu_is_an_error() -> None:
    with pytest.raises(DeviceError, match="finds no GPU"):
        discover(FakeNVML([]))


def test_real_nvml_on_a_machine_without_a_driver_explains() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with an NVIDIA driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    with pytest.raises(DeviceError, match=r"NVML could not start.*emulated"):
        discover()


def _config(tmp_path: Path, **extra: Any) -> Any:
    base = {"node": "n1", "master": "http://127.0.0.1:1", "cluster_token": "t", "workdir": str(tmp_path)}
    return parse_agent_config({**base, **extra}, "agent.toml")


def test_agent_reports_nvml_devices_in_a_valid_heartbeat(tmp_path: Path) -> None:
    nvml = FakeNVML([("NVIDIA H200", BUS[0]), ("NVIDIA H200", BUS[1])])
    agent = Agent(_config(tmp_path, devices="nvml", calibrate="never"), discover(nvml))
    beat = through_json(agent.report(), parse_heartbeat)
    assert (beat.gpu_type, beat.gpus, beat.device_mode) == ("h200", 2, "nvml")
    assert beat.calibration is None and beat.calibration_source == ""
    override = Agent(_config(tmp_path, devices="nvml", gpu_type="h200-nvl"), discover(nvml))
    assert through_json(override.report(), parse_heartbeat).gpu_type == "h200-nvl"


def test_emulated_agent_is_labelled_emulated_and_never_calibrates(tmp_path: Path) -> None:
    config = _config(tmp_path, emulated={"gpu_type": "v100", "count": 4, "speed": 1.3})
    agent = Agent(config)
    assert not agent.start_calibration("test")
    beat = through_json(agent.report(), parse_heartbeat)
    assert beat.device_mode == "emulated" and beat.calibration_source == "emulated"
    assert beat.calibration == {"compute_factor": 1.3, "memory_factor": 1.3, "data_factor": 1.0}


def test_agent_command_without_nvml_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hopsmgr_agent.main import main

    monkeypatch.setitem(sys.modules, "pynvml", None)  # as on a machine without nvidia-ml-py
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'node = "g1"\nmaster = "http://127.0.0.1:1"\ncluster_token = "t"\nworkdir = "{tmp_path}"\n'
        'devices = "nvml"\n'
    )
    assert main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f'{cfg}: devices = "nvml"' in err and "nvidia-ml-py" in err and 'devices = "emulated"' in err


def test_ended_attempts_with_long_escaped_logs_go_out_in_beats_the_master_accepts(tmp_path: Path) -> None:
    # Twelve attempts end at once, each printing 5,000 control characters (6 bytes each in JSON): in
    # one beat they would be ~290 KB against the master's 64 KiB. The agent reports as many as fit
    # and the rest in the next beats, until the master has acknowledged them all.
    import asyncio
    import json
    import sys

    from hopsmgr.master.api import MAX_BODY
    from hopsmgr.node import ops
    from hopsmgr.protocol import HeartbeatReply
    from tests.integration.cluster import wait_for

    agent = Agent(_config(tmp_path, emulated={"gpu_type": "v100", "count": 4, "speed": 1.0}))
    script = "import sys; sys.stdout.write('\\x01' * 5000); sys.stdout.flush()"
    for k in range(12):
        ops.launch(tmp_path, f"a-{k:06d}", f"j-{k:06d}", 1, [sys.executable, "-c", script])

    def ended() -> bool:
        return all(a["state"] != "running" for a in ops.status(tmp_path)["attempts"])

    wait_for(ended, 60, "the attempts to end")
    reported: list[str] = []
    for _ in range(12):
        beat = agent.report()
        body = json.dumps(beat.to_json())
        assert len(body.encode()) < MAX_BODY
        parsed = through_json(beat, parse_heartbeat)
        if not parsed.finished:
            break
        assert all(len(f.log_tail) == 4000 for f in parsed.finished)  # the agent's tail of the log
        reported += [f.attempt for f in parsed.finished]
        ack = tuple(f.attempt for f in parsed.finished)
        asyncio.run(agent.apply(HeartbeatReply(epoch=1, interval_s=1.0, ack=ack)))
    assert sorted(reported) == [f"a-{k:06d}" for k in range(12)]
    assert len(reported) == len(set(reported))
