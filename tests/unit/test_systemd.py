"""The systemd units in systemd/ are valid (`systemd-analyze verify`), hardened as documented, and agree
with the example configuration files (systemd/agent.toml, configs/lab.toml)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hopsmgr_agent.config import load_agent_config

from hopsmgr.config import load_cluster_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "systemd"
MASTER = SYSTEMD / "hopsmgr-master.service"
AGENT = SYSTEMD / "hopsmgr-agent.service"
AGENT_TOML = SYSTEMD / "agent.toml"
LAB = REPO / "configs" / "lab.toml"
VENV_BIN = "/opt/hopsmgr/venv/bin/"

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(text: str) -> Unit:
    """A unit file as {section: [(key, value), ...]}, keeping repeated keys in order (as systemd does)."""
    unit: Unit = {}
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, [])
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line in section [{section}]: {line!r}"
        unit.setdefault(section, []).append((key.strip(), value.strip()))
    return unit


def values(unit: Unit, key: str, section: str = "Service") -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def value(unit: Unit, key: str, section: str = "Service") -> str:
    found = values(unit, key, section)
    assert found, f"[{section}] {key}= is missing"
    return found[-1]  # the last assignment wins


def read(path: Path) -> Unit:
    return parse_unit(path.read_text(encoding="utf-8"))


def read_write_paths(unit: Unit) -> list[str]:
    """Every ReadWritePaths= entry, without the "-" (ignore if missing) prefix."""
    return [p.lstrip("-") for v in values(unit, "ReadWritePaths") for p in v.split()]


# -- systemd-analyze verify ------------------------------------------------------------------------------


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze") or (
        "/usr/bin/systemd-analyze" if Path("/usr/bin/systemd-analyze").exists() else None
    )
    if path is None:
        pytest.skip(
            "systemd-analyze is not installed (Debian/Ubuntu: apt-get install systemd); "
            "the unit files in systemd/ were not verified"
        )
    return path


def verify_args(tool: str) -> list[str]:
    """`systemd-analyze verify` with what this version supports: no man page lookups, and (systemd
    >= 250) errors from our units only, not from the system units they name (network-online.target)."""
    args = [tool, "verify", "--man=no"]
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.match(r"systemd (\d+)", out)
    if match and int(match.group(1)) >= 250:
        args.append("--recursive-errors=no")
    return args


def unit_copy(source: Path, directory: Path, extra: str = "") -> Path:
    """`source` with each ExecStart= binary replaced by this Python (same arguments, User= and the rest
    kept), since `verify` refuses an ExecStart= whose binary does not exist; `extra` is appended to the
    [Service] section."""
    lines = []
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line.removeprefix("ExecStart="))
            assert argv[0].startswith(VENV_BIN), f"{source.name}: ExecStart= must run from {VENV_BIN}"
            line = "ExecStart=" + shlex.join([sys.executable, *argv[1:]])
        if line == "[Install]" and extra:
            lines += [extra, ""]
        lines.append(line)
    target = directory / source.name
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def run_verify(tool: str, units: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*verify_args(tool), *map(str, units)], capture_output=True, text=True, timeout=120, check=False
    )


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = systemd_analyze()
    units = [unit_copy(MASTER, tmp_path), unit_copy(AGENT, tmp_path)]
    result = run_verify(tool, units)
    ours = [line for line in result.stderr.splitlines() if "hopsmgr" in line or str(tmp_path) in line]
    assert result.returncode == 0 and not ours, (
        f"systemd-analyze verify failed (exit {result.returncode}):\n{result.stderr}{result.stdout}"
    )


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("Frobnicate=yes", "Unknown key"),
        ("ProtectSystem=sometimes", "protect system"),
        ("RestartSec=fivesec", "Failed to parse"),
    ],
)
def test_verify_catches_bad_units(tmp_path: Path, line: str, complaint: str) -> None:
    """The check above is meaningful: on this systemd, unknown keys and bad values fail verification."""
    tool = systemd_analyze()
    broken = unit_copy(AGENT, tmp_path, extra=line)
    result = run_verify(tool, [broken])
    assert result.returncode != 0, f"verify accepted {line!r}:\n{result.stderr}"
    assert complaint.lower() in result.stderr.lower(), result.stderr


# -- what the units say ----------------------------------------------------------------------------------

COMMON = {
    "User": "hopsmgr",
    "Restart": "on-failure",
    "Environment": "PYTHONUNBUFFERED=1",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectControlGroups": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
}


@pytest.mark.parametrize("path", [MASTER, AGENT], ids=lambda p: p.name)
def test_common_settings_and_hardening(path: Path) -> None:
    unit = read(path)
    for key, wanted in COMMON.items():
        assert value(unit, key) == wanted, f"{path.name}: {key}={value(unit, key)!r}, wanted {wanted!r}"
    assert float(value(unit, "RestartSec")) > 0
    assert int(value(unit, "LimitNOFILE")) >= 4096
    assert value(unit, "WorkingDirectory").startswith("/")
    assert "/var/lib/hopsmgr" in read_write_paths(unit)
    assert value(unit, "WantedBy", "Install") == "multi-user.target"
    header = path.read_text(encoding="utf-8").split("[Unit]")[0]
    for step in ("daemon-reload", "enable --now", "pip install"):
        assert step in header, f"{path.name}: the header comment does not show the {step!r} step"


def test_master_unit() -> None:
    unit = read(MASTER)
    argv = shlex.split(value(unit, "ExecStart"))
    assert argv == [
        f"{VENV_BIN}hopsmgr",
        "master",
        "--config",
        "/etc/hopsmgr/cluster.toml",
        "--state-dir",
        "/var/lib/hopsmgr",
    ]
    assert value(unit, "StateDirectory") == "hopsmgr"
    assert value(unit, "ProtectHome") == "read-only"
    assert value(unit, "CapabilityBoundingSet") == ""  # no capabilities at all


def test_agent_unit_keeps_gpus_and_jobs() -> None:
    unit = read(AGENT)
    argv = shlex.split(value(unit, "ExecStart"))
    assert argv == [f"{VENV_BIN}hopsmgr-agent", "--config", "/etc/hopsmgr/agent.toml"]
    assert value(unit, "KillMode") == "process"  # jobs survive an agent restart
    assert value(unit, "ProtectHome") == "no"
    # /dev/nvidia* stay reachable: no private /dev, no device allow-list (ProtectClock= would add one)
    for key in ("PrivateDevices", "DeviceAllow", "DevicePolicy", "ProtectClock"):
        assert not values(unit, key), f"{key}= would hide /dev/nvidia* from the agent"
    text = AGENT.read_text(encoding="utf-8")
    for why in ("PrivateDevices", "KillMode", "ProtectHome"):
        assert re.search(rf"^#.*{why}", text, flags=re.M), f"no comment explains {why}"


def test_units_agree_with_the_example_configs(tmp_path: Path) -> None:
    lab = load_cluster_config(LAB)
    master, agent = read(MASTER), read(AGENT)
    root = lab.master.checkpoint_root
    assert root and root.startswith("/")
    for name, unit in (("master", master), ("agent", agent)):
        assert root in read_write_paths(unit), f"the {name} unit cannot write checkpoint_root {root}"
    assert lab.master.remote_python.startswith(VENV_BIN)
    token = tmp_path / "cluster.token"
    token.write_text("t" * 32 + "\n")
    config = load_agent_config(str(substitute_token_file(tmp_path, token)))
    assert any(
        config.workdir == p or config.workdir.startswith(p.rstrip("/") + "/") for p in read_write_paths(agent)
    ), f"the agent unit cannot write the workdir {config.workdir}"


# -- the example configuration files --------------------------------------------------------------------


def substitute_token_file(tmp_path: Path, token: Path) -> Path:
    """systemd/agent.toml with cluster_token_file pointing at `token` (the real one lives on a node)."""
    text = AGENT_TOML.read_text(encoding="utf-8")
    text, n = re.subn(r"(?m)^cluster_token_file\s*=.*$", f'cluster_token_file = "{token}"', text)
    assert n == 1
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_agent_config_loads(tmp_path: Path) -> None:
    token = tmp_path / "cluster.token"
    token.write_text("0123456789abcdef0123456789abcdef\n")
    config = load_agent_config(str(substitute_token_file(tmp_path, token)))
    assert config.token == "0123456789abcdef0123456789abcdef"
    assert config.devices == "nvml"
    assert config.master.startswith("https://")
    assert config.tls_ca
    assert config.calibrate == "start" and config.calibration_budget_s > 0
    assert config.probe_port > 0 and config.peers
    raw = tomllib.loads(AGENT_TOML.read_text(encoding="utf-8"))
    assert raw["cluster_token_file"] == "/etc/hopsmgr/cluster.token"
    lab = load_cluster_config(LAB)
    ids = {s.id for s in lab.servers}
    assert config.node in ids
    assert {host for host, _ in config.peers} <= ids - {config.node}
    assert {port for _, port in config.peers} == {config.probe_port}


def test_lab_config_is_an_ssh_lab() -> None:
    lab = load_cluster_config(LAB)
    m = lab.master
    assert m.executor == "ssh"
    assert m.listen == "0.0.0.0:8470" and not m.loopback
    assert m.tls and m.tls_key and not m.insecure
    assert m.ssh_key and m.known_hosts and m.remote_python
    raw = tomllib.loads(LAB.read_text(encoding="utf-8"))
    assert all("address" in s for s in raw["servers"]), "every lab server names its address"
