"""The real master asks a job without the runtime for a checkpoint with the job's own signal and
grace (`--checkpoint-signal`, `--grace`): the master's node command (hopsmgr.master.commands.stop),
the local executor and the node wrapper, with a real job process that traps the signal. The decision
to preempt such a job is the state machine's (tests/control/test_no_runtime.py); here the command the
machine would emit is handed to the master's command code as the machine hands it over."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hopsmgr.control.commands import CheckpointAndStop
from hopsmgr.master import commands
from tests.helpers.inprocess import InProcessCluster

CONFIG: dict[str, Any] = {
    "cluster": {"name": "in-process-signal"},
    "servers": [{"id": "n1", "gpu_type": "v100", "gpus": 1}],
    "scheduler": {"round_seconds": 2},
    "master": {"heartbeat_interval_s": 0.5, "suspect_after_s": 3, "lost_after_s": 8},
}
SCRIPT = 'trap "echo checkpoint asked by USR2; exit 0" USR2; echo ready; while true; do sleep 0.1; done'


def test_the_master_sends_the_jobs_own_checkpoint_signal_and_grace(
    in_process_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = in_process_cluster(CONFIG)
    cluster.wait(
        lambda: cluster.api("GET", "/api/v1/nodes")["nodes"][0]["health"] == "HEALTHY", 30, "healthy"
    )
    body = {
        "command": ["/bin/sh", "-c", SCRIPT],
        "gpus": [1],
        "runtime": False,
        "time_s": 3600,
        "checkpoint_signal": "SIGUSR2",
        "grace_s": 7,
    }
    job_id = cluster.api("POST", "/api/v1/jobs", body)["id"]
    ctl = cluster.master.ctl
    assert ctl is not None

    def log() -> str:
        return str(cluster.api("GET", f"/api/v1/jobs/{job_id}/logs")["log"])

    cluster.wait(lambda: "ready" in log(), 60, f"{job_id} running")
    asked: list[tuple[Any, ...]] = []
    real = ctl.executor.checkpoint

    async def recorded(*args: Any) -> Any:  # the real executor still does it
        asked.append(args)
        return await real(*args)

    ctl.executor.checkpoint = recorded  # type: ignore[method-assign]
    job = ctl.machine.state.jobs[job_id]
    assert job.attempt is not None
    attempt = ctl.machine.state.attempts[job.attempt]
    command = CheckpointAndStop("test", attempt.id, job_id, attempt.placement, "preempted")
    cluster.call(commands.stop(ctl, command, checkpoint=True), timeout=60)
    assert len(asked) == 1, asked
    _, attempt_id, _, wait_s, _, signal_name = asked[0]
    assert (attempt_id, wait_s, signal_name) == (attempt.id, 7, "SIGUSR2"), asked
    cluster.wait(lambda: "checkpoint asked by USR2" in log(), 30, "the job's trap to run")
    cluster.cancel_all()
