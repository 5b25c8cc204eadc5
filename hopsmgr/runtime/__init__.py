"""Job-side library a training script imports: `rt = runtime.init()`, then phases, steps, checkpoints.

See `hopsmgr.runtime.core` for the protocol with the node wrapper (files, exit codes) and
`hopsmgr.runtime.settings` for the environment it reads.
"""

from hopsmgr.runtime.checkpoint import CheckpointError
from hopsmgr.runtime.core import (
    EXIT_CHECKPOINTED,
    PHASES,
    Runtime,
    cuda_sync,
    init,
)
from hopsmgr.runtime.settings import MODES, Settings

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
