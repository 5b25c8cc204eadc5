"""`hopsmgr demo`: the whole product on this machine, driven like a user would, in a few minutes.

It starts a local cluster (hopsmgr.local.cluster: a master and three emulated-device agents), submits a
mixed workload of real training jobs from examples/ for two tenants through the API (the tiny torch
CNN and language model when torch is installed, the stdlib emulated job otherwise), shows a live view,
and ends with a metrics table, `summary.json` and a PNG timeline of which job ran on which GPU when.
The workload is built so a tenant under its guarantee arrives while another tenant borrows the whole
cluster: borrowers are checkpointed and resume later. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hopsmgr.config import load_cluster_config
from hopsmgr.local.cluster import LocalCluster, emulated_speed
from hopsmgr.local.report import job_metrics, summary_table, timeline_png
from hopsmgr.local.sshd import PrivateSshd, SshdError
from hopsmgr.local.sshd import available as sshd_available

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class DemoJob:
    at_s: float  # submission time after the start
    tenant: str
    gpus: list[int]
    script: str
    iters: int
    args: tuple[str, ...] = ()

    def body(self, python: str) -> dict[str, Any]:
        return {
            "command": [python, str(EXAMPLES / self.script), "--iters", str(self.iters), *self.args],
            "gpus": self.gpus,
            "batch_size": 16,
            "iterations": self.iters,
            "tenant": self.tenant,
            "name": self.script.removesuffix(".py").replace("_train", "") + f"-{self.tenant}",
        }


def workload(jobs: int, minutes: float, torch: bool) -> list[DemoJob]:
    """nlp borrows the whole cluster first; vision (guaranteed 2 GPUs) arrives later and reclaims."""
    spread = max(10.0, minutes * 60 * 0.3)
    borrowers = max(3, (jobs * 2) // 3)
    out: list[DemoJob] = []
    for i in range(borrowers):
        iters = int(250 + 100 * (i % 3) * (minutes / 4))
        out.append(DemoJob(0.5 * i, "nlp", [1, 2], "emulated_train.py", iters, ("--step-seconds", "0.1")))
    owners = max(1, jobs - borrowers)
    for i in range(owners):
        at = 8.0 + spread * i / owners
        if torch and i % 2 == 0:
            script = "cnn_train.py" if i % 4 == 0 else "lm_train.py"
            out.append(DemoJob(at, "vision", [1], script, 60))
        else:
            out.append(DemoJob(at, "vision", [2], "emulated_train.py", 120, ("--step-seconds", "0.1")))
    return out


def _torch_examples() -> bool:
    return (
        importlib.util.find_spec("torch") is not None
        and (EXAMPLES / "cnn_train.py").exists()
        and (EXAMPLES / "lm_train.py").exists()
    )


class LiveView:
    """Prints new job events as they happen, and a one-line cluster status every few seconds."""

    def __init__(self, cluster: LocalCluster, out: Any = sys.stdout) -> None:
        self.cluster = cluster
        self.out = out
        self.seen: dict[str, int] = {}
        self.idle_samples: list[int] = []
        self.last_status = 0.0

    def poll(self, job_ids: list[str]) -> dict[str, dict[str, Any]]:
        jobs = {j: self.cluster.get(f"/api/v1/jobs/{j}") for j in job_ids}
        for job_id, job in jobs.items():
            history = job["history"]
            for event in history[self.seen.get(job_id, 0) :]:
                if event["kind"] in (
                    "started",
                    "preempted",
                    "requeued",
                    "completed",
                    "failed",
                    "moving",
                    "queued",
                ):
                    stamp = time.strftime("%H:%M:%S", time.localtime(event["time"]))
                    print(
                        f"{stamp}  {job_id} {job['name']:<16} {event['kind']:<9} {event['message']}",
                        file=self.out,
                    )
            self.seen[job_id] = len(history)
        cluster = self.cluster.get("/api/v1/cluster")
        if cluster["queued"] or cluster["pending"]:
            self.idle_samples.append(int(cluster["idle_gpus"]))
        now = time.monotonic()
        if now - self.last_status >= 5:
            self.last_status = now
            nodes = self.cluster.get("/api/v1/nodes")["nodes"]
            where = "  ".join(f"{n['id']}[{','.join(r['job'] for r in n['running']) or '-'}]" for n in nodes)
            print(
                f"-- queued {cluster['queued'] + cluster['pending']}, running {cluster['running']}, "
                f"GPUs used {cluster['used_gpus']}/{cluster['gpus']}  {where}",
                file=self.out,
            )
        self.out.flush()
        return jobs


def _private_sshd(root: Path) -> tuple[PrivateSshd | None, str]:
    """An sshd of our own on 127.0.0.1 when OpenSSH is installed, so the master reaches the nodes over
    SSH as on a real lab; otherwise the local executor, and the reason."""
    if not sshd_available():
        return None, "local (commands run as subprocesses: no /usr/sbin/sshd on this machine)"
    try:
        server = PrivateSshd.start(root)
    except (SshdError, OSError, subprocess.SubprocessError) as exc:
        return None, f"local (commands run as subprocesses: the private sshd did not start: {str(exc)[:200]})"
    return server, f"ssh (a private sshd on 127.0.0.1:{server.port}, host key checked, key authentication)"


def _over_ssh(text: str, sshd: PrivateSshd) -> str:
    master = "\n".join(
        [
            "[master]",
            'executor = "ssh"',
            f'ssh_key = "{sshd.user_key}"',
            f'known_hosts = "{sshd.known_hosts}"',
            f'remote_python = "{sys.executable}"',
            "ssh_connect_timeout_s = 5",
            "",
        ]
    )
    text = text.replace("[master]\n", master, 1)
    return re.sub(r'(id = "[^"]+"\n)', rf'\1address = "127.0.0.1"\nssh_port = {sshd.port}\n', text)


def run_demo(
    out_dir: Path, *, jobs: int = 9, minutes: float = 4.0, quick: bool = False, ssh: bool = True
) -> dict[str, Any]:
    if quick:
        jobs, minutes = min(jobs, 6), min(minutes, 1.5)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = resources.files("hopsmgr") / "data" / "demo-cluster.toml"
    config_path = out_dir / "cluster.toml"
    text = source.read_text(encoding="utf-8")
    sshd, executor = _private_sshd(out_dir / "sshd") if ssh else (None, "local: --local given")
    if sshd is not None:
        text = _over_ssh(text, sshd)
    config_path.write_text(text)
    config = load_cluster_config(config_path)
    cluster = LocalCluster(config_path, config, out_dir / "run")
    torch = _torch_examples()
    plan = workload(jobs, minutes, torch)
    print(
        f"hopsmgr demo: a master and {len(config.servers)} agents on this machine in EMULATED-device mode "
        f"({', '.join(f'{s.id}: {s.gpus}x {s.gpu_type} at speed {emulated_speed(config, s.id):g}' for s in config.servers)});\n"
        f"executor: {executor}; single-user: every job runs as {getpass.getuser()}; {len(plan)} jobs for tenants nlp and "
        f"vision ({'torch CNN/LM and ' if torch else ''}emulated training jobs from examples/). Logs in {cluster.root}.\n"
    )
    try:
        cluster.start()
        print(f"master at {cluster.url} (admin token in {cluster.state_dir / 'admin.token'})\n")
        view = LiveView(cluster)
        start = time.monotonic()
        submitted: list[str] = []
        pending = sorted(plan, key=lambda j: j.at_s)
        deadline = start + minutes * 60 * 2.5
        details: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            while pending and time.monotonic() - start >= pending[0].at_s:
                job = pending.pop(0)
                submitted.append(cluster.request("POST", "/api/v1/jobs", job.body(sys.executable))["id"])
            details = view.poll(submitted)
            if not pending and details and all(j["state"] in TERMINAL for j in details.values()):
                break
            time.sleep(1.0)
        speeds = {s.id: emulated_speed(config, s.id) for s in config.servers}
        metrics = job_metrics(list(details.values()), speeds, view.idle_samples)
        metrics["executor"] = config.master.executor
        print("\n" + summary_table(metrics))
        (out_dir / "summary.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
        (out_dir / "jobs.json").write_text(json.dumps(list(details.values()), indent=1))
        png = timeline_png(list(details.values()), config, out_dir / "timeline.png")
        print(f"\nwrote {out_dir / 'summary.json'}, {png}")
        return metrics
    finally:
        cluster.stop()
        if sshd is not None:
            sshd.stop()
