"""The master's own settings (TOML section [master]): where it listens, where it keeps state, timings.

Parsed by hopsmgr.config like [scheduler]: every field below is a TOML key of the same name. Paths that
are empty take defaults under `state_dir` (resolved by the master at start, not here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

EXECUTORS: tuple[str, ...] = ("local", "ssh")
PLANNERS: tuple[str, ...] = ("process", "thread")
_LISTEN_RE = re.compile(r"(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})


@dataclass(frozen=True, slots=True)
class MasterSettings:
    listen: str = "127.0.0.1:8470"
    state_dir: str = ""  # default: ~/.local/state/hopsmgr (or --state-dir)
    # where the state lives: empty = <state_dir>/state.db (SQLite); a file path (SQLite); or a
    # postgresql:// URL (PostgreSQL: several masters, one leader; see docs/operations.md)
    store: str = ""
    advertise_url: str = ""  # the URL clients reach this master at (told by standbys); default: from listen
    lease_s: float = 10.0  # PostgreSQL only: a leader that cannot confirm its lock this long steps down
    lease_check_s: float = 2.0  # PostgreSQL only: how often the leader confirms its lock (and standbys try)
    tls_cert: str = ""
    tls_key: str = ""
    insecure: bool = False  # allow a non-loopback address without TLS (logged loudly)
    cluster_token_file: str = ""  # default: <state_dir>/cluster.token
    executor: str = "local"
    checkpoint_root: str = ""  # default: <state_dir>/checkpoints (a shared filesystem for local nodes)
    # false = each node keeps checkpoints under its own work dir and the master copies the latest
    # verified checkpoint to the next node over SFTP before a job resumes elsewhere
    checkpoint_shared: bool = True
    heartbeat_interval_s: float = 5.0
    suspect_after_s: float = 15.0
    lost_after_s: float = 60.0
    stop_grace_s: float = 60.0  # how long a checkpoint-and-stop may take before the job is killed
    log_tail_bytes: int = 4096
    ssh_key: str = ""  # private key file for the SSH executor (default: ~/.ssh/id_ed25519)
    known_hosts: str = ""  # host keys of the nodes (default: <state_dir>/known_hosts); never disabled
    remote_python: str = "python3"  # interpreter on the nodes that has hopsmgr installed
    ssh_connect_timeout_s: float = 10.0
    ssh_keepalive_s: float = 15.0
    ssh_max_channels: int = 8  # concurrent commands per node connection
    planner: str = "process"  # where plans are computed: a worker process of its own, or a thread
    plan_deadline_s: float = 0.0  # hard deadline of a plan from the round's start (0: time_limit_s + 5)
    # jobs run as their submitter's Unix account (users.unix_user) on the nodes, each attempt in a
    # cgroup of its own (docs/security.md); accounts below min_uid, root and unmapped users are refused
    run_as_users: bool = False
    min_uid: int = 1000

    def __post_init__(self) -> None:
        def bad(name: str, reason: str) -> ValueError:
            return ValueError(f"master.{name}: {reason}, got {getattr(self, name)!r}")

        store_problem = check_store(self.store)
        if store_problem:
            raise bad("store", store_problem)
        if not 0 < self.lease_check_s < self.lease_s / 2:
            raise bad("lease_check_s", "must be > 0 and less than half of lease_s")
        if self.advertise_url and not re.fullmatch(r"https?://[^/\s]+", self.advertise_url):
            raise bad("advertise_url", "must be http://host:port or https://host:port (no path)")
        if not 1 <= self.lease_s <= 300:
            raise bad("lease_s", "must be in [1, 300] seconds")
        match = _LISTEN_RE.fullmatch(self.listen)
        if match is None or not 0 <= int(match.group("port")) <= 65535:
            raise bad("listen", "must be host:port with a port in [0, 65535]")
        if self.executor not in EXECUTORS:
            raise bad("executor", f"must be one of {', '.join(EXECUTORS)}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise bad("tls_cert", "tls_cert and tls_key must be given together")
        if not isinstance(self.checkpoint_shared, bool):
            raise bad("checkpoint_shared", "must be true or false")
        if not self.heartbeat_interval_s > 0:
            raise bad("heartbeat_interval_s", "must be > 0")
        if not self.suspect_after_s > self.heartbeat_interval_s:
            raise bad("suspect_after_s", "must be > heartbeat_interval_s")
        if not self.lost_after_s > self.suspect_after_s:
            raise bad("lost_after_s", "must be > suspect_after_s")
        if not self.stop_grace_s > 0:
            raise bad("stop_grace_s", "must be > 0")
        if not 0 <= self.log_tail_bytes <= 1 << 20:
            raise bad("log_tail_bytes", "must be in [0, 1048576]")
        if not self.ssh_connect_timeout_s > 0:
            raise bad("ssh_connect_timeout_s", "must be > 0")
        if not self.ssh_keepalive_s > 0:
            raise bad("ssh_keepalive_s", "must be > 0")
        if not 1 <= self.ssh_max_channels <= 64:
            raise bad("ssh_max_channels", "must be in [1, 64]")
        if self.planner not in PLANNERS:
            raise bad("planner", f"must be one of {', '.join(PLANNERS)}")
        if isinstance(self.plan_deadline_s, bool) or not (
            isinstance(self.plan_deadline_s, int | float) and 0 <= self.plan_deadline_s <= 3600
        ):
            raise bad("plan_deadline_s", "must be in [0, 3600] seconds (0: the solver's time limit + 5 s)")
        if isinstance(self.min_uid, bool) or not 1 <= self.min_uid <= 2**31 - 1:
            raise bad("min_uid", "must be an integer in [1, 2147483647] (root is always refused)")
        if not self.remote_python.strip():
            raise bad("remote_python", "must not be empty")

    @property
    def postgres(self) -> bool:
        return self.store.startswith(("postgresql://", "postgres://"))

    @property
    def host(self) -> str:
        host, _, _ = self.listen.rpartition(":")
        return host.strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS or self.host.startswith("127.")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)


def check_store(store: str) -> str:
    """What is wrong with a `store` value ("" when nothing)."""
    if not isinstance(store, str):
        return "must be a file path or a postgresql:// URL"
    scheme, sep, _ = store.partition("://")
    if not sep:
        return ""  # a path: SQLite
    if scheme not in ("postgresql", "postgres"):
        return f"unknown scheme {scheme + '://'!r}: a file path (SQLite) or a postgresql:// URL"
    try:
        parts = urlsplit(store)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    query = parse_qs(parts.query)
    if not parts.path.strip("/") and "dbname" not in query:
        return "a postgresql:// URL needs a database name (postgresql://user@host/dbname)"
    if not parts.hostname and "host" not in query:
        return "a postgresql:// URL needs a host (postgresql://user@host/dbname, or ?host=/socket/dir)"
    return ""
