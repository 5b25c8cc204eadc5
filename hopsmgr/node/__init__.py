"""On-node side of hopsmgr: the job wrapper (`python -m hopsmgr.node.wrapper`) and its operations."""

from hopsmgr.node.layout import BadRequest, Conflict, StaleEpoch, UnknownAttempt, WrapperError
from hopsmgr.node.ops import attempt_status, checkpoint, forget, launch, logs, status, stop

__all__ = [
    "BadRequest",
    "Conflict",
    "StaleEpoch",
    "UnknownAttempt",
    "WrapperError",
    "attempt_status",
    "checkpoint",
    "forget",
    "launch",
    "logs",
    "status",
    "stop",
]
