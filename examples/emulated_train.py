"""An emulated training job for hopsmgr: sleeps instead of computing, keeps a deterministic checksum.

Each iteration sleeps `--step-seconds / rt.emulated_speed`, split over the data, forward, backward and
update phases (every `--miss-every`-th data phase takes `--miss-seconds` more, like a cache miss). The
checksum is checkpointed through `rt.step`, so an interrupted and resumed run prints the same
"final checksum <n>" as an uninterrupted one.

    python examples/emulated_train.py --iters 200 --batch-size 32 --step-seconds 0.05
"""

from __future__ import annotations

import argparse
import functools
import time

from hopsmgr import runtime

MODULUS = 2**61 - 1


def advance(checksum: int, iteration: int, seed: int) -> int:
    """The checksum after `iteration` (0-based): a seeded linear congruential mix."""
    return (checksum * 6364136223846793005 + (iteration + 1) * 1442695040888963407 + seed) % MODULUS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--iters",
        type=int,
        required=True,
        help="total iterations of the job, counted at its smallest GPU count",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--step-seconds", type=float, default=0.05, help="work per iteration at speed 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--miss-every", type=int, default=0, help="every Nth data phase is a cache miss")
    p.add_argument("--miss-seconds", type=float, default=0.0, help="extra data time of a miss")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rt = runtime.init()
    start, state = rt.resume()
    checksum = int(state["checksum"]) if state else args.seed
    if start:
        print(f"resumed at iteration {start}", flush=True)
    # A speed-balanced placement (HOPS_RANK_SHARES) gives this node's GPUs more or less than an equal
    # share of the global batch: the emulated work per step scales with it.
    per_gpu = rt.node_share * rt.settings.world_gpus / rt.gpus
    if rt.settings.rank_shares:
        print(f"batch share {rt.node_share:.4f} of the global batch (x{per_gpu:.3f} per GPU)", flush=True)
    quarter = args.step_seconds * per_gpu / rt.emulated_speed / 4
    while not rt.done(args.iters):  # rt.work counts iterations at the smallest GPU count
        it = rt.iteration
        with rt.phase("data"):
            miss = args.miss_every > 0 and it % args.miss_every == 0
            time.sleep(quarter + (args.miss_seconds / rt.emulated_speed if miss else 0.0))
        with rt.phase("forward"):
            time.sleep(quarter)
        with rt.phase("backward"):
            time.sleep(quarter)
        with rt.phase("update"):
            time.sleep(quarter)
            checksum = advance(checksum, it, args.seed)
        rt.step(samples=args.batch_size, state=functools.partial(dict, checksum=checksum))
    rt.finish()
    print(f"final checksum {checksum}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
