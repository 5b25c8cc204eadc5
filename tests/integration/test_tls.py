"""TLS between the master, its agents and its clients, and the master's refusal of plain HTTP on a network.

A throwaway certificate authority and a server certificate for 127.0.0.1 are made with the `openssl`
command line, following docs/install.md section 4. One real cluster (master with tls_cert/tls_key on
127.0.0.1:0, agents with tls_ca) serves the module; a third agent is started WITHOUT the CA and must
never get through. The CLI is pointed at the CA with SSL_CERT_FILE (or its own --ca, tested below), as
docs/install.md and docs/user-guide.md say. The last tests start masters of their own to check what the
master does with a non-loopback `listen`: refused without TLS (the message names master.listen),
started with a warning with insecure = true, started with TLS.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import EXAMPLE, PYTHON, LocalCluster, Node, wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command line")

# environment variables that would let a child trust our CA without being told to
TRUST_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    other_ca: Path  # a second CA that did not sign the master's certificate


def openssl(cwd: Path, *args: str) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"openssl {' '.join(args)}: {proc.stderr}"


def make_ca(d: Path, name: str) -> None:
    openssl(
        d, "req", "-x509", "-new", "-newkey", "rsa:2048", "-sha256", "-days", "2", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN=hopsmgr test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """docs/install.md's recipe: a CA, then a server certificate for 127.0.0.1 (and localhost) it signs."""
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other")
    openssl(d, "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "master.key", "-out", "master.csr",
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    (d / "master.ext").write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n"
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
    )
    openssl(d, "x509", "-req", "-in", "master.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-sha256", "-extfile", "master.ext", "-out", "master.crt")  # fmt: skip
    openssl(d, "verify", "-CAfile", "ca.crt", "master.crt")
    return Pki(d / "ca.crt", d / "master.crt", d / "master.key", d / "other.crt")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TRUST_ENV}
    return {**env, **extra}


@dataclass
class TlsCluster(LocalCluster):
    """LocalCluster whose own requests verify the master against `ca`, and whose agents get `tls_ca`."""

    ca: str = ""

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)

    def healthz(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5, context=self.context()) as r:
                return dict(json.loads(r.read()))
        except OSError:
            return None

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", f"Bearer {self.admin_token if token is None else token}")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.context()) as r:
                raw, status = r.read(), r.status
        except urllib.error.HTTPError as e:
            with e:
                raw, status = e.read(), e.code
        return status, json.loads(raw)

    def start_agent(self, node_id: str, master_url: str | None = None, tls_ca: str | None = None) -> None:
        """As LocalCluster.start_agent, with `tls_ca` (default: the cluster's CA; "" for none) and an
        environment that trusts nothing beyond the system store."""
        node = next(n for n in self.nodes if n.id == node_id)
        cfg = self.root / f"agent-{node_id}.toml"
        ca = self.ca if tls_ca is None else tls_ca
        cfg.write_text(
            f'node = "{node.id}"\nmaster = "{master_url or self.url}"\n'
            f'cluster_token_file = "{self.state_dir / "cluster.token"}"\n'
            f'workdir = "{self.root / "nodes" / node.id}"\ndevices = "emulated"\n'
            + (f'tls_ca = "{ca}"\n' if ca else "")
            + f'[emulated]\ngpu_type = "{node.gpu_type}"\ncount = {node.gpus}\nspeed = {node.speed}\n'
        )
        with open(self.root / f"agent-{node_id}.log", "ab") as log:
            self.agents[node_id] = subprocess.Popen(
                [PYTHON, "-m", "hopsmgr_agent.main", "--config", str(cfg), "--json-logs"],
                stdout=log,
                stderr=log,
                env=clean_env(),
            )

    def hopsmgr(self, *args: str, ca: str | None = None) -> subprocess.CompletedProcess[str]:
        """The CLI, trusting `ca` through SSL_CERT_FILE (it has no CA option), or nothing extra."""
        env = clean_env(HOPSMGR_URL=self.url, HOPSMGR_TOKEN=self.admin_token)
        if ca:
            env["SSL_CERT_FILE"] = ca
        return subprocess.run(
            [PYTHON, "-m", "hopsmgr.cli.main", *args], capture_output=True, text=True, env=env, timeout=60
        )


@pytest.fixture(scope="module")
def tls(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    nodes = [Node("n1", "v100", 2, 1.0), Node("n2", "k80", 1, 0.5), Node("untrusting", "k80", 1, 0.5)]
    c = TlsCluster(
        tmp_path_factory.mktemp("tls"),
        nodes,
        scheduler="profiling_iterations = 10",
        master_extra=f'tls_cert = "{pki.cert}"\ntls_key = "{pki.key}"',
        ca=str(pki.ca),
    )
    try:
        c.start_master()
        c.start_agent("n1")
        c.start_agent("n2")
        c.start_agent("untrusting", tls_ca="")  # neither tls_ca nor a trust store that knows our CA
        wait_for(
            lambda: (
                {n["id"]: n["health"] for n in c.api("GET", "/api/v1/nodes")["nodes"]}.get("n2") == "HEALTHY"
                and c.api("GET", "/api/v1/nodes/n1")["health"] == "HEALTHY"
            ),
            20,
            "n1 and n2 healthy over HTTPS",
        )
        yield c
    finally:
        c.close()


def test_master_serves_https_verified_with_the_ca(tls: TlsCluster) -> None:
    assert tls.url.startswith("https://127.0.0.1:")
    info = json.loads((tls.state_dir / "master.json").read_text())
    assert info["url"] == tls.url
    health = tls.healthz()
    assert health is not None and health["status"] == "ok"
    with urllib.request.urlopen(tls.url + "/api/v1/openapi.json", timeout=10, context=tls.context()) as r:
        assert r.status == 200 and json.loads(r.read())["openapi"].startswith("3.")
    # the certificate is the one we made, for the address in the URL
    with urllib.request.urlopen(
        tls.url.replace("127.0.0.1", "localhost") + "/healthz", context=tls.context()
    ) as r:
        assert r.status == 200


def test_a_client_without_the_ca_is_refused(
    tls: TlsCluster, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in TRUST_ENV:
        monkeypatch.delenv(name, raising=False)
    for context in (ssl.create_default_context(), ssl.create_default_context(cafile=str(pki.other_ca))):
        with pytest.raises(urllib.error.URLError) as info:
            urllib.request.urlopen(tls.url + "/healthz", timeout=10, context=context)
        assert isinstance(info.value.reason, ssl.SSLCertVerificationError), info.value
        assert "certificate verify failed" in str(info.value.reason)


def test_plain_http_to_the_tls_port_gets_no_answer(tls: TlsCluster) -> None:
    port = int(tls.url.rsplit(":", 1)[1])
    for path in ("/healthz", "/api/v1/jobs"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            with pytest.raises((OSError, http.client.HTTPException)):
                conn.request("GET", path, headers={"Authorization": f"Bearer {tls.admin_token}"})
                conn.getresponse().read()
        finally:
            conn.close()
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(tls.url.replace("https://", "http://") + "/healthz", timeout=10)
    assert tls.healthz() is not None  # and the master keeps serving HTTPS


def test_agents_with_tls_ca_heartbeat_and_one_without_cannot(tls: TlsCluster) -> None:
    nodes = {n["id"]: n for n in tls.api("GET", "/api/v1/nodes")["nodes"]}
    for node in ("n1", "n2"):
        assert nodes[node]["health"] == "HEALTHY" and nodes[node]["last_beat_s"] < 5, nodes[node]
    assert nodes["untrusting"]["health"] != "HEALTHY", nodes["untrusting"]
    log = tls.root / "agent-untrusting.log"
    wait_for(
        lambda: "CERTIFICATE_VERIFY_FAILED" in log.read_text(errors="replace"), 20, "a refused heartbeat"
    )
    beats = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    failed = [b for b in beats if b.get("event") == "heartbeat_failed"]
    assert failed and all(b["level"] == "warning" for b in failed), beats[-3:]
    assert tls.api("GET", "/api/v1/nodes/untrusting")["health"] != "HEALTHY"


def test_cli_reaches_the_master_through_ssl_cert_file_and_a_job_runs(tls: TlsCluster, pki: Pki) -> None:
    proc = tls.hopsmgr("nodes", "--json", ca=str(pki.ca))
    assert proc.returncode == 0, proc.stderr
    assert {"n1", "n2"} <= {n["id"] for n in json.loads(proc.stdout)["nodes"]}
    args = ["submit", "--gpus", "1", "--batch-size", "8", "--iters", "30", "--name", "over-tls", "--"]
    argv = [PYTHON, EXAMPLE, "--iters", "30", "--batch-size", "8", "--step-seconds", "0.01"]
    proc = tls.hopsmgr(*args, *argv, ca=str(pki.ca))
    assert proc.returncode == 0, proc.stderr
    job = tls.wait_state(proc.stdout.strip(), "COMPLETED", "FAILED", timeout=60)
    assert job["state"] == "COMPLETED", job  # launched, reported by the agents and ended, all over HTTPS
    proc = tls.hopsmgr("nodes")  # no CA: the CLI cannot verify the master
    assert proc.returncode == 1 and not proc.stdout.strip(), (proc.stdout, proc.stderr)
    assert "cannot reach the master" in proc.stderr and "CERTIFICATE_VERIFY_FAILED" in proc.stderr, (
        proc.stderr
    )


# -- listening on a network address ---------------------------------------------------------------------------


def network_config(tmp: Path, *extra: str) -> Path:
    """A one-node cluster file whose master listens on 0.0.0.0:0 (every interface, a free port)."""
    c = LocalCluster(tmp, [Node("n1", "v100", 1)], master_extra="\n".join(extra))
    path = c.write_config()
    text = path.read_text()
    assert 'listen = "127.0.0.1:0"' in text
    path.write_text(text.replace('listen = "127.0.0.1:0"', 'listen = "0.0.0.0:0"'))
    return path


@contextlib.contextmanager
def master(tmp: Path, config: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    log = tmp / "master.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [PYTHON, "-m", "hopsmgr.cli.main", "master", "--config", str(config), "--state-dir", str(tmp / "state"),
             "--json-logs"],
            stdout=out, stderr=out, text=True, env=clean_env(),
        )  # fmt: skip
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def started_url(proc: subprocess.Popen[str], tmp: Path) -> str:
    info = tmp / "state" / "master.json"

    def up() -> bool:
        assert proc.poll() is None, (
            f"the master exited with {proc.returncode}: {(tmp / 'master.log').read_text()}"
        )
        with contextlib.suppress(OSError, ValueError):
            return bool(json.loads(info.read_text())["pid"] == proc.pid)
        return False

    wait_for(up, 20, "master.json")
    return str(json.loads(info.read_text())["url"])


def test_network_listen_without_tls_is_refused_naming_master_listen(tmp_path: Path) -> None:
    config = network_config(tmp_path)
    with master(tmp_path, config) as (proc, log):
        code = proc.wait(30)
    text = log.read_text()
    assert code == 2, text
    assert "master.listen" in text and "0.0.0.0:0" in text and "tls_cert" in text and "insecure" in text, text
    assert not (tmp_path / "state" / "master.json").exists()


def test_network_listen_with_insecure_starts_and_warns(tmp_path: Path) -> None:
    config = network_config(tmp_path, "insecure = true")
    with master(tmp_path, config) as (proc, log):
        url = started_url(proc, tmp_path)
        assert url.startswith("http://0.0.0.0:"), url
        port = int(url.rsplit(":", 1)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert json.loads(r.read())["status"] == "ok"
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    warnings = [e for e in events if e.get("event") == "insecure_listen"]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning", events
    assert warnings[0]["listen"] == "0.0.0.0:0"


def test_network_listen_with_tls_starts(tmp_path: Path, pki: Pki) -> None:
    config = network_config(tmp_path, f'tls_cert = "{pki.cert}"', f'tls_key = "{pki.key}"')
    with master(tmp_path, config) as (proc, log):
        url = started_url(proc, tmp_path)
        assert url.startswith("https://0.0.0.0:"), url
        port = int(url.rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=str(pki.ca))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=10, context=context) as r:
            assert json.loads(r.read())["status"] == "ok"
    assert "insecure_listen" not in log.read_text()


def test_unreadable_certificate_is_refused_naming_tls_cert(tmp_path: Path, pki: Pki) -> None:
    lines = [f'tls_cert = "{tmp_path / "missing.crt"}"', f'tls_key = "{pki.key}"']
    config = LocalCluster(tmp_path, [Node("n1", "v100", 1)], master_extra="\n".join(lines)).write_config()
    with master(tmp_path, config) as (proc, log):
        code = proc.wait(30)
    text = log.read_text()
    assert code == 2 and "master.tls_cert" in text and "missing.crt" in text, text
    assert not (tmp_path / "state" / "master.json").exists()


def test_cli_ca_option_env_and_client_toml_and_clear_errors(
    tls: TlsCluster, pki: Pki, tmp_path: Path
) -> None:
    """`--ca`, HOPSMGR_CA and `ca_file` in client.toml each let the CLI verify the master; a CA file it
    cannot read, or one without a certificate, is a usage error naming where it came from; an http://
    URL to the TLS master suggests https; a certificate that does not verify suggests --ca."""
    proc = tls.hopsmgr("nodes", "--json", "--ca", str(pki.ca))
    assert proc.returncode == 0, proc.stderr
    env = clean_env(HOPSMGR_URL=tls.url, HOPSMGR_TOKEN=tls.admin_token, HOPSMGR_CA=str(pki.ca))
    cli = [PYTHON, "-m", "hopsmgr.cli.main"]
    proc = subprocess.run([*cli, "cluster"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = tmp_path / "client.toml"
    (tmp_path / "ca.crt").write_bytes(pki.ca.read_bytes())
    config.write_text(f'url = "{tls.url}"\ntoken = "{tls.admin_token}"\nca_file = "ca.crt"\n')
    proc = subprocess.run(
        [*cli, "nodes", "--client-config", str(config)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr

    proc = tls.hopsmgr("nodes", "--ca", str(tmp_path / "missing.crt"))
    assert proc.returncode == 2 and "argument --ca: cannot read CA file" in proc.stderr, proc.stderr
    (tmp_path / "empty.crt").write_text("not a certificate\n")
    config.write_text(f'url = "{tls.url}"\ntoken = "{tls.admin_token}"\nca_file = "empty.crt"\n')
    proc = subprocess.run(
        [*cli, "nodes", "--client-config", str(config)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and "ca_file" in proc.stderr and "no PEM CA certificate" in proc.stderr

    plain = tls.url.replace("https://", "http://")
    proc = tls.hopsmgr("nodes", "--url", plain, "--ca", str(pki.ca))
    assert proc.returncode == 1 and f"try {tls.url}" in proc.stderr, proc.stderr
    proc = tls.hopsmgr("nodes")
    assert proc.returncode == 1 and "give its CA with --ca FILE" in proc.stderr, proc.stderr
