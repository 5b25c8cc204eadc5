"""`[[users]]` in the cluster file: parsed into UserEntry values; every bad field named with its value."""

from __future__ import annotations

from typing import Any

import pytest

from hopsmgr.config import ConfigError, UserEntry, parse_cluster_config

BASE: dict[str, Any] = {
    "servers": [{"id": "n1", "gpu_type": "v100", "gpus": 2}],
    "tenants": [{"name": "vision"}, {"name": "nlp"}],
}


def config(*users: dict[str, Any]) -> Any:
    return parse_cluster_config({**BASE, "users": list(users)}, "lab.toml")


def test_users_parse_with_defaults() -> None:
    cfg = config(
        {"name": "ana", "tenant": "vision", "unix_user": "ana", "role": "tenant-admin"},
        {"name": "bo", "tenant": "nlp"},
    )
    assert cfg.users == (
        UserEntry("ana", "vision", "ana", "tenant-admin"),
        UserEntry("bo", "nlp", "", "user"),
    )
    assert parse_cluster_config(BASE).users == ()


@pytest.mark.parametrize(
    ("user", "key", "message"),
    [
        ({"tenant": "vision"}, "users[0].name", "is required (got nothing)"),
        ({"name": "a b", "tenant": "vision"}, "users[0].name", "must be a name matching"),
        ({"name": "ana"}, "users[0].tenant", "is required"),
        ({"name": "ana", "tenant": "physics"}, "users[0].tenant", "unknown tenant (known: vision, nlp) (got 'physics')"),
        ({"name": "ana", "tenant": "vision", "role": "boss"}, "users[0].role", "must be one of user, tenant-admin, admin (got 'boss')"),
        ({"name": "ana", "tenant": "vision", "unix_user": "Ana!"}, "users[0].unix_user", "must be a Unix account name"),
        ({"name": "ana", "tenant": "vision", "unix_user": "root"}, "users[0].unix_user", "root may not run jobs"),
        ({"name": "ana", "tenant": "vision", "unix_user": 7}, "users[0].unix_user", "must be a string (got 7)"),
        ({"name": "ana", "tenant": "vision", "uid": 1000}, "users[0].uid", "unknown key"),
    ],
)  # fmt: skip
def test_bad_users_name_field_and_value(user: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(user)
    assert info.value.key == key
    assert str(info.value).startswith(f"lab.toml: {key}: ")
    assert message in str(info.value)


def test_duplicate_user() -> None:
    with pytest.raises(
        ConfigError, match=r"users\[1\]\.name: duplicate user name \(first defined at users\[0\]\.name\)"
    ):
        config({"name": "ana", "tenant": "vision"}, {"name": "ana", "tenant": "nlp"})


@pytest.mark.parametrize("value", [0, -1, True, 2**31])
def test_min_uid_is_checked(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cluster_config({**BASE, "master": {"run_as_users": True, "min_uid": value}}, "lab.toml")
    assert info.value.key == "master.min_uid", str(info.value)
    cfg = parse_cluster_config({**BASE, "master": {"run_as_users": True, "min_uid": 2000}})
    assert (cfg.master.run_as_users, cfg.master.min_uid) == (True, 2000)
