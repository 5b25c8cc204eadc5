"""`hopsmgr drain NODE --reason TEXT` on a real local cluster: the reason is shown by `nodes` and the
API, survives a master restart and a second drain without a reason, goes with undrain, and a bad reason
is refused naming the field."""

from __future__ import annotations

from tests.integration.cluster import LocalCluster


def test_a_drain_reason_is_shown_kept_across_a_restart_and_cleared_by_undrain(cluster: LocalCluster) -> None:
    out = cluster.cli("drain", "n1", "--reason", "GPU 1 ECC errors").stdout
    assert out.strip() == "n1: drained (GPU 1 ECC errors)"
    assert "n1: GPU 1 ECC errors" in cluster.cli("nodes").stdout
    cluster.kill_master()
    cluster.start_master()
    node = cluster.api("GET", "/api/v1/nodes/n1")
    assert node["drained"] is True and node["drain_reason"] == "GPU 1 ECC errors"
    # drained again without a reason: the reason it was drained for stays; a new reason replaces it
    assert cluster.cli("drain", "n1").stdout.strip() == "n1: drained (GPU 1 ECC errors)"
    assert cluster.api("GET", "/api/v1/nodes/n1")["drain_reason"] == "GPU 1 ECC errors"
    assert cluster.cli("drain", "n1", "--reason", "fan").stdout.strip() == "n1: drained (fan)"
    status, answer = cluster.request("POST", "/api/v1/nodes/n2/drain", {"reason": 7})
    assert status == 400 and answer["error"]["field"] == "reason", answer
    assert cluster.api("GET", "/api/v1/nodes/n2")["drained"] is False  # nothing changed
    # operations that take no body refuse one (none, or {} as the CLI sends, is fine)
    for verb in ("undrain", "calibrate"):
        for bad in (b"x", {"reason": "x"}):  # not JSON; JSON, but not empty
            status, answer = cluster.request("POST", f"/api/v1/nodes/n2/{verb}", bad)
            assert status == 400 and "body" in answer["error"]["message"], (verb, bad, answer)
        assert cluster.request("POST", f"/api/v1/nodes/n2/{verb}", {})[0] == 200
    assert cluster.cli("undrain", "n1").stdout.strip() == "n1: not drained"
    assert cluster.api("GET", "/api/v1/nodes/n1")["drain_reason"] is None
    assert cluster.cli("drain", "n2").stdout.strip() == "n2: drained"  # a reason stays optional
