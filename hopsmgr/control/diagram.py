"""What each event may make the scheduler state machine do: the table docs/architecture.md draws.

`EMITS` maps every event type to the command types its handling may return; the test harness of the
machine (tests/control/harness.py) and the simulator's tests check every handled event against it, and
`mermaid_diagram()` draws it for the documentation (tests/unit/test_docs.py compares the two).
"""

from __future__ import annotations

from hopsmgr.control import commands as c
from hopsmgr.control import events as e

_ENDS = (c.Persist, c.LaunchAttempt, c.StartProfiling, c.StopAttempt, c.PlanSoon)  # an attempt's end

EMITS: dict[type[e.Event], tuple[type[c.Command], ...]] = {
    e.JobSubmitted: (c.Persist, c.Reply, c.PlanSoon),
    e.JobCancelled: (*_ENDS, c.Reply),
    e.AttemptStarted: (c.Persist,),
    e.AttemptLaunchFailed: _ENDS,
    e.AttemptProgressed: (c.Persist,),
    e.AttemptEnded: _ENDS,
    e.NodeBeat: (c.PlanSoon, c.Reply),
    e.NodeReported: (*_ENDS, c.CheckpointAndStop, c.NodeReply),
    e.NodeChanged: (),
    e.NodeCommandFailed: (),
    e.NodeDrained: (c.Reply, c.PlanSoon),
    e.HealthTick: _ENDS,
    e.RoundTick: (c.Persist, c.PlanRequest, c.ContinuePlan),  # Persist: the tenants' fair-share use
    e.PlanReady: (*_ENDS, c.CheckpointAndStop, c.PlanRequest, c.ContinuePlan),
    e.PlanContinue: (*_ENDS, c.CheckpointAndStop, c.PlanRequest, c.ContinuePlan),
    e.StateRestored: (c.Persist,),
}


def mermaid_diagram() -> str:
    """Events (left) and the commands each may cause (right), as a Mermaid flowchart."""
    lines = ["flowchart LR"]
    for event, out in EMITS.items():
        if not out:
            lines.append(f"    {event.__name__}([{event.__name__}])")
        for command in out:
            lines.append(
                f"    {event.__name__}([{event.__name__}]) --> {command.__name__}[{command.__name__}]"
            )
    return "\n".join(lines) + "\n"
