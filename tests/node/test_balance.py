"""Speed-balanced batches (hopsmgr.runtime.balance): parsing HOPS_RANK_SHARES, splitting a global batch,
and the loss scale that makes unequal DDP ranks train exactly like one process on the global batch.

The DDP test runs this file as a script that forks one process per rank (two CPU ranks, gloo on
127.0.0.1).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hopsmgr.runtime import Runtime, Settings
from hopsmgr.runtime.balance import (
    balanced_shares,
    format_shares,
    local_batch_sizes,
    local_slice,
    loss_scale,
    parse_shares,
    shares_from_env,
)

REPO = Path(__file__).resolve().parents[2]
GLOBAL_BATCH = 12
SHARES = (0.75, 0.25)  # local batches of 9 and 3
STEPS = 3
LR = 0.1
TIMEOUT = 60.0
T = TypeVar("T")


# --- parsing -----------------------------------------------------------------------------------------
def test_parse_good_values() -> None:
    assert parse_shares("0.75,0.25", 2) == (0.75, 0.25)
    assert parse_shares(" 0.5 , 0.25,0.25 ", 3) == (0.5, 0.25, 0.25)
    assert parse_shares("1", 1) == (1.0,)
    assert parse_shares("", 4) == (0.25, 0.25, 0.25, 0.25)
    assert parse_shares("  ", 2) == (0.5, 0.5)
    assert parse_shares("", None) == ()
    assert parse_shares("0.6,0.2,0.2", None) == pytest.approx((0.6, 0.2, 0.2))
    near = parse_shares("0.3333333,0.3333333,0.3333333", 3)  # within 1e-6 of 1: normalised
    assert near == pytest.approx((1 / 3,) * 3, abs=1e-15) and abs(sum(near) - 1.0) < 1e-15


@pytest.mark.parametrize(
    ("value", "world_size", "why"),
    [
        ("0.5,abc", 2, "not a number"),
        ("0.5,,0.5", 3, "not a number"),
        ("0.5,0.5,", 3, "not a number"),
        ("1.2,-0.2", 2, "positive"),
        ("1,0", 2, "positive"),
        ("nan,0.5", 2, "positive"),
        ("inf", 1, "positive"),
        ("0.5,0.5", 3, "2 shares for a world of 3"),
        ("0.5,0.4", 2, "sum to"),
        ("0.6,0.6", None, "sum to"),
    ],
)
def test_parse_bad_values_name_the_variable_and_value(value: str, world_size: int | None, why: str) -> None:
    with pytest.raises(ValueError, match="HOPS_RANK_SHARES") as err:
        parse_shares(value, world_size)
    assert repr(value.strip()) in str(err.value) and why in str(err.value)


def test_shares_from_env_and_the_round_trip() -> None:
    assert shares_from_env({}, 3) == (1 / 3,) * 3
    assert shares_from_env({"HOPS_RANK_SHARES": "0.75,0.25"}, 2) == SHARES
    with pytest.raises(ValueError, match="HOPS_RANK_SHARES"):
        shares_from_env({"HOPS_RANK_SHARES": "0.75,0.25"}, 4)
    shares = balanced_shares([15.0, 15.0, 9.0, 9.0])  # 2 x V100 and 2 x P100, samples/s
    assert shares == pytest.approx((15 / 48, 15 / 48, 9 / 48, 9 / 48))
    assert parse_shares(format_shares(shares), 4) == pytest.approx(shares, abs=1e-15)
    for rates in ([], [1.0, 0.0], [1.0, float("nan")]):
        with pytest.raises(ValueError):
            balanced_shares(rates)


# --- rounding ----------------------------------------------------------------------------------------
def test_local_batch_sizes_are_proportional_and_sum_exactly() -> None:
    assert local_batch_sizes(12, SHARES) == (9, 3)
    assert local_batch_sizes(10, (0.25,) * 4) == (3, 3, 2, 2)  # ties go to the lower ranks
    assert local_batch_sizes(256, balanced_shares([15.0, 15.0, 9.0, 9.0])) == (80, 80, 48, 48)
    assert local_batch_sizes(100, (0.1, 0.9)) == (10, 90)  # exact despite 0.1's binary value
    assert local_batch_sizes(7, (0.5, 0.3, 0.2)) == (4, 2, 1)  # quotas 3.5, 2.1, 1.4: the .5 rounds up
    assert local_batch_sizes(0, (0.5, 0.5)) == (0, 0)
    for batch in range(0, 200):
        for shares in [(0.5, 0.5), (0.7, 0.2, 0.1), (0.01, 0.99), (0.001, 0.001, 0.998), (0.4, 0.35, 0.25)]:
            sizes = local_batch_sizes(batch, shares)
            assert sum(sizes) == batch
            assert sizes == local_batch_sizes(batch, list(shares))  # deterministic
            if batch >= len(shares):
                assert min(sizes) >= 1, (batch, shares, sizes)
            if batch >= len(shares) and all(batch * s >= 1 for s in shares):
                assert all(abs(n - batch * s) < 1 for n, s in zip(sizes, shares, strict=True))


def test_a_tiny_share_still_gets_a_sample() -> None:
    assert local_batch_sizes(4, (0.001, 0.999)) == (1, 3)
    assert local_batch_sizes(3, (0.001, 0.001, 0.998)) == (1, 1, 1)
    assert local_batch_sizes(1, (0.001, 0.999)) == (0, 1)  # fewer samples than ranks: some get none


def test_local_slices_tile_the_global_batch() -> None:
    shares = (0.4, 0.35, 0.25)
    slices = [local_slice(20, shares, r) for r in range(3)]
    assert slices == [slice(0, 8), slice(8, 15), slice(15, 20)]
    with pytest.raises(ValueError, match="rank"):
        local_slice(20, shares, 3)


@pytest.mark.parametrize(
    ("batch", "shares"), [(-1, (1.0,)), (5, ()), (5, (0.5, 0.0)), (5, (0.5, -0.5)), (2.5, (1.0,))]
)
def test_local_batch_sizes_refuse_bad_arguments(batch: Any, shares: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        local_batch_sizes(batch, shares)


# --- loss scale --------------------------------------------------------------------------------------
def test_loss_scale() -> None:
    assert loss_scale(9, 12, 2) == 1.5 and loss_scale(3, 12, 2) == 0.5
    assert loss_scale(4, 16, 4) == 1.0  # equal shares: no scaling
    sizes = local_batch_sizes(10, (0.25,) * 4)
    assert sum(loss_scale(b, 10, 4) for b in sizes) == pytest.approx(4.0)  # the scales average to 1
    for bad in [(13, 12, 2), (-1, 12, 2), (1, 0, 2), (1, 12, 0)]:
        with pytest.raises(ValueError):
            loss_scale(*bad)


# --- the runtime's conveniences ----------------------------------------------------------------------
def test_runtime_reads_shares_rank_and_world_size_from_the_environment() -> None:
    env = {"HOPS_RANK_SHARES": "0.75,0.25", "RANK": "1", "WORLD_SIZE": "2"}
    rt = Runtime.from_env(env, install_signals=False)
    assert (rt.settings.rank, rt.settings.world_size, rt.settings.rank_shares) == (1, 2, SHARES)
    assert rt.share == 0.25 and rt.shares() == SHARES
    assert rt.local_batch_size(GLOBAL_BATCH) == 3 and rt.local_batch_slice(GLOBAL_BATCH) == slice(9, 12)
    assert rt.loss_scale(GLOBAL_BATCH) == 0.5
    assert rt.local_batch_size(GLOBAL_BATCH, rank=0) == 9 and rt.loss_scale(GLOBAL_BATCH, rank=0) == 1.5
    with pytest.raises(ValueError, match="HOPS_RANK_SHARES"):
        rt.local_batch_size(GLOBAL_BATCH, rank=0, world_size=4)


def test_runtime_without_shares_splits_equally() -> None:
    standalone = Runtime(Settings(), install_signals=False)
    assert (standalone.share, standalone.local_batch_size(32), standalone.loss_scale(32)) == (1.0, 32, 1.0)
    rt = Runtime.from_env({"RANK": "2", "WORLD_SIZE": "4"}, install_signals=False)
    assert rt.share == 0.25 and rt.local_batch_size(10) == 2 and rt.loss_scale(10) == pytest.approx(0.8)
    # no WORLD_SIZE (a launcher of the script's own): the count is checked where the shares are used
    rt = Runtime.from_env({"HOPS_RANK_SHARES": "0.5,0.3,0.2"}, install_signals=False)
    assert rt.local_batch_size(10, rank=1, world_size=3) == 3
    with pytest.raises(ValueError, match="HOPS_RANK_SHARES"):
        _ = rt.share


@pytest.mark.parametrize(
    ("env", "var"),
    [
        ({"HOPS_RANK_SHARES": "0.75,0.25", "WORLD_SIZE": "4"}, "HOPS_RANK_SHARES"),
        ({"HOPS_RANK_SHARES": "fast,slow"}, "HOPS_RANK_SHARES"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "x"}, "RANK"),
    ],
)
def test_settings_refuse_bad_balance_variables(env: dict[str, str], var: str) -> None:
    with pytest.raises(ValueError, match=var):
        Settings.from_env(env)


# --- DDP over two CPU processes ------------------------------------------------------------------------
def make_model() -> Any:
    import torch

    with torch.random.fork_rng(devices=[]):  # leaves the caller's generator alone
        torch.manual_seed(1234)
        return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()


def global_batch(step: int) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(GLOBAL_BATCH, 1, generator=gen, dtype=torch.float64)
    return x, y


def train(model: Any, rt: Runtime | None, scaled: bool) -> list[float]:
    """STEPS of SGD on the global batches; with `rt`, on this rank's slice of each (model wrapped in DDP)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = global_batch(step)
        if rt is not None:
            mine = rt.local_batch_slice(GLOBAL_BATCH)
            x, y = x[mine], y[mine]
        loss = torch.nn.functional.mse_loss(model(x), y)
        if rt is not None and scaled:
            loss = loss * rt.loss_scale(GLOBAL_BATCH)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [float(v) for p in model.parameters() for v in p.detach().reshape(-1)]


def rank_main(rank: int, port: int, results: Any) -> None:
    """One rank: RANK comes from the environment as under torchrun (WORLD_SIZE, HOPS_RANK_SHARES too)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rt = Runtime.from_env({**os.environ, "RANK": str(rank)}, install_signals=False)
    s = rt.settings
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=s.rank, world_size=s.world_size
    )
    try:
        out = {
            "local_batch": rt.local_batch_size(GLOBAL_BATCH),
            "scaled": train(DistributedDataParallel(make_model()), rt, scaled=True),
            "unscaled": train(DistributedDataParallel(make_model()), rt, scaled=False),
        }
    finally:
        dist.destroy_process_group()
    results.put((rank, out))


def launch_ranks(port: int) -> None:
    """Import torch and DDP once (DDP's first use imports torch._dynamo: seconds), then fork the ranks.

    Prints the ranks' results as one JSON list, in rank order; exits 1 when a rank fails."""
    import multiprocessing

    import torch._dynamo  # what the constructor of DDP imports: once, before the fork
    import torch.nn.parallel  # noqa: F401

    world_size = int(os.environ["WORLD_SIZE"])
    ctx = multiprocessing.get_context("fork")
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=rank_main, args=(r, port, results), daemon=True) for r in range(world_size)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(TIMEOUT)
    codes = [proc.exitcode for proc in procs]
    if codes != [0] * world_size:
        sys.exit(f"rank exit codes {codes}")
    got = dict(results.get() for _ in procs)
    results.close()
    print(json.dumps([got[r] for r in range(world_size)]))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(shares: tuple[float, ...], meanwhile: Callable[[], T]) -> tuple[list[dict[str, Any]], T]:
    """The ranks' results (a launcher process forks one process per rank), and `meanwhile()` computed
    here while they run. The launcher has its own session: on a failure here, all of it is killed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOPS_")}
    env.update(
        {"WORLD_SIZE": str(len(shares)), "HOPS_RANK_SHARES": format_shares(shares), "OMP_NUM_THREADS": "1"}
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, __file__, "launch", str(free_port())]
    with subprocess.Popen(
        argv,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            extra = meanwhile()
            out, err = proc.communicate(timeout=TIMEOUT)
        except BaseException:
            # the launcher is not reaped yet, so its process group is still this one: kill the ranks too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode == 0, f"launcher exited {proc.returncode}:\n{err}"
    return json.loads(out.strip().splitlines()[-1]), extra


@pytest.mark.slow  # importing torch and DDP in the launcher takes most of its ~10 s
def test_unequal_ddp_ranks_with_the_loss_scale_train_like_one_process_on_the_global_batch() -> None:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    ranks, whole = run_ranks(SHARES, lambda: train(make_model(), None, scaled=False))
    reference = torch.tensor(whole, dtype=torch.float64)
    assert [r["local_batch"] for r in ranks] == [9, 3]
    for r in ranks:
        scaled = torch.tensor(r["scaled"], dtype=torch.float64)
        unscaled = torch.tensor(r["unscaled"], dtype=torch.float64)
        assert torch.allclose(scaled, reference, rtol=1e-10, atol=1e-12), (scaled - reference).abs().max()
        # without the scale DDP weights a sample of the small batch 3 times as much: the test can fail
        assert not torch.allclose(unscaled, reference, rtol=1e-6, atol=1e-8)
    assert ranks[0]["scaled"] == ranks[1]["scaled"]  # DDP keeps the replicas identical


if __name__ == "__main__" and sys.argv[1:2] == ["launch"]:
    launch_ranks(int(sys.argv[2]))


def test_the_share_index_follows_the_placement_not_torchruns_rank() -> None:
    # torchrun's c10d rendezvous may number RANK in another node order; the master's HOPS_FIRST_RANK
    # plus LOCAL_RANK is the index into HOPS_RANK_SHARES.
    from hopsmgr import nodecontract as nc
    from hopsmgr.runtime.core import Runtime

    env = {
        nc.RANK_SHARES: "0.3,0.3,0.2,0.2",
        nc.FIRST_RANK: "2",
        "LOCAL_RANK": "1",
        "RANK": "1",
        "WORLD_SIZE": "4",
        nc.GPUS: "2",
        nc.WORLD_GPUS: "4",
    }
    rt = Runtime.from_env(env, install_signals=False)
    assert rt.share == pytest.approx(0.2)
    assert rt.local_batch_slice(10) == slice(8, 10)
    assert rt.node_share == pytest.approx(0.4)
    assert rt.loss_scale(10) == pytest.approx(4 * 2 / 10)
