"""Cluster configuration: TOML -> frozen, validated config objects, with errors that name file, key and value.

The file is parsed once; the result (`ClusterConfig`) holds core values (`Server`, `TenantQuota`,
`SchedulerSettings`) that are passed down explicitly. Any problem raises `ConfigError`, whose message reads
`<file>: <dotted.key>: <reason> (got <value>)`, e.g. `lab.toml: servers[2].gpus: must be an integer in
[1, 64] (got 0)`. Unknown keys are errors everywhere, so a typo never silently falls back to a default.

The schema, every table and key with its type, default and meaning, is in docs/configuration.md:
`[cluster]`, `[[servers]]` and `[[server_groups]]` (at least one server), `[scheduler]` (any field of
`SchedulerSettings`; the TOML key of `lambda_` is "lambda"), `[master]` (any field of `MasterSettings`),
`[[tenants]]` (guarantees, caps, weights, and caps and guarantees per GPU type) and `[[users]]`.

Servers from `[[servers]]` come first, then those of each `[[server_groups]]` entry in file order; a
server's default `order` is its 1-based position in that list. Calibration hints get source "hint".
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from hopsmgr.core.model import Calibration, ModelError, Server, TenantQuota
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master_settings import MasterSettings
from hopsmgr.protocol import ROLES, UNIX_USER_PATTERN

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "MasterSettings",
    "load_cluster_config",
    "load_default_cluster_config",
    "parse_cluster_config",
]

_S = TypeVar("_S")

MAX_GPUS_PER_SERVER = 64
MAX_GROUP_COUNT = 1024
DEFAULT_TENANT = "default"
_DEFAULT_RESOURCE = ("data", "default-cluster.toml")

_ID_RE = re.compile(r"[A-Za-z0-9_.-]+")
_GPU_TYPE_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_CALIBRATION_KEYS = ("compute_factor", "memory_factor", "data_factor", "link_gbps", "net_gbps")
_TOP_KEYS = ("cluster", "servers", "server_groups", "scheduler", "tenants", "users", "master")
_SERVER_KEYS = (
    "id",
    "gpu_type",
    "gpus",
    "host_model",
    "order",
    "calibration",
    "address",
    "ssh_port",
    "ssh_user",
)
_HOST_RE = re.compile(r"[A-Za-z0-9_.:-]+")
_GROUP_KEYS = ("prefix", "count", "gpu_type", "gpus", "host_model", "order", "calibration")
_TENANT_KEYS = (
    "name",
    "guaranteed_gpus",
    "cap_gpus",
    "weight",
    "cap_gpus_by_type",
    "guaranteed_gpus_by_type",
)
_USER_KEYS = ("name", "tenant", "unix_user", "role")
_UNIX_USER_RE = re.compile(UNIX_USER_PATTERN)
_MAX_REPR = 120


class _Missing:
    """Marks a key that is absent (shown as `nothing` in messages)."""

    def __repr__(self) -> str:
        return "nothing"


MISSING: Any = _Missing()


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


class ConfigError(ValueError):
    """An invalid cluster configuration: `file`, dotted `key` ("" for the whole file), `value`, `reason`."""

    def __init__(self, file: str, key: str, value: object, reason: str) -> None:
        self.file = file
        self.key = key
        self.value = value
        self.reason = reason
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(f"{where}{reason} (got {_short_repr(value)})")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, object, str]]:
        return (type(self), (self.file, self.key, self.value, self.reason))


@dataclass(frozen=True, slots=True)
class NodeAccess:
    """How the master reaches a server over SSH (the master's executor = "ssh")."""

    address: str
    ssh_port: int = 22
    ssh_user: str = ""  # default: the master's own user


@dataclass(frozen=True, slots=True)
class UserEntry:
    """A user the cluster file seeds into the master's store (`[[users]]`)."""

    name: str
    tenant: str
    unix_user: str = ""
    role: str = "user"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A whole cluster as configured: servers, scheduler knobs, tenant quotas, and where it came from."""

    name: str
    servers: tuple[Server, ...]
    scheduler: SchedulerSettings
    tenants: tuple[TenantQuota, ...]
    source: str = "<inline>"
    master: MasterSettings = field(default_factory=MasterSettings)
    access: Mapping[str, NodeAccess] = field(default_factory=dict)
    users: tuple[UserEntry, ...] = ()

    def node_access(self, server_id: str) -> NodeAccess:
        return self.access.get(server_id) or NodeAccess(server_id)

    def tenant_map(self) -> dict[str, TenantQuota]:
        return {t.name: t for t in self.tenants}

    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types present, sorted by name."""
        return tuple(sorted({s.gpu_type for s in self.servers}))

    @property
    def total_gpus(self) -> int:
        return sum(s.gpus for s in self.servers)


def _join(prefix: str, name: object) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


class _Parser:
    """Type-checked reads from the decoded TOML document; every failure becomes a ConfigError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, value: object, reason: str) -> NoReturn:
        raise ConfigError(self.source, key, value, reason)

    def table(self, value: object, key: str, allowed: Iterable[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(key, value, "must be a table")
        allowed_set = set(allowed)
        for name in value:
            if name not in allowed_set:
                shown = name if name else '""'  # an empty key is valid TOML: name it visibly
                self.fail(_join(key, shown), value[name], f"unknown key (known: {', '.join(allowed)})")
        return value

    def array_of_tables(self, value: object, key: str) -> list[object]:
        if value is MISSING:
            return []
        if not isinstance(value, list):
            self.fail(key, value, "must be an array of tables")
        return value

    def integer(self, value: object, key: str, low: int | None = None, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, value, "must be an integer")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"in [{low}, {high}]" if low is not None and high is not None else f">= {low}"
            self.fail(key, value, f"must be an integer {bounds}")
        return value

    def number(self, value: object, key: str, *, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, value, "must be a number")
        try:
            result = float(value)
        except OverflowError:
            self.fail(key, value, "is too large")
        if not math.isfinite(result):
            self.fail(key, value, "must be a finite number")
        if positive and result <= 0:
            self.fail(key, value, "must be > 0")
        return result

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, value, "must be true or false")
        return value

    def string(self, value: object, key: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
        if not isinstance(value, str):
            self.fail(key, value, "must be a string")
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(key, value, f"must be {what or 'a name matching ' + pattern.pattern}")
        return value

    def required(self, table: Mapping[str, Any], key: str, name: str) -> object:
        if name not in table:
            self.fail(_join(key, name), MISSING, "is required")
        return table[name]

    # -- sections -------------------------------------------------------------------------------------

    def document(self, data: object) -> ClusterConfig:
        doc = self.table(data, "", _TOP_KEYS)
        name = self.cluster_name(doc.get("cluster", MISSING))
        servers, access = self.servers(doc)
        scheduler = self.scheduler(doc.get("scheduler", MISSING))
        type_gpus: dict[str, int] = {}
        for server in servers:
            type_gpus[server.gpu_type] = type_gpus.get(server.gpu_type, 0) + server.gpus
        tenants = self.tenants(doc.get("tenants", MISSING), sum(s.gpus for s in servers), type_gpus)
        master = self.settings(doc.get("master", MISSING), "master", MasterSettings)
        users = self.users(doc.get("users", MISSING), tenants)
        return ClusterConfig(name, servers, scheduler, tenants, self.source, master, access, users)

    def cluster_name(self, raw: object) -> str:
        default = Path(self.source).stem if not self.source.startswith("<") else "cluster"
        if raw is MISSING:
            return default
        table = self.table(raw, "cluster", ("name",))
        if "name" not in table:
            return default
        name = self.string(table["name"], "cluster.name")
        if not name.strip():
            self.fail("cluster.name", name, "must not be empty")
        return name

    def calibration(self, raw: object, key: str) -> Calibration:
        if raw is MISSING:
            return Calibration()
        table = self.table(raw, key, _CALIBRATION_KEYS)
        hints = {name: self.number(v, _join(key, name), positive=True) for name, v in table.items()}
        try:
            return Calibration(**hints, source="hint")
        except ModelError as exc:  # pragma: no cover - the checks above already reject these values
            self.fail(key, dict(table), str(exc))

    def server(self, sid: str, table: Mapping[str, Any], key: str, order: int, id_key: str) -> Server:
        gpu_type = self.string(
            self.required(table, key, "gpu_type"), f"{key}.gpu_type", _GPU_TYPE_RE, "a lowercase name"
        )
        gpus = self.integer(self.required(table, key, "gpus"), f"{key}.gpus", 1, MAX_GPUS_PER_SERVER)
        host_model = self.string(table.get("host_model", ""), f"{key}.host_model")
        calibration = self.calibration(table.get("calibration", MISSING), f"{key}.calibration")
        try:
            return Server(sid, gpu_type, gpus, calibration, host_model, order)
        except ModelError as exc:  # pragma: no cover - the checks above already reject these values
            self.fail(id_key, sid, str(exc))

    def access(self, sid: str, table: Mapping[str, Any], key: str) -> NodeAccess:
        address = self.string(table.get("address", sid), f"{key}.address", _HOST_RE, "a host name or address")
        port = self.integer(table.get("ssh_port", 22), f"{key}.ssh_port", 1, 65535)
        user = self.string(table.get("ssh_user", ""), f"{key}.ssh_user")
        return NodeAccess(address, port, user)

    def servers(self, doc: Mapping[str, Any]) -> tuple[tuple[Server, ...], dict[str, NodeAccess]]:
        access: dict[str, NodeAccess] = {}
        result: list[Server] = []
        first_key: dict[str, str] = {}

        def add(server: Server, id_key: str) -> None:
            if server.id in first_key:
                self.fail(id_key, server.id, f"duplicate server id (first defined at {first_key[server.id]})")
            first_key[server.id] = id_key
            result.append(server)

        for i, raw in enumerate(self.array_of_tables(doc.get("servers", MISSING), "servers")):
            key = f"servers[{i}]"
            table = self.table(raw, key, _SERVER_KEYS)
            sid = self.string(self.required(table, key, "id"), f"{key}.id", _ID_RE)
            order = self.integer(table.get("order", len(result) + 1), f"{key}.order", 0)
            add(self.server(sid, table, key, order, f"{key}.id"), f"{key}.id")
            access[sid] = self.access(sid, table, key)

        groups = self.array_of_tables(doc.get("server_groups", MISSING), "server_groups")
        for i, raw in enumerate(groups):
            key = f"server_groups[{i}]"
            table = self.table(raw, key, _GROUP_KEYS)
            prefix = self.string(self.required(table, key, "prefix"), f"{key}.prefix", _ID_RE)
            count = self.integer(self.required(table, key, "count"), f"{key}.count", 1, MAX_GROUP_COUNT)
            start = self.integer(table.get("order", len(result) + 1), f"{key}.order", 0)
            for k in range(1, count + 1):
                server = self.server(f"{prefix}{k:02d}", table, key, start + k - 1, f"{key}.prefix")
                add(server, f"{key}.prefix")

        if not result:
            self.fail("servers", doc.get("servers", MISSING), "at least one server is required")
        return tuple(result), access

    def scheduler(self, raw: object) -> SchedulerSettings:
        return self.settings(raw, "scheduler", SchedulerSettings, {"lambda_": "lambda"})

    def settings(self, raw: object, section: str, cls: type[_S], renamed: Mapping[str, str] = {}) -> _S:
        """A settings dataclass from its TOML table; each field's default type sets the TOML type."""
        toml_name = {f.name: renamed.get(f.name, f.name) for f in fields(cls)}  # type: ignore[arg-type]
        by_toml = {toml_name[f.name]: f for f in fields(cls)}  # type: ignore[arg-type]
        defaults = {f.name: f.default for f in fields(cls)}  # type: ignore[arg-type]
        if raw is MISSING:
            return cls()
        table = self.table(raw, section, by_toml)
        kwargs: dict[str, Any] = {}
        for name, value in table.items():
            f, key = by_toml[name], f"{section}.{name}"
            if isinstance(f.default, bool):
                kwargs[f.name] = self.boolean(value, key)
            elif isinstance(f.default, int):
                kwargs[f.name] = self.integer(value, key)
            elif isinstance(f.default, float):
                kwargs[f.name] = self.number(value, key)
            elif isinstance(f.default, str):
                kwargs[f.name] = self.string(value, key)
            else:  # pragma: no cover - every field today has a scalar default
                kwargs[f.name] = value
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:
            match = re.match(rf"{section}\.(\w+): (.*), got ", str(exc))
            if match is None or match.group(1) not in toml_name:
                self.fail(section, dict(table), str(exc))
            field_name, reason = match.group(1), match.group(2)
            value = table.get(toml_name[field_name], defaults.get(field_name, MISSING))
            self.fail(f"{section}.{toml_name[field_name]}", value, reason)

    def tenants(self, raw: object, total_gpus: int, type_gpus: Mapping[str, int]) -> tuple[TenantQuota, ...]:
        result: list[TenantQuota] = []
        seen: dict[str, str] = {}
        guaranteed_sum = 0
        type_sums: dict[str, int] = {}
        for i, item in enumerate(self.array_of_tables(raw, "tenants")):
            key = f"tenants[{i}]"
            table = self.table(item, key, _TENANT_KEYS)
            name = self.string(self.required(table, key, "name"), f"{key}.name", _ID_RE)
            if name in seen:
                self.fail(f"{key}.name", name, f"duplicate tenant name (first defined at {seen[name]})")
            seen[name] = f"{key}.name"
            guaranteed = self.integer(table.get("guaranteed_gpus", 0), f"{key}.guaranteed_gpus", 0)
            cap: int | None = None
            if "cap_gpus" in table:
                cap = self.integer(table["cap_gpus"], f"{key}.cap_gpus")
                if cap < guaranteed:
                    self.fail(f"{key}.cap_gpus", cap, f"must be >= guaranteed_gpus ({guaranteed})")
            weight = self.number(table.get("weight", 1.0), f"{key}.weight", positive=True)
            guaranteed_sum += guaranteed
            if guaranteed_sum > total_gpus:
                reason = f"guarantees add up to {guaranteed_sum}, more than the cluster's {total_gpus} GPUs"
                self.fail(f"{key}.guaranteed_gpus", guaranteed, reason)
            caps = self.by_type(table, "cap_gpus_by_type", key, type_gpus)
            owed = self.by_type(table, "guaranteed_gpus_by_type", key, type_gpus)
            reach = sum(min(n, dict(caps).get(t, n)) for t, n in type_gpus.items())
            if caps and guaranteed > reach:
                self.fail(
                    f"{key}.guaranteed_gpus",
                    guaranteed,
                    f"must be <= the {reach} GPUs its caps per GPU type allow",
                )
            owed_sum = 0
            for gpu_type, g in owed:
                item = f"{key}.guaranteed_gpus_by_type.{gpu_type}"
                type_cap = dict(caps).get(gpu_type)
                if type_cap is not None and g > type_cap:
                    self.fail(item, g, f"must be <= cap_gpus_by_type.{gpu_type} ({type_cap})")
                owed_sum += g
                if cap is not None and owed_sum > cap:
                    self.fail(
                        item, g, f"guarantees per GPU type add up to {owed_sum}, more than cap_gpus ({cap})"
                    )
                type_sums[gpu_type] = type_sums.get(gpu_type, 0) + g
                guaranteed_sum += g
                if type_sums[gpu_type] > type_gpus[gpu_type]:
                    reason = f"guarantees of {gpu_type} add up to {type_sums[gpu_type]}, more than its {type_gpus[gpu_type]} GPUs"
                    self.fail(item, g, reason)
                if guaranteed_sum > total_gpus:
                    self.fail(
                        item,
                        g,
                        f"guarantees add up to {guaranteed_sum}, more than the cluster's {total_gpus} GPUs",
                    )
            result.append(TenantQuota(name, guaranteed, cap, weight, caps, owed))
        if not result:
            return (TenantQuota(DEFAULT_TENANT),)
        return tuple(result)

    def by_type(
        self, table: Mapping[str, Any], name: str, tenant_key: str, type_gpus: Mapping[str, int]
    ) -> tuple[tuple[str, int], ...]:
        """[ours] A tenant's `cap_gpus_by_type` or `guaranteed_gpus_by_type`: GPU type -> GPUs, each type
        one of the cluster's servers' (hopsmgr.core.typecaps)."""
        raw, key = table.get(name, {}), f"{tenant_key}.{name}"
        if not isinstance(raw, Mapping):
            self.fail(key, raw, "must be a table of GPU type = integer")
        out: list[tuple[str, int]] = []
        for gpu_type, value in raw.items():
            item = _join(key, gpu_type) if gpu_type else f'{key}.""'
            if gpu_type not in type_gpus:
                known = ", ".join(sorted(type_gpus))
                self.fail(item, value, f"unknown GPU type {gpu_type!r} (the cluster's servers have: {known})")
            out.append((gpu_type, self.integer(value, item, 0)))
        return tuple(sorted(out))

    def users(self, raw: object, tenants: tuple[TenantQuota, ...]) -> tuple[UserEntry, ...]:
        known = [t.name for t in tenants]
        result: list[UserEntry] = []
        seen: dict[str, str] = {}
        for i, item in enumerate(self.array_of_tables(raw, "users")):
            key = f"users[{i}]"
            table = self.table(item, key, _USER_KEYS)
            name = self.string(self.required(table, key, "name"), f"{key}.name", _ID_RE)
            if name in seen:
                self.fail(f"{key}.name", name, f"duplicate user name (first defined at {seen[name]})")
            seen[name] = f"{key}.name"
            tenant = self.string(self.required(table, key, "tenant"), f"{key}.tenant")
            if tenant not in known:
                self.fail(f"{key}.tenant", tenant, f"unknown tenant (known: {', '.join(known)})")
            unix_user = self.string(table.get("unix_user", ""), f"{key}.unix_user")
            if unix_user and not _UNIX_USER_RE.fullmatch(unix_user):
                self.fail(f"{key}.unix_user", unix_user, "must be a Unix account name ([a-z_][a-z0-9_-]*)")
            if unix_user == "root":
                self.fail(f"{key}.unix_user", unix_user, "root may not run jobs")
            role = self.string(table.get("role", "user"), f"{key}.role")
            if role not in ROLES:
                self.fail(f"{key}.role", role, f"must be one of {', '.join(ROLES)}")
            result.append(UserEntry(name, tenant, unix_user, role))
        return tuple(result)


def parse_cluster_config(data: Mapping[str, Any], source: str = "<inline>") -> ClusterConfig:
    """Validate an already decoded TOML document (a dict) into a `ClusterConfig`."""
    return _Parser(source).document(data)


def _parse_toml_text(text: str, source: str) -> ClusterConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = re.search(r"at line (\d+), column (\d+)", message)
        lines = text.splitlines()
        line_no = int(match.group(1)) if match else 0
        line_text = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
        raise ConfigError(source, "", line_text, f"not valid TOML: {message}") from exc
    return parse_cluster_config(data, source)


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster TOML file; any problem (unreadable, bad TOML or value) is a ConfigError."""
    source = os.fspath(path)
    try:
        raw = Path(source).read_bytes()
    except OSError as exc:
        raise ConfigError(source, "", source, f"cannot read the file: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "", raw[exc.start : exc.end], f"not UTF-8 text: {exc.reason}") from exc
    return _parse_toml_text(text, source)


def load_default_cluster_config() -> ClusterConfig:
    """The embedded demo cluster (hopsmgr/data/default-cluster.toml), used when no file is given."""
    resource = resources.files("hopsmgr")
    for part in _DEFAULT_RESOURCE:
        resource = resource.joinpath(part)
    return _parse_toml_text(resource.read_text(encoding="utf-8"), "hopsmgr:" + "/".join(_DEFAULT_RESOURCE))
