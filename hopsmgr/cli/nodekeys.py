"""`hopsmgr nodes add NODE --config FILE`: record a node's SSH host key, only when the operator confirms.

Runs on the head node (no API call): it reads the node's address and SSH port from the cluster file,
fetches the host key the node offers, prints its SHA256 fingerprint and asks the operator to compare it
with the one the node itself shows (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on its console).
Only a "yes" (or `--fingerprint` equal to the key's) appends it to the master's known_hosts. The master
never accepts an unknown or changed key on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from hopsmgr.config import ConfigError, load_cluster_config
from hopsmgr.master.executor import ExecutorError
from hopsmgr.master.server import default_state_dir
from hopsmgr.master.ssh import add_known_host, fingerprint, scan_host_key


def add_node_key(args: argparse.Namespace) -> int:
    if not args.node or not args.config:
        print("hopsmgr nodes add: error: give the node id and --config FILE", file=sys.stderr)
        return 2
    try:
        config = load_cluster_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.node not in {s.id for s in config.servers}:
        print(f"hopsmgr nodes add: error: node {args.node!r} is not in {args.config}", file=sys.stderr)
        return 2
    m = config.master
    state_dir = args.state_dir or Path(m.state_dir or default_state_dir())
    known_hosts = Path(m.known_hosts) if m.known_hosts else state_dir / "known_hosts"
    access = config.node_access(args.node)
    try:
        line = asyncio.run(scan_host_key(access.address, access.ssh_port, m.ssh_connect_timeout_s))
    except ExecutorError as exc:
        print(
            f"error: cannot fetch the host key of {args.node} ({access.address}:{access.ssh_port}): {exc}",
            file=sys.stderr,
        )
        return 1
    print_ = fingerprint(line)
    print(f"{args.node} ({access.address}:{access.ssh_port}) offers the host key {print_}")
    if args.fingerprint is not None:
        if args.fingerprint != print_:
            print(
                f"error: the key's fingerprint is not {args.fingerprint}: nothing recorded", file=sys.stderr
            )
            return 1
    else:
        if not sys.stdin.isatty():
            print("error: not a terminal: confirm with --fingerprint SHA256:... instead", file=sys.stderr)
            return 2
        answer = input("Does it match the fingerprint the node shows on its own console? [yes/NO] ")
        if answer.strip().lower() != "yes":
            print("nothing recorded")
            return 1
    add_known_host(known_hosts, line)
    print(f"recorded in {known_hosts}")
    return 0
