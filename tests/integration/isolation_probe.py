"""A job that tries what a job must not be able to do to other users, prints what happened, then trains.

Run by tests/integration/test_run_as.py as one user's job: `PROBE_TARGETS` (JSON) names files to
read, directories to list, files to create, existing files to open for writing ("append"; "append own":
names in its own attempt directory, the wrapper's bookkeeping) and pids to kill; it prints `whoami
<id -un>`, `identity <json>` (uid, gid, supplementary groups, HOME) and `PROBES <json>` (each target
-> "done" or the error's name), and with `PROBE_ORPHAN=1` leaves a
process behind in a session of its own. Then it runs examples/emulated_train.py with its arguments.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "emulated_train.py"


def attempt(action: object) -> str:
    try:
        action() if callable(action) else None
    except OSError as exc:
        return type(exc).__name__
    return "done"


def main() -> None:
    print("whoami", subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip(), flush=True)
    identity = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
    print("identity", json.dumps({**identity, "home": os.environ.get("HOME")}), flush=True)
    targets = json.loads(os.environ.get("PROBE_TARGETS") or "{}")
    results: dict[str, str] = {}
    for path in targets.get("read", []):
        results[f"read {path}"] = attempt(lambda p=path: Path(p).read_bytes())
    for path in targets.get("list", []):
        results[f"list {path}"] = attempt(lambda p=path: os.listdir(p))
    for path in targets.get("write", []):
        results[f"write {path}"] = attempt(lambda p=path: Path(p).open("xb").close())
    for path in targets.get("append", []):
        results[f"append {path}"] = attempt(lambda p=path: Path(p).open("ab").close())
    attempt_dir = Path(os.environ["HOPS_ATTEMPT_DIR"]).parent
    for name in targets.get("append own", []):
        results[f"append own {name}"] = attempt(lambda p=attempt_dir / name: p.open("ab").close())
    for pid in targets.get("kill", []):
        results[f"kill {pid}"] = attempt(lambda p=pid: os.kill(p, signal.SIGKILL))
    own = Path(os.environ["HOPS_ATTEMPT_DIR"])
    results["own files"] = "mine" if own.stat().st_uid == os.getuid() else "not mine"
    print("PROBES", json.dumps(results, sort_keys=True), flush=True)
    if os.environ.get("PROBE_ORPHAN") == "1":
        subprocess.Popen(
            ["sleep", "1000"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    sys.argv = [str(EXAMPLE), *sys.argv[1:]]
    runpy.run_path(str(EXAMPLE), run_name="__main__")


if __name__ == "__main__":
    main()
