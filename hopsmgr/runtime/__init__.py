"""Job-side library a training script imports: `rt = runtime.init()`, then phases, steps, checkpoints.

See `hopsmgr.runtime.core` for the protocol with the node wrapper (environment, files, exit codes).
"""

from hopsmgr.runtime.checkpoint import CheckpointError
from hopsmgr.runtime.core import (
    EXIT_CHECKPOINTED,
    MODES,
    PHASES,
    Runtime,
    Settings,
    cuda_sync,
    init,
)

__all__ = [
    "EXIT_CHECKPOINTED",
    "MODES",
    "PHASES",
    "CheckpointError",
    "Runtime",
    "Settings",
    "cuda_sync",
    "init",
]
