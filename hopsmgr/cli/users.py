"""`hopsmgr user add | list | show | set | remove` and `hopsmgr token list | revoke`: identities.

Thin clients of /api/v1/users and /api/v1/tokens (hopsmgr.master.identity says who may do what):
admins manage users; everyone lists and revokes the tokens they may (admin: all, tenant admin: the
tenant's, user: its own). Tokens are listed by their public id, never by their secret.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from hopsmgr.cli.client import ApiClient
from hopsmgr.cli.text import table, timestamp
from hopsmgr.protocol import ROLES

API = "/api/v1"
Add = Callable[..., argparse.ArgumentParser]


def _user_path(name: str) -> str:
    return f"{API}/users/{urllib.parse.quote(name, safe='')}"


def _emit(args: argparse.Namespace, doc: Any, text: Callable[[Any], str]) -> int:
    print(json.dumps(doc, indent=2) if args.json else text(doc))
    return 0


def users_table(users: list[dict[str, Any]]) -> str:
    rows = [
        (u["name"], u["tenant"], u["unix_user"] or "-", u["role"], str(u["tokens"]), timestamp(u["created"]))
        for u in users
    ]
    return table(("NAME", "TENANT", "UNIX", "ROLE", "TOKENS", "CREATED"), rows)


def tokens_table(tokens: list[dict[str, Any]]) -> str:
    rows = [(t["id"], t["user"], t["tenant"], timestamp(t["created"])) for t in tokens]
    return table(("ID", "USER", "TENANT", "CREATED"), rows)


def _user_line(doc: dict[str, Any]) -> str:
    unix = doc["unix_user"] or "no Unix account"
    return f"{doc['name']}: tenant {doc['tenant']}, {unix}, role {doc['role']}"


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    return {
        k: v
        for k, v in (("tenant", args.tenant), ("unix_user", args.unix_user), ("role", args.role))
        if v is not None
    }


def cmd_user_add(args: argparse.Namespace, client: ApiClient) -> int:
    body = {"name": args.name, **_changes(args)}
    return _emit(args, client.post(f"{API}/users", body), _user_line)


def cmd_user_list(args: argparse.Namespace, client: ApiClient) -> int:
    return _emit(args, client.get(f"{API}/users"), lambda d: users_table(d["users"]))


def cmd_user_show(args: argparse.Namespace, client: ApiClient) -> int:
    return _emit(args, client.get(_user_path(args.name)), _user_line)


def cmd_user_set(args: argparse.Namespace, client: ApiClient) -> int:
    return _emit(args, client.post(_user_path(args.name), _changes(args)), _user_line)


def cmd_user_remove(args: argparse.Namespace, client: ApiClient) -> int:
    doc = client.delete(_user_path(args.name))
    return _emit(args, doc, lambda d: f"{d['name']}: removed, {d['tokens_revoked']} token(s) revoked")


def cmd_token_list(args: argparse.Namespace, client: ApiClient) -> int:
    return _emit(args, client.get(f"{API}/tokens"), lambda d: tokens_table(d["tokens"]))


def cmd_token_revoke(args: argparse.Namespace, client: ApiClient) -> int:
    doc = client.delete(f"{API}/tokens/{urllib.parse.quote(args.id, safe='')}")
    return _emit(args, doc, lambda d: f"{d['id']} ({d['user']}): revoked")


def _identity_options(parser: argparse.ArgumentParser, *, tenant_required: bool) -> None:
    parser.add_argument("--tenant", required=tenant_required, help="the user's tenant")
    parser.add_argument(
        "--unix-user", metavar="ACCOUNT", help="the Unix account its jobs run as ('' for none)"
    )
    parser.add_argument("--role", choices=ROLES, help="user (default), tenant-admin or admin")


def register(subparsers: Any, token_sub: Any, add: Add) -> None:
    """Add `user ...` to the CLI and `list`, `revoke` to its `token` command (`add` is wiring._add
    with the common connection options)."""
    add(token_sub, "list", cmd_token_list, "list the tokens you may revoke (ids, never the secrets)")
    add(token_sub, "revoke", cmd_token_revoke, "revoke a token by its id").add_argument(
        "id", help="the token's id (token list)"
    )
    user = subparsers.add_parser("user", help="users: add, list, show, set, remove (admin)")
    user_sub = user.add_subparsers(dest="user_command", required=True)
    p = add(user_sub, "add", cmd_user_add, "add a user (admin)")
    p.add_argument("name")
    _identity_options(p, tenant_required=True)
    add(user_sub, "list", cmd_user_list, "list users")
    add(user_sub, "show", cmd_user_show, "show a user").add_argument("name")
    p = add(user_sub, "set", cmd_user_set, "change a user's tenant, Unix account or role (admin)")
    p.add_argument("name")
    _identity_options(p, tenant_required=False)
    add(user_sub, "remove", cmd_user_remove, "remove a user and revoke its tokens (admin)").add_argument(
        "name"
    )
