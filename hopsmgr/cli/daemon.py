"""`hopsmgr master`: run the master daemon in the foreground (systemd runs exactly this)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hopsmgr.config import ConfigError, load_cluster_config


def cmd_master(args: argparse.Namespace) -> int:
    from hopsmgr.master import server

    try:
        config = load_cluster_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return server.main(config, args.state_dir, args.listen, args.json_logs)


def register(subparsers: Any) -> None:
    master = subparsers.add_parser("master", help="run the master daemon (API, heartbeats, rounds)")
    master.add_argument("--config", required=True, help="cluster TOML file")
    master.add_argument(
        "--state-dir", help="state directory (default: [master] state_dir, else ~/.local/state/hopsmgr)"
    )
    master.add_argument(
        "--listen", help="host:port to listen on (overrides [master] listen; port 0 picks one)"
    )
    master.add_argument("--json-logs", action="store_true", default=None, help="JSON logs even on a terminal")
    master.set_defaults(func=cmd_master)
