"""TEST-ONLY crash points for the master's fault-injection tests (tests/faults/). Never set in production.

`point(name)` ends the process at once with `os._exit(137)` (what a SIGKILL looks like to whoever waits
for it: no cleanup, no flush, no `finally`) when the environment variable `HOPSMGR_FAULT` equals `name`.
The variable is read once, at import; when it is unset (always, outside those tests) `point` is one
comparison with an empty string and does nothing.

Points the master calls (see tests/faults/test_master_crash.py):

    launch.before_store     rounds: a plan's actions are decided, nothing is stored yet
    launch.after_store      rounds: the actions (new attempts, job states) are committed, no command sent
    stop.after_store        rounds: as launch.after_store, for a commit that includes checkpoint-stops
    <command>.in_command    local executor: the node wrapper runs `<command>` (launch, checkpoint,
                            stop...), its reply is not read yet (the SSH executor has no such point)
    launch.after_command    rounds: a launch command succeeded, the master has not recorded it started
    stop.after_command      controller: a checkpoint command returned, the attempt is not ended yet
"""

from __future__ import annotations

import os

ENV = "HOPSMGR_FAULT"
EXIT_CODE = 137  # 128 + SIGKILL
FAULT: str = os.environ.get(ENV, "")


def point(name: str) -> None:
    """Exit the process immediately (137) when `HOPSMGR_FAULT` names this point; else do nothing."""
    if FAULT and name == FAULT:
        os._exit(EXIT_CODE)
