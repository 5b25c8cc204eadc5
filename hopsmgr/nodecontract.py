"""The contract between the master, the node wrapper and the job runtime (standard library only).

What a training process and the tools around it agree on: the exit code that means "checkpointed,
resume me", the files a runtime writes in its attempt directory, and every `HOPS_*` environment
variable. The wrapper (hopsmgr.node) and the master set the variables, the runtime (hopsmgr.runtime)
reads them, and the master refuses them in user-given environments.
"""

from __future__ import annotations

from typing import Final

EXIT_CHECKPOINTED: Final = 75  # EX_TEMPFAIL: the job saved a checkpoint and stopped when asked

# files in <workdir>/attempts/<attempt>/ written by the runtime or the wrapper
PROGRESS_FILE: Final = "progress.json"  # runtime: iteration, samples, rates (while it runs)
PROFILE_FILE: Final = "profile.json"  # runtime, profile mode: phase means after the warm-up
REQUEST_FILE: Final = "checkpoint.request"  # wrapper: "checkpoint now" (besides SIGUSR1)
EXIT_FILE: Final = "exit.json"  # monitor: how the job's process ended
LOG_FILE: Final = "log"  # monitor: the job's stdout and stderr

ENV_PREFIX: Final = "HOPS_"  # every variable below; user environments may not set any of them
# set by the node wrapper for each attempt
JOB_ID: Final = "HOPS_JOB_ID"
ATTEMPT_ID: Final = "HOPS_ATTEMPT_ID"
ATTEMPT_DIR: Final = "HOPS_ATTEMPT_DIR"
CHECKPOINT_DIR: Final = "HOPS_CHECKPOINT_DIR"
MODE: Final = "HOPS_MODE"  # "run" | "profile"
GPUS: Final = "HOPS_GPUS"  # GPUs of this attempt on this node
PROFILE_ITERS: Final = "HOPS_PROFILE_ITERS"
EMULATED_SPEED: Final = "HOPS_EMULATED_SPEED"  # emulated nodes: the speed factor a step sleeps by
# set by the master for each part of a placement
NODE_RANK: Final = "HOPS_NODE_RANK"
NNODES: Final = "HOPS_NNODES"
WORLD_GPUS: Final = "HOPS_WORLD_GPUS"
BASE_GPUS: Final = "HOPS_BASE_GPUS"  # the job's smallest GPU count (R1): work is counted in its iterations
LR_SCALE: Final = "HOPS_LR_SCALE"  # GPUs given over R1: linear learning-rate scaling
RESUME: Final = "HOPS_RESUME"  # "1" when the attempt resumes from a checkpoint
RDZV_ENDPOINT: Final = "HOPS_RDZV_ENDPOINT"
RANK_SHARES: Final = "HOPS_RANK_SHARES"  # comma-separated share of the global batch per rank, in rank order (speed-balanced placements)
FIRST_RANK: Final = (
    "HOPS_FIRST_RANK"  # global rank of this node's first GPU (ranks: nodes in order, then GPUs)
)
# set by the master at submit, kept in the job's environment
ARRAY_INDEX: Final = "HOPS_ARRAY_INDEX"  # the job's index in its array (`hopsmgr submit --array`)

# besides HOPS_*, the wrapper sets the devices an attempt sees, counted as NVML counts them (PCI bus
# order: CUDA's default order puts the fastest GPU first, so on a mixed server index 1 could be another GPU)
VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER: Final = "CUDA_DEVICE_ORDER"
DEVICE_ORDER_VALUE: Final = "PCI_BUS_ID"
RESERVED_ENV: Final = (
    f"^(?:{ENV_PREFIX}|{VISIBLE_DEVICES}$|{DEVICE_ORDER}$)"  # a regex over user variable names
)


def is_reserved(name: str) -> bool:
    """True for an environment variable hopsmgr sets itself (a user may not give it)."""
    return name.startswith(ENV_PREFIX) or name in (VISIBLE_DEVICES, DEVICE_ORDER)
