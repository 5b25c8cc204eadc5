"""Users and their tokens: who a bearer token speaks for, what each role may do with users and tokens.

A user has a name, a tenant, a Unix account (what its jobs run as, where the nodes run jobs as their
users) and a role: `user` (its own jobs; the tenant's queue read-only), `tenant-admin` (every job of
its tenant) or `admin` (everything). Every token belongs to one user and takes the user's tenant and
role at each request, so `user set` changes what existing tokens may do. The cluster file's
`[[users]]` seed the store at every start (the file wins for the users it names). Every refusal is a
`RequestError` naming the field; nothing is stored when a request is refused.
"""

from __future__ import annotations

import hashlib
import pwd
import time
from collections.abc import Callable
from typing import Any

from hopsmgr.config import ClusterConfig
from hopsmgr.master.access import Principal
from hopsmgr.master.errors import RequestError
from hopsmgr.master.store import Row, Store
from hopsmgr.master.tokens import new_token
from hopsmgr.protocol import TokenRequest, UserRequest

REFUSED_UNIX_USERS = frozenset({"root"})


class PrincipalCache:
    """Who known tokens speak for, kept `ttl_s` seconds, so an API call needs no store read to be
    authenticated (two reads on the event loop's connection each time, which at 20 calls a second
    under load waited for the interpreter lock behind the store writer). The master clears it
    whenever it changes tokens or users; a change made elsewhere (another master, the store edited by
    hand) takes effect within `ttl_s`. Unknown tokens are not kept."""

    def __init__(self, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._known: dict[bytes, tuple[Principal, float]] = {}

    def lookup(self, store: Store, token: str) -> Principal | None:
        key = hashlib.sha256(token.encode()).digest()  # the secret itself is not kept
        now = self.clock()
        hit = self._known.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        who = principal_for(store, token)
        if who is None:
            self._known.pop(key, None)
        else:
            if len(self._known) >= 10_000:
                self._known.clear()
            self._known[key] = (who, now + self.ttl_s)
        return who

    def clear(self) -> None:
        self._known.clear()


def principal_for(store: Store, token: str) -> Principal | None:
    """The principal a user token speaks for (None for an unknown token)."""
    row = store.find_token(token)
    if row is None:
        return None
    user = store.user(row["user"])
    if user is None:  # a token whose user was removed by hand: what the token row says
        return Principal(row["user"], row["tenant"], bool(row["admin"]))
    role = user["role"]
    return Principal(user["name"], user["tenant"], role == "admin", tenant_admin=role == "tenant-admin")


def seed_users(store: Store, config: ClusterConfig, now: float) -> None:
    """Store the cluster file's `[[users]]` (added, or changed to what the file says)."""
    with store.transaction():
        for u in config.users:
            store.put_user(u.name, u.tenant, u.unix_user, u.role, now)


def run_as(store: Store, config: ClusterConfig, who: Principal) -> str:
    """The Unix account `who`'s jobs run as ("" unless `[master] run_as_users`); refuses (422, field
    "user") a principal that is no stored user, not in a configured tenant, without a Unix account,
    or whose account is root or a system account (uid below `min_uid`) on the master."""
    m = config.master
    if not m.run_as_users:
        return ""
    row = store.user(who.user)
    where = "jobs run as their submitter's Unix account on this cluster"
    if row is None:
        raise RequestError(422, "user", f"{who.user!r} is not a known user ({where}: hopsmgr user add)")
    if row["tenant"] not in {t.name for t in config.tenants}:
        raise RequestError(422, "user", f"user {who.user!r} is not mapped to a configured tenant")
    unix = row["unix_user"]
    if not unix:
        raise RequestError(
            422,
            "user",
            f"user {who.user!r} has no Unix account ({where}: hopsmgr user set {who.user} --unix-user NAME)",
        )
    try:
        uid = pwd.getpwnam(unix).pw_uid
    except KeyError:
        raise RequestError(
            422, "user", f"user {who.user!r}: no Unix account {unix!r} on the master"
        ) from None
    if uid == 0 or uid < m.min_uid:
        raise RequestError(
            422,
            "user",
            f"user {who.user!r}: the Unix account {unix!r} (uid {uid}) is a system account; jobs run only "
            f"as accounts with uid >= {m.min_uid} ([master] min_uid)",
        )
    return str(unix)


def user_view(row: Row, store: Store) -> dict[str, Any]:
    return {
        "name": row["name"],
        "tenant": row["tenant"],
        "unix_user": row["unix_user"],
        "role": row["role"],
        "created": row["created"],
        "tokens": len(store.tokens(row["name"])),
    }


def _known_tenant(config: ClusterConfig, tenant: str) -> str:
    known = [t.name for t in config.tenants]
    if tenant not in known:
        raise RequestError(422, "tenant", f"unknown tenant {tenant!r} (known: {', '.join(known)})")
    return tenant


def _unix_user(value: str) -> str:
    if value in REFUSED_UNIX_USERS:
        raise RequestError(422, "unix_user", f"{value!r} may not run jobs (a system account)")
    return value


def _may_see_user(who: Principal, row: Row) -> bool:
    return who.admin or row["name"] == who.user or (who.tenant_admin and row["tenant"] == who.tenant)


def _require_admin(who: Principal) -> None:
    if not who.admin:
        raise RequestError(403, None, f"user {who.user!r} cannot manage users: this needs an admin token")


def list_users(store: Store, who: Principal) -> list[dict[str, Any]]:
    return [user_view(r, store) for r in store.users() if _may_see_user(who, r)]


def show_user(store: Store, who: Principal, name: str) -> dict[str, Any]:
    row = store.user(name)
    if row is None or not _may_see_user(who, row):
        raise RequestError(404, "user", f"no user {name!r}")
    return user_view(row, store)


def add_user(store: Store, config: ClusterConfig, who: Principal, req: UserRequest, now: float) -> Row:
    _require_admin(who)
    assert req.name is not None and req.tenant is not None  # the schema requires both
    if store.user(req.name) is not None:
        raise RequestError(409, "name", f"user {req.name!r} exists (change it with `hopsmgr user set`)")
    store.put_user(
        req.name,
        _known_tenant(config, req.tenant),
        _unix_user(req.unix_user or ""),
        req.role or "user",
        now,
    )
    row = store.user(req.name)
    assert row is not None
    return row


def set_user(
    store: Store, config: ClusterConfig, who: Principal, name: str, req: UserRequest, now: float
) -> Row:
    _require_admin(who)
    row = store.user(name)
    if row is None:
        raise RequestError(404, "user", f"no user {name!r}")
    if name == who.user and req.role is not None and req.role != row["role"]:
        raise RequestError(409, "role", f"user {name!r} cannot change its own role (ask another admin)")
    tenant = _known_tenant(config, req.tenant) if req.tenant is not None else row["tenant"]
    unix_user = _unix_user(req.unix_user) if req.unix_user is not None else row["unix_user"]
    store.put_user(name, tenant, unix_user, req.role or row["role"], now)
    changed = store.user(name)
    assert changed is not None
    return changed


def remove_user(store: Store, who: Principal, name: str) -> dict[str, Any]:
    _require_admin(who)
    if store.user(name) is None:
        raise RequestError(404, "user", f"no user {name!r}")
    if name == who.user:
        raise RequestError(409, "user", f"user {name!r} cannot remove itself (ask another admin)")
    return {"name": name, "removed": True, "tokens_revoked": store.delete_user(name)}


def create_token(
    store: Store, config: ClusterConfig, who: Principal, req: TokenRequest, now: float
) -> dict[str, Any]:
    """A new token for `req.user`; a user not yet known is added (role admin with `admin`, else user)
    when the request names its tenant."""
    if not who.admin:
        raise RequestError(403, None, "this needs an admin token")
    row = store.user(req.user)
    if row is None:
        if req.tenant is None:
            raise RequestError(
                422, "user", f"no user {req.user!r}: add it (hopsmgr user add) or give its tenant"
            )
        store.put_user(req.user, _known_tenant(config, req.tenant), "", "admin" if req.admin else "user", now)
        row = store.user(req.user)
        assert row is not None
    elif req.tenant is not None and req.tenant != row["tenant"]:
        _known_tenant(config, req.tenant)
        raise RequestError(
            422, "tenant", f"user {req.user!r} belongs to tenant {row['tenant']!r}, not {req.tenant!r}"
        )
    elif req.admin and row["role"] != "admin":
        raise RequestError(
            422,
            "admin",
            f"user {req.user!r} has role {row['role']!r}: make it an admin first "
            f"(hopsmgr user set {req.user} --role admin)",
        )
    token = new_token()
    token_id = store.add_token(token, row["name"], row["tenant"], row["role"] == "admin", now)
    return {
        "token": token,
        "id": token_id,
        "user": row["name"],
        "tenant": row["tenant"],
        "admin": row["role"] == "admin",
    }


def _may_manage_token(store: Store, who: Principal, row: Row) -> bool:
    if who.admin or row["user"] == who.user:
        return True
    owner = store.user(row["user"])
    return who.tenant_admin and owner is not None and owner["tenant"] == who.tenant


def list_tokens(store: Store, who: Principal) -> list[Row]:
    return [t for t in store.tokens() if _may_manage_token(store, who, t)]


def revoke_token(store: Store, who: Principal, token_id: str) -> dict[str, Any]:
    row = store.token_by_id(token_id)
    if row is None or not _may_manage_token(store, who, row):
        raise RequestError(404, "token", f"no token {token_id!r}")
    store.delete_token(token_id)
    return {**row, "revoked": True}
