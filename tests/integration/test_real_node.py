"""A measured server end to end: discovery, calibration kernels, jobs on the device, a preemption, a resume.

The master and one agent run as real processes. The agent measures its devices: `devices = "nvml"` on a
GPU server (the GPUs NVML lists, the kernels run on them; the test runs only where NVML answers and
torch sees CUDA, so CI, which has no GPU, skips it), `devices = "cpu"` on any machine (the kernels on
the CPU; CI runs this one). Two tenants' jobs of `examples/cnn_train.py` run on the node's devices
through the node wrapper; the owner's guarantee preempts the borrower, which checkpoints, resumes and
ends with the same parameters, bit for bit, as one uninterrupted run on the same device.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import PYTHON, REPO, LocalCluster, Node, wait_for

torch = pytest.importorskip("torch")

CNN = str(REPO / "examples" / "cnn_train.py")
TENANTS = """
[[tenants]]
name = "vision"
guaranteed_gpus = 1
[[tenants]]
name = "nlp"
guaranteed_gpus = 0
"""


@dataclass(frozen=True)
class Kind:
    devices: str  # the agent's mode
    gpu_type: str
    gpus: int
    torch_device: str  # where the jobs' tensors live: "cuda" or "cpu"
    calibration: str  # the calibration source the master shows
    guest_iters: int  # the borrower's length: long enough to be preempted while it runs


def _gpu_kind() -> Kind:
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    from hopsmgr_agent.devices import DeviceError, discover

    try:
        inventory = discover()
    except DeviceError as exc:
        pytest.skip(f"no GPUs through NVML here: {exc}")
    return Kind("nvml", inventory.gpu_type, len(inventory.gpus), "cuda", "measured-gpu", 20000)


@pytest.fixture(params=["cpu", "nvml"])
def real_node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LocalCluster, Kind]]:
    kind = Kind("cpu", "cpu", 1, "cpu", "measured-cpu", 12000) if request.param == "cpu" else _gpu_kind()
    node = Node("node01", kind.gpu_type, kind.gpus, devices=kind.devices)
    cluster = LocalCluster(tmp_path, [node], tenants=TENANTS)
    try:
        cluster.start_master()
        cluster.start_agent(node.id)
        yield cluster, kind
    finally:
        cluster.close()


def _cnn(iters: int, device: str) -> list[str]:
    args = [PYTHON, CNN, "--iters", str(iters), "--batch-size", "32", "--log-every", "0", "--threads", "1"]
    return [*args, "--device", device]


def _submit(cluster: LocalCluster, kind: Kind, tenant: str, iters: int, name: str, gpus: int = 1) -> str:
    args = ["submit", "--gpus", str(gpus), "--batch-size", "32", "--iters", str(iters), "--tenant", tenant]
    return cluster.cli(*args, "--name", name, "--", *_cnn(iters, kind.torch_device)).stdout.strip()


def _digest(text: str) -> str:
    found = re.findall(r"^final digest ([0-9a-f]{64})$", text, re.MULTILINE)
    assert found, text[-2000:]
    return str(found[-1])


def test_a_measured_node_is_calibrated_runs_jobs_on_its_devices_and_resumes_exactly(
    real_node: tuple[LocalCluster, Kind],
) -> None:
    cluster, kind = real_node
    # the same job run once, uninterrupted, on the same device outside hopsmgr (beside the rest)
    alone = subprocess.Popen(_cnn(kind.guest_iters, kind.torch_device), stdout=subprocess.PIPE, text=True)
    try:
        _drive(cluster, kind, alone)
    finally:
        if alone.poll() is None:
            alone.kill()
        alone.communicate()


def _drive(cluster: LocalCluster, kind: Kind, alone: subprocess.Popen[str]) -> None:
    def node() -> dict[str, Any]:
        return dict(cluster.api("GET", "/api/v1/nodes/node01"))

    wait_for(lambda: node()["health"] == "HEALTHY", 60, "the node healthy", node)
    # the cluster file's hints ("default") until the agent's kernels have run
    wait_for(lambda: node()["calibration"]["source"] == kind.calibration, 180, "the node's calibration", node)
    seen = node()
    assert not seen["emulated"] and seen["gpus"] == kind.gpus and seen["gpu_type"] == kind.gpu_type
    calibration = seen["calibration"]
    assert calibration["compute_factor"] > 0 and calibration["memory_factor"] > 0, calibration
    table = cluster.cli("nodes").stdout
    assert "node01" in table and "(emulated)" not in table, table

    # the borrower holds every GPU, so the owner's guaranteed one must come from it
    guest = _submit(cluster, kind, "nlp", kind.guest_iters, "guest", kind.gpus)
    cluster.wait_state(guest, "RUNNING", timeout=120)
    wait_for(
        lambda: cluster.job(guest)["progress"] > 0.02, 120, "the guest's progress", lambda: cluster.job(guest)
    )
    owner = _submit(cluster, kind, "vision", 100, "owner")
    done = cluster.wait_state(owner, "COMPLETED", timeout=240)
    assert f"device {kind.torch_device}" in cluster.cli("logs", owner).stdout
    owner_run = [a for a in done["attempts"] if not a["profiling"]][-1]
    assert owner_run["placement"] == {"node01": 1} and len(owner_run["devices"]["node01"]) == 1, owner_run
    spec = json.loads(
        (cluster.root / "nodes" / "node01" / "attempts" / owner_run["id"] / "spec.json").read_text()
    )
    # a cpu node's slots are not GPUs: CUDA is asked to show none (on a GPU machine too)
    granted = "" if kind.devices == "cpu" else ",".join(map(str, owner_run["devices"]["node01"]))
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == granted, spec["env"]

    finished = cluster.wait_state(guest, "COMPLETED", timeout=300)
    kinds = [h["kind"] for h in finished["history"]]
    assert "preempted" in kinds, "\n".join(
        f"{h}" for h in finished["history"] + cluster.job(owner)["history"]
    )
    runs = [a for a in finished["attempts"] if not a["profiling"]]
    assert len(runs) >= 2 and runs[0]["exit_code"] == 75, runs  # saved a checkpoint and exited
    log = cluster.cli("logs", guest).stdout
    assert f"device {kind.torch_device}" in log and "resumed at iteration" in log, log[-2000:]
    measured = [t for t in cluster.job(guest)["throughput"] if t["placement"] == {"node01": kind.gpus}]
    assert measured and measured[0]["measured_last"] > 0, measured

    out, _ = alone.communicate(timeout=600)
    assert alone.returncode == 0, out[-2000:]
    if kind.gpus != 1:
        return  # one process on several GPUs' samples: the plain run is not the same job
    assert _digest(log) == _digest(out)
