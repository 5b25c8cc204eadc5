"""Which Unix account a principal's jobs run as, and every refusal of `identity.run_as` with its
reason (a real SQLite store; the accounts are the master machine's own: root, and a system account).
The end-to-end refusals at submit, through the CLI, are in tests/integration/test_run_as.py; the one
case the API cannot reach, a stored user whose tenant is no longer in the cluster file (the file
changed since), is only here."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from hopsmgr.config import ClusterConfig, parse_cluster_config
from hopsmgr.master.access import Principal
from hopsmgr.master.controller import RequestError
from hopsmgr.master.identity import run_as
from hopsmgr.master.store import Store


def config(run_as_users: bool = True, min_uid: int = 1000) -> ClusterConfig:
    return parse_cluster_config(
        {
            "servers": [{"id": "s", "gpu_type": "v100", "gpus": 2}],
            "tenants": [{"name": "lab"}],
            "master": {"run_as_users": run_as_users, "min_uid": min_uid, "checkpoint_shared": False},
        }
    )


def regular_account() -> str | None:
    return next((p.pw_name for p in pwd.getpwall() if p.pw_uid >= 1000 and p.pw_uid != 65534), None)


def test_each_refusal_names_the_user_and_the_reason(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    system = next(p for p in pwd.getpwall() if 0 < p.pw_uid < 1000)
    store.put_user("gone", "old-lab", "root", "user", 1.0)  # its tenant left the cluster file
    store.put_user("nounix", "lab", "", "user", 1.0)
    store.put_user("ghost", "lab", "no-such-account-x", "user", 1.0)
    store.put_user("rooted", "lab", "root", "user", 1.0)
    store.put_user("sys", "lab", system.pw_name, "user", 1.0)
    cases = {
        "stranger": "'stranger' is not a known user",
        "gone": "user 'gone' is not mapped to a configured tenant",
        "nounix": "user 'nounix' has no Unix account",
        "ghost": "no Unix account 'no-such-account-x' on the master",
        "rooted": "the Unix account 'root' (uid 0) is a system account",
        "sys": f"the Unix account {system.pw_name!r} (uid {system.pw_uid}) is a system account",
    }
    for user, message in cases.items():
        with pytest.raises(RequestError) as caught:
            run_as(store, config(), Principal(user, "lab"))
        assert caught.value.status == 422 and caught.value.field == "user", caught.value
        assert message in str(caught.value), (user, str(caught.value))
    # a lower min_uid lets the system account through; root never
    assert run_as(store, config(min_uid=system.pw_uid), Principal("sys", "lab")) == system.pw_name
    with pytest.raises(RequestError, match="uid 0"):
        run_as(store, config(min_uid=1), Principal("rooted", "lab"))
    # without run_as_users every job runs as the service account: nothing is checked
    assert run_as(store, config(run_as_users=False), Principal("stranger", "lab")) == ""
    if (name := regular_account()) is not None:
        store.put_user("ok", "lab", name, "user", 1.0)
        assert run_as(store, config(), Principal("ok", "lab")) == name
    store.close()
