"""Real calibration kernels on this machine's CPU, with a small budget, and the factors they yield."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest
from hopsmgr_agent.calibrate import (
    CalibrationReport,
    Cancelled,
    Measurement,
    _Budget,
    main,
    run_calibration,
)
from hopsmgr_agent.nominal import DEFAULT_NET_GBPS, NOMINAL, REFERENCE_DATA_PER_GPU
from hopsmgr_agent.probe import ProbeSink

from hopsmgr.core.model import Calibration
from hopsmgr.protocol import parse_heartbeat

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory: pytest.TempPathFactory) -> CalibrationReport:
    return run_calibration("cpu", 10.0, workdir=str(tmp_path_factory.mktemp("calibration")))


def test_cpu_calibration_measures_sane_positive_numbers(cpu_report: CalibrationReport) -> None:
    r = cpu_report
    assert (r.device, r.gpu_type, r.gpus, r.source) == ("cpu", "cpu", 1, "measured-cpu")
    kernels = {m.kernel for m in r.measurements}
    assert {"matmul_fp32", "memory_copy", "data", "disk"} <= kernels
    assert not kernels & {"h2d", "d2h", "d2d", "matmul_fp16", "net"}
    for m in r.measurements:
        assert m.device == "cpu" and math.isfinite(m.value) and m.value > 0, m
    # sane ranges for any CPU this runs on (generous: these are not speed assertions)
    assert 1e-4 < r.values("matmul_fp32")[0] < 100  # TFLOP/s
    assert 0.1 < r.values("memory_copy")[0] < 10_000  # GB/s
    assert 10 < r.values("data")[0] < 1e7  # samples/s
    assert any("no GPU" in n for n in r.notes) and any("no peers" in n for n in r.notes)
    assert 0 < r.wall_s < r.budget_s + 20


def test_factors_fit_the_protocol_and_the_model(cpu_report: CalibrationReport) -> None:
    factors = cpu_report.factors()
    assert set(factors) == {"compute_factor", "memory_factor", "data_factor", "net_gbps"}
    assert factors["net_gbps"] == DEFAULT_NET_GBPS
    fp32 = cpu_report.values("matmul_fp32")[0]
    assert factors["compute_factor"] == pytest.approx(fp32 / NOMINAL["cpu"].fp32_tflops, rel=1e-3)
    assert factors["data_factor"] == pytest.approx(
        cpu_report.values("data")[0] / REFERENCE_DATA_PER_GPU, rel=1e-3
    )
    beat = parse_heartbeat(
        {
            "node": "cpu01",
            "gpu_type": "cpu",
            "gpus": 1,
            "device_mode": "cpu",
            "workdir": "/w",
            "calibration": factors,
            "calibration_source": cpu_report.source,
        }
    )
    assert beat.calibration == factors
    cal = Calibration(**factors, source=cpu_report.source)
    assert cal.source == "measured-cpu" and cal.link_gbps == Calibration().link_gbps


def test_report_round_trips_through_json(cpu_report: CalibrationReport) -> None:
    data = json.loads(json.dumps(cpu_report.to_json()))
    assert data["source"] == "measured-cpu" and data["factors"] == cpu_report.factors()
    assert CalibrationReport.from_json(data) == cpu_report


def test_network_probe_to_peers_gives_net_gbps(probe_sinks: list[ProbeSink], tmp_path: Path) -> None:
    peers = [("127.0.0.1", s.port) for s in probe_sinks]
    report = CalibrationReport("cpu", "cpu", 1, ["cpu"], 10.0)
    from hopsmgr_agent.calibrate import _network

    _network(report, peers, _Budget(10.0, None))
    net = report.values("net")
    assert len(net) == 2 and all(v > 0 for v in net)
    assert report.factors()["net_gbps"] == pytest.approx(max(net), rel=1e-3)
    assert {m.target for m in report.measurements} == {f"127.0.0.1:{p}" for _, p in peers}


def test_unknown_type_and_multi_gpu_aggregation() -> None:
    def m(kernel: str, value: float, target: str = "cuda:0") -> Measurement:
        return Measurement(kernel, "gpu", target, value, "x", 1)

    report = CalibrationReport("gpu", "h200", 2, ["NVIDIA H200"] * 2, 60.0)
    report.measurements += [
        m("matmul_fp32", 50.0),
        m("matmul_fp32", 52.0, "cuda:1"),
        m("matmul_fp16", 700.0),
        m("matmul_bf16", 720.0),
        m("memory_copy", 4000.0),
        m("d2d", 300.0, "cuda:0->cuda:1"),
        m("net", 10.0, "a:1"),
        m("net", 5.0, "b:1"),
        m("data", 64_000.0),
    ]
    f = report.factors()
    assert f["compute_factor"] == pytest.approx(math.sqrt(51.0 / 67.0 * 720.0 / 989.0), rel=1e-3)
    assert f["memory_factor"] == pytest.approx(4000 / 4800, rel=1e-3)
    assert f["link_gbps"] == 300.0 and f["net_gbps"] == 10.0
    assert f["data_factor"] == pytest.approx(64_000 / 2 / REFERENCE_DATA_PER_GPU, rel=1e-3)
    assert report.source == "measured-gpu"
    report.gpu_type = "mystery9000"
    assert "compute_factor" not in report.factors() and "memory_factor" not in report.factors()


def test_budget_scales_sizes_and_cancel_stops_the_run(tmp_path: Path) -> None:
    small, full = _Budget(10.0, None), _Budget(60.0, None)
    assert small.size(256 << 20, 32 << 20) < full.size(256 << 20, 32 << 20) == 256 << 20
    assert small.window_s < full.window_s <= 2.0
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        run_calibration("cpu", 10.0, workdir=str(tmp_path), cancel=cancel)


def test_standalone_command_prints_a_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cal.json"
    assert main(["--device", "cpu", "--budget", "3", "--workdir", str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "matmul_fp32" in text and "calibration_s:" in text
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["source"] == "measured-cpu" and data["wall_s"] > 0
