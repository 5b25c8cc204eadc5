"""Agent configuration (TOML): which node this is, where the master is, and its devices.

    node = "gpu01"                      # the server id in the master's cluster config
    master = "http://127.0.0.1:8470"    # the master's URL
    cluster_token_file = "/etc/hopsmgr/cluster.token"
    workdir = "/var/lib/hopsmgr/node"   # attempts, logs and (without a shared path) checkpoints
    devices = "emulated"                # "nvml" (real GPUs) | "emulated" (no GPU: demos and tests)
    [emulated]                          # only with devices = "emulated"; labelled as such in reports
    gpu_type = "v100"
    count = 4
    speed = 1.0                         # relative compute speed of this emulated server
    tls_ca = ""                         # optional CA file to verify an https master

Errors name the file, the key and the value, as hopsmgr.config does for the cluster file.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hopsmgr.config import ConfigError
from hopsmgr.protocol import ID_RE

_KEYS = ("node", "master", "cluster_token_file", "cluster_token", "workdir", "devices", "emulated", "tls_ca")
_EMULATED_KEYS = ("gpu_type", "count", "speed")


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


def parse_agent_config(data: dict[str, Any], source: str) -> AgentConfig:
    def fail(key: str, value: object, reason: str) -> ConfigError:
        return ConfigError(source, key, value, reason)

    for key in data:
        if key not in _KEYS:
            raise fail(key, data[key], f"unknown key (known: {', '.join(_KEYS)})")
    for key in ("node", "master", "workdir"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise fail(key, data.get(key), "is required (a non-empty string)")
    if not ID_RE.fullmatch(data["node"]):
        raise fail("node", data["node"], "must match [A-Za-z0-9_.-]{1,64}")
    if not data["master"].startswith(("http://", "https://")):
        raise fail("master", data["master"], "must be an http:// or https:// URL")
    token = data.get("cluster_token", "")
    if not token:
        path = data.get("cluster_token_file", "")
        if not path:
            raise fail("cluster_token_file", path, "is required (or cluster_token)")
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise fail("cluster_token_file", path, f"cannot read it: {exc.strerror or exc}") from exc
    devices = data.get("devices", "emulated")
    if devices not in ("emulated", "nvml"):
        raise fail("devices", devices, 'must be "emulated" or "nvml"')
    gpu_type, count, speed = "", 0, 1.0
    if devices == "emulated":
        emu = data.get("emulated")
        if not isinstance(emu, dict):
            raise fail("emulated", emu, 'is required with devices = "emulated" (gpu_type, count, speed)')
        for key in emu:
            if key not in _EMULATED_KEYS:
                raise fail(f"emulated.{key}", emu[key], f"unknown key (known: {', '.join(_EMULATED_KEYS)})")
        raw_type, raw_count = emu.get("gpu_type"), emu.get("count")
        if not isinstance(raw_type, str) or not raw_type:
            raise fail("emulated.gpu_type", raw_type, "is required (a GPU type name)")
        if isinstance(raw_count, bool) or not isinstance(raw_count, int) or not 1 <= raw_count <= 64:
            raise fail("emulated.count", raw_count, "must be an integer in [1, 64]")
        gpu_type, count = raw_type, raw_count
        speed = emu.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise fail("emulated.speed", speed, "must be a number > 0")
    return AgentConfig(
        node=data["node"],
        master=data["master"].rstrip("/"),
        token=token,
        workdir=os.path.abspath(data["workdir"]),
        devices=devices,
        gpu_type=gpu_type,
        count=count,
        speed=float(speed),
        tls_ca=str(data.get("tls_ca", "")),
    )


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
