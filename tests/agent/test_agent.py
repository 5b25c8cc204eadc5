"""The agent with real calibration on the CPU: started by the master's reply, saved and reused, and end to
end through a real master process (heartbeats first, measured calibration when the kernels are done)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hopsmgr_agent.config import AgentConfig, parse_agent_config
from hopsmgr_agent.devices import discover
from hopsmgr_agent.main import Agent
from hopsmgr_agent.probe import ProbeError, measure_peer

from hopsmgr.core.model import Calibration
from hopsmgr.protocol import HeartbeatReply, parse_heartbeat
from tests.helpers.wire import through_json
from tests.integration.cluster import PYTHON, LocalCluster, Node, wait_for

torch = pytest.importorskip("torch")


def cpu_config(workdir: Path, **extra: Any) -> AgentConfig:
    data = {
        "node": "cpu01",
        "master": "http://127.0.0.1:1",
        "cluster_token": "t",
        "workdir": str(workdir),
        "devices": "cpu",
        "calibration_budget_s": 2,
        **extra,
    }
    return parse_agent_config(data, "agent.toml")


def test_master_reply_starts_a_calibration_then_never_reuses_it(tmp_path: Path) -> None:
    agent = Agent(cpu_config(tmp_path, calibrate="never"))
    agent.start_background()  # "never" with nothing saved: no calibration yet
    beat = through_json(agent.report(), parse_heartbeat)
    assert (beat.device_mode, beat.gpu_type, beat.gpus, beat.calibration) == ("cpu", "cpu", 1, None)

    calibrator = agent.calibrator
    assert calibrator is not None and calibrator.latest is None
    asyncio.run(agent.apply(HeartbeatReply(epoch=1, interval_s=1.0, calibrate=True)))
    assert calibrator.running()
    assert not agent.start_calibration("again")  # one run at a time
    wait_for(lambda: calibrator.runs == 1, 60, "calibration", lambda: calibrator.error)
    beat = through_json(agent.report(), parse_heartbeat)
    assert beat.calibration_source == "measured-cpu" and beat.calibration is not None
    assert Calibration(**beat.calibration, source=beat.calibration_source).compute_factor > 0

    saved = json.loads((tmp_path / "calibration.json").read_text())
    assert saved["device"] == "cpu" and saved["factors"] == beat.calibration
    assert {m["device"] for m in saved["measurements"]} == {"cpu"}

    again = Agent(cpu_config(tmp_path, calibrate="never"))
    again.start_background()
    assert again.calibrator is not None and not again.calibrator.running()
    assert through_json(again.report(), parse_heartbeat).calibration == beat.calibration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cpu_agent_end_to_end_with_a_real_master(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, [Node("cpu01", "cpu", 1)])
    try:
        cluster.start_master()
        port = free_port()
        workdir = tmp_path / "nodes" / "cpu01"
        cfg = tmp_path / "agent-cpu01.toml"
        cfg.write_text(
            f'node = "cpu01"\nmaster = "{cluster.url}"\n'
            f'cluster_token_file = "{cluster.state_dir / "cluster.token"}"\n'
            f'workdir = "{workdir}"\ndevices = "cpu"\ncalibration_budget_s = 3\nprobe_port = {port}\n'
        )
        with open(tmp_path / "agent.log", "ab") as log:
            cluster.agents["cpu01"] = subprocess.Popen(
                [PYTHON, "-m", "hopsmgr_agent.main", "--config", str(cfg), "--json-logs"],
                stdout=log,
                stderr=log,
            )

        def node() -> dict[str, Any]:
            return dict(cluster.api("GET", "/api/v1/nodes")["nodes"][0])

        def show() -> str:
            return f"{node()} / {(tmp_path / 'agent.log').read_text()[-2000:]}"

        wait_for(lambda: node()["health"] == "HEALTHY", 30, "cpu node healthy", show)
        wait_for(lambda: node()["calibration"]["source"] == "measured-cpu", 60, "measured calibration", show)
        n = node()
        assert n["device_mode"] == "cpu" and not n["emulated"]
        assert n["calibration"]["compute_factor"] > 0 and n["calibration"]["net_gbps"] == 12.5
        assert json.loads((workdir / "calibration.json").read_text())["source"] == "measured-cpu"
        # the agent serves the probe sink on its probe port
        deadline = time.monotonic() + 10
        while True:
            try:
                assert measure_peer("127.0.0.1", port, 1 << 20, timeout_s=5) > 0
                break
            except ProbeError:
                assert time.monotonic() < deadline, "probe sink not reachable"
                time.sleep(0.1)
        assert '"probe_sink_listening"' in (tmp_path / "agent.log").read_text()
        # the operator asks for a new run: the master tells the agent in its next reply
        first = json.loads((workdir / "calibration.json").read_text())["started_at"]
        cluster.api("POST", "/api/v1/nodes/cpu01/calibrate")

        def recalibrated() -> bool:
            return bool(json.loads((workdir / "calibration.json").read_text())["started_at"] > first)

        wait_for(recalibrated, 60, "a second calibration run", show)
        done = '"calibration_done"'
        wait_for(lambda: (tmp_path / "agent.log").read_text().count(done) == 2, 10, "second run taken", show)
    finally:
        cluster.close()


def test_gpu_calibration_without_cuda_fails_visibly_and_beats_go_on(tmp_path: Path) -> None:
    if torch.cuda.is_available():  # pragma: no cover - a GPU machine calibrates for real
        pytest.skip("CUDA is available here")

    from tests.agent.test_devices import BUS, FakeNVML

    config = parse_agent_config(
        {
            "node": "g1",
            "master": "http://127.0.0.1:1",
            "cluster_token": "t",
            "workdir": str(tmp_path),
            "devices": "nvml",
            "calibration_budget_s": 2,
        },
        "agent.toml",
    )
    agent = Agent(config, discover(FakeNVML([("NVIDIA H200", BUS[0])])))
    assert agent.start_calibration("test") and agent.calibrator is not None
    calibrator = agent.calibrator
    wait_for(lambda: not calibrator.running(), 30, "calibration to end")
    beat = through_json(agent.report(), parse_heartbeat)
    assert beat.calibration is None and beat.device_mode == "nvml"
    assert beat.message.startswith("calibration failed: torch") and "no CUDA" in beat.message
    assert not (tmp_path / "calibration.json").exists()


def test_stopping_the_agent_stops_a_running_calibration(tmp_path: Path) -> None:
    agent = Agent(cpu_config(tmp_path, calibration_budget_s=60))
    calibrator = agent.calibrator
    assert calibrator is not None and agent.start_calibration("test")
    calibrator.cancel()
    wait_for(lambda: not calibrator.running(), 15, "the calibration child to be stopped")
    assert calibrator.latest is None and calibrator.runs == 0 and calibrator.error == ""
    assert not agent.start_calibration("after stop")


def test_the_runtimes_progress_record_reaches_the_heartbeat_with_its_iteration_time() -> None:
    # what hopsmgr.runtime writes to progress.json (keys the wire does not know are left out); the
    # master measures the job's throughput from the iteration time (docs/master.md)
    from hopsmgr_agent.main import _progress

    record = {
        "iteration": 40,
        "start_iteration": 10,
        "samples": 960.0,
        "samples_per_s": 64.0,
        "iteration_s": 0.5,
        "work": 80.0,
        "start_work": 20.0,
        "td_s": 0.01,
        "tw_s": 0.0,
        "time": 1.7e9,
        "mode": "run",
    }
    progress = _progress({"attempt": "a-1", "progress": record})
    assert progress is not None
    assert (progress.iteration, progress.samples_per_s, progress.iteration_s) == (40, 64.0, 0.5)
    assert progress.work == 80.0
    assert _progress({"attempt": "a-1", "progress": {**record, "iteration_s": -1.0}}) is None  # refused
