"""How the master builds node commands: torchrun for multi-server jobs, wrapper arguments."""

from __future__ import annotations

from hopsmgr.master.executor import LaunchOrder, NodeTarget, launch_args
from hopsmgr.master.rounds import rendezvous_port, torchrun_argv


def test_torchrun_per_server_with_rank_and_rendezvous() -> None:
    argv = torchrun_argv(
        ["/usr/bin/python3", "train.py", "--lr", "0.1"], 2, 1, 4, "10.0.0.1:29500", "a-000007"
    )
    assert argv == [
        "torchrun",
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=10.0.0.1:29500",
        "--rdzv_id=a-000007",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert torchrun_argv(["./train.sh"], 1, 0, 1, "h:1", "a")[-1] == "./train.sh"


def test_rendezvous_port_is_stable_and_in_range() -> None:
    ports = {rendezvous_port(f"a-{i:06d}") for i in range(200)}
    assert all(29400 <= p < 31400 for p in ports) and len(ports) > 100
    assert rendezvous_port("a-000001") == rendezvous_port("a-000001")


def test_launch_args_keep_argv_after_the_separator_verbatim() -> None:
    order = LaunchOrder(
        attempt="a-1",
        job="j-1",
        epoch=3,
        argv=["python", "-c", "print(1); $(touch x)", "--", "`id`"],
        env={"B": "2", "A": "x y"},
        visible_devices=[0, 2],
        emulated_speed=0.5,
    )
    args = launch_args(NodeTarget("n1", "/w"), order)
    sep = args.index("--")
    assert args[sep + 1 :] == ["python", "-c", "print(1); $(touch x)", "--", "`id`"]
    assert args[:sep].count("--env") == 2 and "A=x y" in args and "0,2" in args and "--epoch" in args


def test_profiling_budget_keeps_whole_jobs_in_order() -> None:
    from hopsmgr.control.planning import within_budget as _within_budget
    from hopsmgr.core.planner import ProfilingRun

    runs = [
        ProfilingRun(j, f"s{k}", t)
        for k, (j, t) in enumerate([("a", "x"), ("a", "y"), ("b", "x"), ("b", "y"), ("c", "x")])
    ]
    assert [r.job_id for r in _within_budget(runs, 3)] == ["a", "a"]
    assert [r.job_id for r in _within_budget(runs, 4)] == ["a", "a", "b", "b"]
    assert _within_budget(runs, 1) == []
    assert [r.job_id for r in _within_budget(runs, 0, at_least_one=True)] == ["a", "a"]
