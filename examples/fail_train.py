"""A job that fails: prints an error line to stderr and exits 1.

With `--only-run` it fails only in run mode; in profile mode it steps through the runtime until the
profile is written (exit 0). `--after N` fails after N iterations instead of at once.
"""

from __future__ import annotations

import argparse
import sys
import time

from hopsmgr import runtime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only-run", action="store_true", help="succeed when profiling")
    p.add_argument("--after", type=int, default=0, help="iterations before failing")
    p.add_argument("--step-seconds", type=float, default=0.01)
    args = p.parse_args(argv)
    rt = runtime.init()
    profiling = args.only_run and rt.mode == "profile"
    while profiling or rt.iteration < args.after:
        with rt.phase("forward"):
            time.sleep(args.step_seconds / rt.emulated_speed)
        rt.step(samples=1)  # in profile mode this exits 0 once the profile is written
    print(f"fail_train: simulated failure at iteration {rt.iteration}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
