"""A real master process using `executor = "ssh"` against a real OpenSSH server on 127.0.0.1
(tests/integration/sshd.py), with real agents; and `hopsmgr nodes add`, which records a node's host key.

The master runs jobs over SSH to completion, and with a changed host key refuses to run them and loses
none; `nodes add` records a host key only once its fingerprint is confirmed, and lists each of the host's
key types. The SSH executor's commands and failures on their own: tests/integration/test_ssh.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hopsmgr.master.known_hosts import fingerprint
from tests.integration.cluster import PYTHON, LocalCluster, Node, wait_for
from tests.integration.sshd import Sshd, keygen, known_hosts_line

# -- end to end: a real master with executor = "ssh" and two real agents -------------------------------


@dataclass
class SshCluster(LocalCluster):
    ssh_port: int = 0

    def write_config(self) -> Path:
        path = super().write_config()
        text = path.read_text()
        for n in self.nodes:
            server = f'id = "{n.id}"\n'
            text = text.replace(server, f'{server}address = "127.0.0.1"\nssh_port = {self.ssh_port}\n', 1)
        path.write_text(text)
        return path


def test_master_runs_jobs_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    master = "\n".join(
        [
            'executor = "ssh"',
            f'ssh_key = "{sshd.user_key}"',
            f'known_hosts = "{sshd.known_hosts}"',
            f'remote_python = "{PYTHON}"',
            "ssh_connect_timeout_s = 5",
        ]
    )
    nodes = [Node("n1", "v100", 1, 1.0), Node("n2", "k80", 1, 0.5)]
    cluster = SshCluster(tmp_path, nodes, master_extra=master, ssh_port=sshd.port)
    before = sshd.log.count("Accepted publickey")
    try:
        cluster.start()
        job_id = cluster.submit(gpus="1", iters=30, step=0.02)
        job = cluster.wait_state(job_id, "COMPLETED", timeout=60)
        assert job["attempts"] and all(a["exit_code"] == 0 for a in job["attempts"])
        assert "final checksum" in cluster.api("GET", f"/api/v1/jobs/{job_id}/logs")["log"]
    finally:
        cluster.close()
    master_log = (tmp_path / "master.log").read_text()
    assert '"ssh_connected"' in master_log and '"executor": "ssh"' in master_log
    assert sshd.log.count("Accepted publickey") > before  # the commands went over SSH


def test_nodes_add_records_a_host_key_only_when_its_fingerprint_is_confirmed(tmp_path: Path) -> None:
    import subprocess
    import sys

    server = Sshd.start(tmp_path / "sshd")
    try:
        state = tmp_path / "state"
        config = tmp_path / "cluster.toml"
        config.write_text(
            f'[[servers]]\nid = "n1"\ngpu_type = "v100"\ngpus = 1\naddress = "127.0.0.1"\nssh_port = {server.port}\n'
        )
        real = subprocess.run(
            ["ssh-keygen", "-lf", str(server.host_key) + ".pub"], capture_output=True, text=True
        )
        want = real.stdout.split()[1]
        run = [
            sys.executable,
            "-m",
            "hopsmgr.cli.main",
            "nodes",
            "add",
            "n1",
            "--config",
            str(config),
            "--state-dir",
            str(state),
        ]
        wrong = subprocess.run(
            [*run, "--fingerprint", "SHA256:not-this-one"], capture_output=True, text=True, timeout=60
        )
        assert wrong.returncode == 1 and "nothing recorded" in wrong.stderr
        assert not (state / "known_hosts").exists()
        unconfirmed = subprocess.run(
            run, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
        assert unconfirmed.returncode == 2 and not (state / "known_hosts").exists()
        ok = subprocess.run([*run, "--fingerprint", want], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        assert want in ok.stdout
        assert f"[127.0.0.1]:{server.port}" in (state / "known_hosts").read_text()
    finally:
        server.stop()


def test_master_with_a_changed_host_key_refuses_to_run_and_loses_no_job(sshd: Sshd, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_host_key")
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(known_hosts_line(sshd.port, Path(str(other) + ".pub")))
    master = "\n".join(
        [
            'executor = "ssh"',
            f'ssh_key = "{sshd.user_key}"',
            f'known_hosts = "{wrong}"',
            f'remote_python = "{PYTHON}"',
            "ssh_connect_timeout_s = 5",
        ]
    )
    cluster = SshCluster(tmp_path, [Node("n1", "v100", 1, 1.0)], master_extra=master, ssh_port=sshd.port)
    try:
        cluster.start()
        job_id = cluster.submit(gpus="1", iters=30, step=0.02)
        wait_for(
            lambda: any("hostkey" in h["message"] for h in cluster.job(job_id)["history"]),
            60,
            "host key event",
        )
        node = cluster.api("GET", "/api/v1/nodes/n1")
        assert node["command_error"] and "hostkey" in node["command_error"]
        assert "command errors" in cluster.cli("nodes").stdout
        job = cluster.job(job_id)
        assert job["state"] in ("PENDING", "PROFILING", "QUEUED")  # waiting, not failed, not lost
        assert not (tmp_path / "nodes" / "n1" / "attempts").exists() or not any(
            (tmp_path / "nodes" / "n1" / "attempts").iterdir()
        )  # nothing ran on the node
    finally:
        cluster.close()


def test_nodes_add_names_each_key_type_prefers_ed25519_and_accepts_any_of_the_hosts_keys(
    tmp_path: Path,
) -> None:
    """A node with an RSA and an ED25519 host key (RSA listed first in its sshd_config): `nodes add`
    prints both with their types, ED25519 first, and records whichever key --fingerprint names."""
    import subprocess
    import sys

    server = Sshd.start(tmp_path / "sshd", rsa_host_key=True)
    try:
        config = tmp_path / "cluster.toml"
        config.write_text(
            f'[[servers]]\nid = "n1"\ngpu_type = "v100"\ngpus = 1\naddress = "127.0.0.1"\nssh_port = {server.port}\n'
        )

        def keygen_print(name: str) -> str:
            out = subprocess.run(
                ["ssh-keygen", "-lf", str(server.root / name)], capture_output=True, text=True
            )
            return out.stdout.split()[1]

        ed25519, rsa = keygen_print("ssh_host_ed25519_key.pub"), keygen_print("ssh_host_rsa_key.pub")
        for want, kind in ((rsa, "ssh-rsa"), (ed25519, "ssh-ed25519")):
            state = tmp_path / f"state-{kind}"
            run = [sys.executable, "-m", "hopsmgr.cli.main", "nodes", "add", "n1", "--config", str(config)]
            ok = subprocess.run(
                [*run, "--state-dir", str(state), "--fingerprint", want],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert ok.returncode == 0, ok.stderr
            listed = [line.split() for line in ok.stdout.splitlines() if line.startswith("  ")]
            assert listed == [["ED25519", ed25519], ["RSA", rsa]], ok.stdout
            assert f"recording the {'RSA' if kind == 'ssh-rsa' else 'ED25519'} key {want}" in ok.stdout
            (recorded,) = (state / "known_hosts").read_text().splitlines()
            assert recorded.split()[1] == kind and fingerprint(recorded) == want
    finally:
        server.stop()


def test_hopsmgr_help_lists_nodes_add() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hopsmgr.cli.main", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "`nodes add NODE`" in out.stdout
