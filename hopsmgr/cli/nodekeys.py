"""`hopsmgr nodes add NODE --config FILE`: record a node's SSH host key, only when the operator confirms.

Runs on the head node (no API call): it reads the node's address and SSH port from the cluster file,
fetches every host key the node offers and prints each one's type and SHA256 fingerprint (ED25519
first), and asks the operator to compare the ED25519 one (else the first) with the one the node itself
shows (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on its console). Only a "yes" records that
key; `--fingerprint` records whichever of the node's keys has that fingerprint. The master never
accepts an unknown or changed key on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from hopsmgr.config import ConfigError, load_cluster_config
from hopsmgr.master.executor import ExecutorError
from hopsmgr.master.known_hosts import add_known_host, fingerprint, key_type, scan_host_keys
from hopsmgr.master.server import default_state_dir


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
        lines = asyncio.run(scan_host_keys(access.address, access.ssh_port, m.ssh_connect_timeout_s))
    except ExecutorError as exc:
        print(
            f"error: cannot fetch the host keys of {args.node} ({access.address}:{access.ssh_port}): {exc}",
            file=sys.stderr,
        )
        return 1
    prints = [(key_type(line), fingerprint(line), line) for line in lines]
    print(f"{args.node} ({access.address}:{access.ssh_port}) offers these host keys:")
    for kind, print_, _ in prints:
        print(f"  {kind:8} {print_}")
    if args.fingerprint is not None:
        matching = [line for _, print_, line in prints if print_ == args.fingerprint]
        if not matching:
            print(
                f"error: none of the node's keys has the fingerprint {args.fingerprint}: nothing recorded",
                file=sys.stderr,
            )
            return 1
        line = matching[0]
    else:
        if not sys.stdin.isatty():
            print("error: not a terminal: confirm with --fingerprint SHA256:... instead", file=sys.stderr)
            return 2
        kind, print_, line = prints[0]  # ED25519 when the node has one
        answer = input(
            f"Does the {kind} key's {print_} match the fingerprint the node shows on its own console"
            f" (ssh-keygen -lf /etc/ssh/ssh_host_{kind.lower()}_key.pub)? [yes/NO] "
        )
        if answer.strip().lower() != "yes":
            print("nothing recorded")
            return 1
    print(f"recording the {key_type(line)} key {fingerprint(line)}")
    add_known_host(known_hosts, line)
    print(f"recorded in {known_hosts}")
    return 0
