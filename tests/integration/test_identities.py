"""Identities on a running master, driven like users would: `hopsmgr user ...`, `hopsmgr token ...`,
HTTP, and who sees what of whose jobs (a real master and agent process, the CLI as a subprocess).

The state file is one an older hopsmgr wrote (tokens, no users): its token must keep working.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.cluster import LocalCluster, Node
from tests.master.test_store_users import old_store

CONFIG = """
[[tenants]]
name = "vision"
guaranteed_gpus = 1
[[tenants]]
name = "nlp"
[[users]]
name = "ana"
tenant = "vision"
unix_user = "ana"
[[users]]
name = "cy"
tenant = "vision"
[[users]]
name = "lead"
tenant = "vision"
role = "tenant-admin"
[[users]]
name = "bo"
tenant = "nlp"
"""
LEGACY = "legacy-token-from-an-old-store-0123456789"


@pytest.fixture(scope="module")
def cl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("identities")
    (root / "state").mkdir()
    old_store(root / "state" / "state.db", [(LEGACY, "olduser", "nlp", 0)])
    c = LocalCluster(root, [Node("n1", "v100", 2, 1.0)], tenants=CONFIG)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def tokens(cl: LocalCluster) -> dict[str, str]:
    out = {}
    for name in ("ana", "cy", "lead", "bo"):
        proc = cl.cli("token", "create", "--user", name)  # seeded users: no tenant needed
        out[name] = proc.stdout.strip()
    return out


def cli_json(cl: LocalCluster, *args: str, token: str | None = None) -> Any:
    return json.loads(cl.cli(*args, "--json", token=token).stdout)


def test_seeded_and_migrated_users(cl: LocalCluster, tokens: dict[str, str]) -> None:
    users = {u["name"]: u for u in cli_json(cl, "user", "list")["users"]}
    assert {n: (u["tenant"], u["role"], u["unix_user"]) for n, u in users.items()} == {
        "admin": ("vision", "admin", ""),
        "ana": ("vision", "user", "ana"),
        "bo": ("nlp", "user", ""),
        "cy": ("vision", "user", ""),
        "lead": ("vision", "tenant-admin", ""),
        "olduser": ("nlp", "user", ""),
    }
    assert users["ana"]["tokens"] == 1
    # the old store's token still works, as the user the migration made of it
    status, doc = cl.request("GET", "/api/v1/tenants", token=LEGACY)
    assert status == 200 and [t["name"] for t in doc["tenants"]] == ["nlp"]
    text = cl.cli("user", "list").stdout.splitlines()
    assert text[0].split() == ["NAME", "TENANT", "UNIX", "ROLE", "TOKENS", "CREATED"]
    # a user sees only itself; a tenant admin its tenant's users
    assert [u["name"] for u in cli_json(cl, "user", "list", token=tokens["ana"])["users"]] == ["ana"]
    listed = cli_json(cl, "user", "list", token=tokens["lead"])["users"]
    assert {u["name"] for u in listed} == {"admin", "ana", "cy", "lead"}
    proc = cl.cli("user", "show", "bo", token=tokens["ana"], check=False)
    assert proc.returncode == 1 and "user: no user 'bo'" in proc.stderr


def test_user_add_set_remove(cl: LocalCluster, tokens: dict[str, str]) -> None:
    before = cl.api("GET", "/api/v1/users")["users"]
    bad = [
        (("user", "add", "dee", "--tenant", "physics"), "tenant: unknown tenant 'physics'"),
        (("user", "add", "dee", "--tenant", "nlp", "--unix-user", "Dee!"), "unix_user:"),
        (("user", "add", "dee", "--tenant", "nlp", "--unix-user", "root"), "unix_user: 'root' may not run jobs"),
        (("user", "add", "ana", "--tenant", "nlp"), "name: user 'ana' exists"),
        (("user", "set", "nobody", "--role", "admin"), "user: no user 'nobody'"),
        (("user", "set", "admin", "--role", "user"), "role: user 'admin' cannot change its own role"),
        (("user", "remove", "admin"), "user: user 'admin' cannot remove itself"),
    ]  # fmt: skip
    for args, message in bad:
        proc = cl.cli(*args, check=False)
        assert proc.returncode == 1 and message in proc.stderr, (args, proc.stderr)
    status, doc = cl.request("POST", "/api/v1/users", {"name": "dee", "tenant": "nlp", "role": "boss"})
    assert status == 400 and doc["error"]["field"] == "role", doc
    proc = cl.cli("user", "add", "dee", "--tenant", "nlp", token=tokens["lead"], check=False)
    assert proc.returncode == 1 and "needs an admin token" in proc.stderr
    assert cl.api("GET", "/api/v1/users")["users"] == before  # nothing stored by any refusal

    assert cl.cli("user", "add", "dee", "--tenant", "nlp", "--unix-user", "dee").stdout.strip() == (
        "dee: tenant nlp, dee, role user"
    )
    dee = cl.cli("token", "create", "--user", "dee").stdout.strip()
    assert [t["name"] for t in cl.api("GET", "/api/v1/tenants", token=dee)["tenants"]] == ["nlp"]
    cl.cli("user", "set", "dee", "--tenant", "vision", "--role", "tenant-admin")
    assert [t["name"] for t in cl.api("GET", "/api/v1/tenants", token=dee)["tenants"]] == ["vision"]
    assert cl.api("GET", "/api/v1/users/dee", token=dee)["role"] == "tenant-admin"
    out = cl.cli("user", "remove", "dee").stdout.strip()
    assert out == "dee: removed, 1 token(s) revoked"
    status, doc = cl.request("GET", "/api/v1/tenants", token=dee)
    assert status == 401 and doc["error"]["field"] == "Authorization"


def test_token_create_list_revoke(cl: LocalCluster, tokens: dict[str, str]) -> None:
    proc = cl.cli("token", "create", "--user", "ghost", check=False)
    assert proc.returncode == 1 and "user: no user 'ghost'" in proc.stderr
    proc = cl.cli("token", "create", "--user", "ana", "--tenant", "nlp", check=False)
    assert proc.returncode == 1 and "tenant: user 'ana' belongs to tenant 'vision'" in proc.stderr
    proc = cl.cli("token", "create", "--user", "ana", "--admin", check=False)
    assert proc.returncode == 1 and "admin: user 'ana' has role 'user'" in proc.stderr
    # the old way (a new user with its tenant) still makes the user
    fay = cl.cli("token", "create", "--user", "fay", "--tenant", "nlp").stdout.strip()
    assert cl.api("GET", "/api/v1/users/fay")["tenant"] == "nlp"
    second = cli_json(cl, "token", "create", "--user", "ana")
    mine = cli_json(cl, "token", "list", token=tokens["ana"])["tokens"]
    assert {t["user"] for t in mine} == {"ana"} and len(mine) == 2
    every = cli_json(cl, "token", "list")["tokens"]
    assert {"ana", "bo", "fay", "admin", "olduser"} <= {t["user"] for t in every}
    listing = cl.cli("token", "list").stdout
    for secret in (*tokens.values(), fay, second["token"]):
        assert secret not in listing
    # ana cannot revoke bo's token (it does not exist for her); she can revoke her own
    bo_id = next(t["id"] for t in every if t["user"] == "bo")
    proc = cl.cli("token", "revoke", bo_id, token=tokens["ana"], check=False)
    assert proc.returncode == 1 and f"token: no token '{bo_id}'" in proc.stderr
    proc = cl.cli("token", "revoke", "not-an-id", check=False)
    assert proc.returncode == 1 and "token: not a token id" in proc.stderr
    out = cl.cli("token", "revoke", second["id"], token=tokens["ana"]).stdout.strip()
    assert out == f"{second['id']} (ana): revoked"
    assert cl.request("GET", "/api/v1/cluster", token=second["token"])[0] == 401
    assert cl.request("GET", "/api/v1/cluster", token=tokens["ana"])[0] == 200


def submit(cl: LocalCluster, token: str, name: str) -> str:
    body = {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "gpus": [2],
        "batch_size": 8,
        "iterations": 10,
        "name": name,
        "env": {"SECRET": f"{name.removesuffix('-job')}-secret"},
    }
    return str(cl.api("POST", "/api/v1/jobs", body, token)["id"])


def test_who_sees_and_cancels_what(cl: LocalCluster, tokens: dict[str, str]) -> None:
    ana = submit(cl, tokens["ana"], "ana-job")
    cy = submit(cl, tokens["cy"], "cy-job")
    bo = submit(cl, tokens["bo"], "bo-job")
    assert cl.job(ana)["user"] == "ana" and cl.job(cy)["user"] == "cy"
    # ana: her job in full, cy's as a queue line without its name, command, env or logs; bo's not at all
    listed = {j["id"]: j for j in cli_json(cl, "queue", "--all", token=tokens["ana"])["jobs"]}
    assert set(listed) >= {ana, cy} and bo not in listed
    assert listed[ana]["name"] == "ana-job" and listed[cy]["name"] == "" and listed[cy]["user"] == "cy"
    assert "cy-secret" not in json.dumps(listed) and "sleep" not in json.dumps(listed)
    table = cl.cli("queue", "--all", token=tokens["ana"]).stdout.splitlines()
    assert table[0].split()[:5] == ["POS", "ID", "NAME", "USER", "TENANT"]
    assert any(line.split()[1:4] == [ana, "ana-job", "ana"] for line in table[1:])
    assert [j["id"] for j in cli_json(cl, "queue", "--all", "--user", "cy", token=tokens["ana"])["jobs"]] == [
        cy
    ]
    assert cli_json(cl, "show", ana, token=tokens["ana"])["env"] == {"SECRET": "ana-secret"}
    for args in (("show", cy), ("logs", cy), ("explain", cy), ("cancel", cy)):
        proc = cl.cli(*args, token=tokens["ana"], check=False)
        assert proc.returncode == 1 and f"id: job {cy} is cy's" in proc.stderr, (args, proc.stderr)
        assert "cy-secret" not in proc.stdout + proc.stderr
    proc = cl.cli("show", bo, token=tokens["ana"], check=False)
    assert proc.returncode == 1 and f"id: no job '{bo}'" in proc.stderr
    assert cl.job(cy)["state"] != "CANCELLED"
    # the tenant admin sees and cancels every job of vision, and nothing of nlp
    assert cli_json(cl, "show", cy, token=tokens["lead"])["env"] == {"SECRET": "cy-secret"}
    assert cl.cli("cancel", cy, token=tokens["lead"]).stdout.strip() == f"{cy}: CANCELLED"
    listed = {j["id"]: j for j in cli_json(cl, "queue", "--all", token=tokens["lead"])["jobs"]}
    assert listed[ana]["name"] == "ana-job" and bo not in listed
    assert cl.cli("cancel", bo, token=tokens["lead"], check=False).returncode == 1
    # ana cancels her own job; the admin sees all
    assert cl.cli("cancel", ana, token=tokens["ana"]).stdout.strip() == f"{ana}: CANCELLED"
    every = {j["id"]: j for j in cli_json(cl, "queue", "--all")["jobs"]}
    assert every[bo]["name"] == "bo-job" and every[bo]["user"] == "bo"
    cl.cli("cancel", bo)
