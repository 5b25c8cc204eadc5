"""Moving a job's latest verified checkpoint between nodes that share no filesystem (no mocks).

Two node work directories on this machine stand for two nodes; the SSH executor reaches both through a
real OpenSSH server on 127.0.0.1 (tests/integration/sshd.py) and copies over SFTP through the master.
The local executor's path (`copy_local`) runs without sshd.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hopsmgr.config import ClusterConfig, parse_cluster_config
from hopsmgr.master.checkpoints import MoveResult, move_latest, node_checkpoint_dir
from hopsmgr.master.executor import ExecutorError, LaunchOrder, LocalExecutor, NodeTarget
from hopsmgr.master.ssh import SshExecutor
from hopsmgr.node.layout import record_alive
from hopsmgr.runtime import checkpoint
from tests.integration.cluster import EXAMPLE, PYTHON
from tests.integration.sshd import Sshd

T = TypeVar("T")
JOB = "j-7"
BIG = 20 << 20  # more than two transfer chunks


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def config(sshd: Sshd) -> ClusterConfig:
    server = {"gpu_type": "v100", "gpus": 1, "address": "127.0.0.1", "ssh_port": sshd.port}
    return parse_cluster_config(
        {
            "cluster": {"name": "ckpt-move"},
            "servers": [{"id": "n1", **server}, {"id": "n2", **server}],
            "master": {
                "executor": "ssh",
                "checkpoint_shared": False,
                "ssh_key": str(sshd.user_key),
                "known_hosts": str(sshd.known_hosts),
                "remote_python": PYTHON,
                "ssh_connect_timeout_s": 5.0,
            },
        }
    )


def ckpt_dir(target: NodeTarget) -> Path:
    return Path(node_checkpoint_dir(target.workdir, JOB))


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def corrupt(path: Path) -> None:
    """Flip one byte in the middle: the size still matches the sidecar, the sha256 does not."""
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def two_checkpoints(src: NodeTarget) -> bytes:
    """ckpt 10 (verified, BIG bytes of state), ckpt 20 (corrupt), a ckpt 30 sidecar without data."""
    directory = ckpt_dir(src)
    blob = os.urandom(BIG)
    checkpoint.save(directory, 10, {"blob": blob})
    checkpoint.save(directory, 20, {"blob": os.urandom(BIG)})
    corrupt(checkpoint.data_path(directory, 20))
    checkpoint.sidecar_path(directory, 30).write_text('{"iteration": 30, "size": 5, "sha256": "00"}\n')
    return blob


def check_moved(moved: MoveResult, src: NodeTarget, dst: NodeTarget, blob: bytes) -> None:
    assert moved.iteration == 10 and moved.file == "ckpt-000000010.pkl"
    assert moved.skipped == ("ckpt-000000030.pkl", "ckpt-000000020.pkl")
    assert moved.bytes == checkpoint.data_path(ckpt_dir(src), 10).stat().st_size > BIG
    assert moved.seconds > 0 and moved.mb_per_s > 0
    loaded = checkpoint.load_latest(ckpt_dir(dst))
    assert loaded is not None and loaded[0] == 10 and loaded[1]["blob"] == blob
    assert sorted(p.name for p in ckpt_dir(dst).iterdir()) == ["ckpt-000000010.json", "ckpt-000000010.pkl"]
    for name in ("ckpt-000000010.pkl", "ckpt-000000010.json"):
        assert (ckpt_dir(dst) / name).read_bytes() == (ckpt_dir(src) / name).read_bytes()


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[NodeTarget, NodeTarget]:
    return NodeTarget("n1", str(tmp_path / "node-1")), NodeTarget("n2", str(tmp_path / "node-2"))


# -- over SFTP ----------------------------------------------------------------------------------------


def test_moves_the_newest_verified_checkpoint(
    sshd: Sshd, nodes: tuple[NodeTarget, NodeTarget], tmp_path: Path
) -> None:
    src, dst = nodes
    blob = two_checkpoints(src)
    before = snapshot(ckpt_dir(src))

    async def scenario() -> tuple[MoveResult, MoveResult]:
        ex = SshExecutor(config(sshd), tmp_path)
        try:
            first = await move_latest(ex, src, dst, JOB, spool_dir=str(tmp_path))
            again = await move_latest(ex, src, dst, JOB)  # a retried move overwrites in place
            return first, again
        finally:
            await ex.close()

    first, again = run(scenario())
    check_moved(first, src, dst, blob)
    assert again.iteration == 10
    assert snapshot(ckpt_dir(src)) == before  # the source is never changed
    assert [p.name for p in tmp_path.glob(".hops-ckpt-*")] == []  # the master's spool is cleaned up


def test_no_verified_checkpoint_is_failed(
    sshd: Sshd, nodes: tuple[NodeTarget, NodeTarget], tmp_path: Path
) -> None:
    src, dst = nodes

    async def move() -> MoveResult:
        ex = SshExecutor(config(sshd), tmp_path)
        try:
            return await move_latest(ex, src, dst, JOB)
        finally:
            await ex.close()

    with pytest.raises(ExecutorError) as missing:
        run(move())
    assert missing.value.kind == "failed" and "no checkpoint directory" in missing.value.message

    checkpoint.save(ckpt_dir(src), 5, {"x": 1})
    corrupt(checkpoint.data_path(ckpt_dir(src), 5))
    with pytest.raises(ExecutorError) as unverified:
        run(move())
    assert unverified.value.kind == "failed" and "no verified checkpoint" in unverified.value.message
    assert not ckpt_dir(dst).exists() or list(ckpt_dir(dst).iterdir()) == []


def test_shell_metacharacters_in_work_dirs(sshd: Sshd, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    nasty = f"a b;$(touch {canary})`touch {canary}`'\"*?[x]&|<>"
    src = NodeTarget("n1", str(tmp_path / f"src {nasty}"))
    dst = NodeTarget("n2", str(tmp_path / f"dst {nasty}"))
    checkpoint.save(ckpt_dir(src), 3, {"where": nasty})

    async def scenario() -> MoveResult:
        ex = SshExecutor(config(sshd), tmp_path)
        try:
            return await move_latest(ex, src, dst, JOB)
        finally:
            await ex.close()

    assert run(scenario()).iteration == 3
    assert checkpoint.load_latest(ckpt_dir(dst)) == (3, {"where": nasty})
    assert not canary.exists()


def test_a_job_resumes_on_another_node_from_the_moved_checkpoint(
    sshd: Sshd, nodes: tuple[NodeTarget, NodeTarget], tmp_path: Path
) -> None:
    """The wrapper's default checkpoint dir is node_checkpoint_dir: checkpoint on n1, resume on n2."""
    src, dst = nodes
    argv = [PYTHON, EXAMPLE, "--iters", "100000", "--batch-size", "8", "--step-seconds", "0.02"]

    async def scenario() -> tuple[int, str]:
        ex = SshExecutor(config(sshd), tmp_path)
        try:
            await ex.launch(src, LaunchOrder(attempt="a-1", job=JOB, epoch=1, argv=argv))
            deadline = time.monotonic() + 20
            while ((await ex.status(src, "a-1"))["attempts"][0]["progress"] or {}).get("iteration", 0) < 3:
                assert time.monotonic() < deadline, "a-1 made no progress"
                await asyncio.sleep(0.05)
            info = await ex.checkpoint(src, "a-1", 1, wait_s=15, grace_s=5)
            assert info is not None and info.checkpointed
            moved = await move_latest(ex, src, dst, JOB)
            short = [*argv[:3], str(moved.iteration + 3), *argv[4:]]
            await ex.launch(dst, LaunchOrder(attempt="a-2", job=JOB, epoch=1, argv=short))
            deadline = time.monotonic() + 20
            while (await ex.status(dst, "a-2"))["attempts"][0]["state"] == "running":
                assert time.monotonic() < deadline, "a-2 did not finish"
                await asyncio.sleep(0.05)
            return moved.iteration, await ex.logs(dst, "a-2", 4096)
        finally:
            await ex.close()

    try:
        iteration, log = run(scenario())
    finally:
        for child in Path(tmp_path).glob("node-*/attempts/*/child.json"):  # end any job left running
            pid, alive = record_alive(child)
            if pid is not None and alive:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
    assert iteration >= 3
    assert f"resumed at iteration {iteration}" in log and "final checksum" in log


# -- the local executor (no sshd) ---------------------------------------------------------------------


def test_local_executor_copies_on_this_machine(nodes: tuple[NodeTarget, NodeTarget]) -> None:
    src, dst = nodes
    blob = two_checkpoints(src)
    before = snapshot(ckpt_dir(src))
    check_moved(run(move_latest(LocalExecutor(), src, dst, JOB)), src, dst, blob)
    assert snapshot(ckpt_dir(src)) == before
    empty = NodeTarget("n3", str(Path(src.workdir).parent / "node-3"))
    with pytest.raises(ExecutorError) as missing:
        run(move_latest(LocalExecutor(), empty, dst, JOB))
    assert missing.value.kind == "failed"
