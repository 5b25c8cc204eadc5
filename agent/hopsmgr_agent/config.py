"""Agent configuration (TOML): which node this is, where the master is, and its devices.

    node = "gpu01"                      # the server id in the master's cluster config
    master = "http://127.0.0.1:8470"    # the master's URL; several masters on PostgreSQL: a list
                                        #   (or "url1,url2"): the agent beats to the one that leads
    cluster_token_file = "/etc/hopsmgr/cluster.token"
    workdir = "/var/lib/hopsmgr/node"   # attempts, logs and (without a shared path) checkpoints
    devices = "emulated"                # "nvml" (real GPUs) | "cpu" (no GPU: CPU-only work, kernels on
                                        #   the CPU) | "emulated" (no GPU: demos and tests)
    gpu_type = ""                       # nvml only: report this type instead of the one named by NVML
    calibrate = "start"                 # "start": run the calibration kernels at start (and whenever the
                                        #   master asks) | "never": report the last saved calibration
    calibration_budget_s = 60           # bound on one calibration run, seconds
    probe_port = 0                      # TCP port of this agent's network-probe sink (0 = none)
    peers = ["gpu02:8471"]              # other agents' probe ports, measured for B_net
    tls_ca = ""                         # optional CA file to verify an https master
    [emulated]                          # only with devices = "emulated"; labelled as such in reports
    gpu_type = "v100"
    count = 4
    speed = 1.0                         # relative compute speed of this emulated server
    [cpu]                               # optional, with devices = "cpu"
    gpu_type = "cpu"                    # the type name the master's cluster file gives this server
    count = 1                           # "GPUs" (CPU slots) this server offers

Errors name the file, the key and the value, as hopsmgr.config does for the cluster file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hopsmgr.config import ConfigError
from hopsmgr.protocol import ID_RE
from hopsmgr_agent.probe import parse_peer

_KEYS = (
    "node",
    "master",
    "cluster_token_file",
    "cluster_token",
    "workdir",
    "devices",
    "gpu_type",
    "calibrate",
    "calibration_budget_s",
    "probe_port",
    "peers",
    "emulated",
    "cpu",
    "tls_ca",
)
_EMULATED_KEYS = ("gpu_type", "count", "speed")
_CPU_KEYS = ("gpu_type", "count")
DEVICE_MODES = ("nvml", "cpu", "emulated")
_Fail = Callable[[str, object, str], ConfigError]


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    master: str
    token: str
    workdir: str
    devices: str = "emulated"
    gpu_type: str = ""
    count: int = 0
    speed: float = 1.0
    tls_ca: str = ""
    calibrate: str = "start"
    calibration_budget_s: float = 60.0
    probe_port: int = 0
    peers: tuple[tuple[str, int], ...] = ()

    @property
    def masters(self) -> tuple[str, ...]:
        """The master URLs, in the order given (`master` holds them comma-separated)."""
        return tuple(self.master.split(","))


def parse_agent_config(data: dict[str, Any], source: str) -> AgentConfig:
    def fail(key: str, value: object, reason: str) -> ConfigError:
        return ConfigError(source, key, value, reason)

    for key in data:
        if key not in _KEYS:
            raise fail(key or '""', data[key], f"unknown key (known: {', '.join(_KEYS)})")
    masters = data.get("master")
    if isinstance(masters, list) and masters and all(isinstance(m, str) for m in masters):
        data = {**data, "master": ",".join(masters)}
    for key in ("node", "master", "workdir"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise fail(key, data.get(key), "is required (a non-empty string)")
    if not ID_RE.fullmatch(data["node"]):
        raise fail("node", data["node"], "must match [A-Za-z0-9_.-]{1,64}")
    for url in data["master"].split(","):
        scheme, _, rest = url.strip().partition("://")
        if scheme not in ("http", "https") or not rest.split("/")[0]:
            raise fail("master", data["master"], "must be an http:// or https:// URL with a host (or a list)")
    for key in ("workdir", "cluster_token", "cluster_token_file", "tls_ca"):
        value = data.get(key, "")
        if not isinstance(value, str):
            raise fail(key, value, "must be a string")
        if "\x00" in value:
            raise fail(key, value, "must not contain NUL characters")
    token = data.get("cluster_token", "")
    if not token:
        path = data.get("cluster_token_file", "")
        if not path:
            raise fail("cluster_token_file", path, "is required (or cluster_token)")
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise fail("cluster_token_file", path, f"cannot read it: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, ValueError) as exc:
            raise fail("cluster_token_file", path, f"is not a UTF-8 token file: {exc}") from exc
    devices = data.get("devices", "emulated")
    if devices not in DEVICE_MODES:
        raise fail("devices", devices, 'must be "nvml", "cpu" or "emulated"')
    gpu_type, count, speed = "", 0, 1.0
    if "gpu_type" in data:
        gpu_type = data["gpu_type"]
        if devices != "nvml":
            raise fail("gpu_type", gpu_type, f'applies to devices = "nvml" only (use [{devices}] gpu_type)')
        if not isinstance(gpu_type, str) or not gpu_type.strip():
            raise fail("gpu_type", gpu_type, "must be a non-empty GPU type name")
    if devices == "cpu":
        gpu_type, count = _cpu_table(data.get("cpu", {}), fail)
    if devices == "emulated":
        emu = data.get("emulated")
        if not isinstance(emu, dict):
            raise fail("emulated", emu, 'is required with devices = "emulated" (gpu_type, count, speed)')
        for key in emu:
            if key not in _EMULATED_KEYS:
                shown = key or '""'  # an empty key is shown as ""
                raise fail(f"emulated.{shown}", emu[key], f"unknown key (known: {', '.join(_EMULATED_KEYS)})")
        raw_type, raw_count = emu.get("gpu_type"), emu.get("count")
        if not isinstance(raw_type, str) or not raw_type:
            raise fail("emulated.gpu_type", raw_type, "is required (a GPU type name)")
        if not _count(raw_count):
            raise fail("emulated.count", raw_count, "must be an integer in [1, 64]")
        gpu_type, count = raw_type, raw_count
        speed = emu.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise fail("emulated.speed", speed, "must be a number > 0")
    return AgentConfig(
        node=data["node"],
        master=",".join(u.strip().rstrip("/") for u in data["master"].split(",")),
        token=token,
        workdir=os.path.abspath(data["workdir"]),
        devices=devices,
        gpu_type=gpu_type,
        count=count,
        speed=float(speed),
        tls_ca=str(data.get("tls_ca", "")),
        **_calibration_keys(data, fail),
    )


def _count(value: object) -> TypeGuard[int]:
    return not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= 64


def _cpu_table(cpu: object, fail: _Fail) -> tuple[str, int]:
    if not isinstance(cpu, dict):
        raise fail("cpu", cpu, "must be a table (gpu_type, count)")
    for key in cpu:
        if key not in _CPU_KEYS:
            shown = key or '""'  # an empty key is shown as ""
            raise fail(f"cpu.{shown}", cpu[key], f"unknown key (known: {', '.join(_CPU_KEYS)})")
    gpu_type, count = cpu.get("gpu_type", "cpu"), cpu.get("count", 1)
    if not isinstance(gpu_type, str) or not gpu_type.strip():
        raise fail("cpu.gpu_type", gpu_type, "must be a non-empty type name")
    if not _count(count):
        raise fail("cpu.count", count, "must be an integer in [1, 64]")
    return gpu_type, count


def _calibration_keys(data: dict[str, Any], fail: _Fail) -> dict[str, Any]:
    calibrate = data.get("calibrate", "start")
    if calibrate not in ("start", "never"):
        raise fail("calibrate", calibrate, 'must be "start" or "never"')
    budget = data.get("calibration_budget_s", 60.0)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 1 <= budget <= 3600:
        raise fail("calibration_budget_s", budget, "must be a number of seconds in [1, 3600]")
    port = data.get("probe_port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise fail("probe_port", port, "must be an integer in [0, 65535] (0 = no probe sink)")
    raw_peers = data.get("peers", [])
    if not isinstance(raw_peers, list) or len(raw_peers) > 64:
        raise fail("peers", raw_peers, 'must be a list of at most 64 "host:port" strings')
    peers = []
    for i, peer in enumerate(raw_peers):
        if not isinstance(peer, str):
            raise fail(f"peers[{i}]", peer, 'must be a "host:port" string')
        try:
            peers.append(parse_peer(peer))
        except ValueError as exc:
            raise fail(f"peers[{i}]", peer, str(exc)) from exc
    return {
        "calibrate": calibrate,
        "calibration_budget_s": float(budget),
        "probe_port": port,
        "peers": tuple(peers),
    }


def load_agent_config(path: str) -> AgentConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path, "", path, f"cannot read the file: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", "", f"not valid TOML: {exc}") from exc
    return parse_agent_config(data, path)
