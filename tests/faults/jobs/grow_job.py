"""A job for the disk-full test: each checkpoint holds `--state-bytes` bytes of state.

python tests/faults/jobs/grow_job.py --iters 1000 --step-seconds 0.01 --state-bytes 1000
"""

from __future__ import annotations

import argparse
import functools
import time

from hopsmgr import runtime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--step-seconds", type=float, default=0.01)
    p.add_argument("--state-bytes", type=int, default=1000)
    args = p.parse_args(argv)
    rt = runtime.init()
    start, state = rt.resume()
    if start:
        print(f"resumed at iteration {start} ({len(state['pad'])} bytes of state)", flush=True)
    pad = b"x" * args.state_bytes
    while not rt.done(args.iters):
        time.sleep(args.step_seconds)
        rt.step(samples=1, state=functools.partial(dict, pad=pad))
    rt.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
