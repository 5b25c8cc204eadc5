"""What the node wrapper tells a training process: `Settings`, read from the `HOPS_*` environment.

The wrapper sets `HOPS_*` variables (hopsmgr.nodecontract names them) and torchrun its `RANK`,
`WORLD_SIZE` and `LOCAL_RANK`; `Settings.from_env` reads them all, with defaults for a script run
standalone, and a malformed value raises ValueError naming the variable. hopsmgr.runtime.core's
`Runtime` acts on them. Standard library only, like the rest of hopsmgr.runtime.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hopsmgr import nodecontract as nc
from hopsmgr.runtime import balance

MODES = ("run", "profile")
DEFAULT_PROFILE_ITERS = 20
TORCH_RANK = "RANK"  # set by torchrun (and torch.distributed's env:// launchers)
TORCH_WORLD_SIZE = "WORLD_SIZE"
TORCH_LOCAL_RANK = "LOCAL_RANK"


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={raw!r} must be a positive number")
    return value


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "")
    return Path(raw) if raw else None


@dataclass(frozen=True)
class Settings:
    """What the wrapper told this process (all optional).

    `rank` and `world_size` are torchrun's `RANK` and `WORLD_SIZE` (0 and 1 without it); `rank_shares`
    is `HOPS_RANK_SHARES` (empty: equal shares), checked against `world_size` when `WORLD_SIZE` is set.
    """

    job_id: str | None = None
    attempt_id: str | None = None
    attempt_dir: Path | None = None
    checkpoint_dir: Path | None = None
    mode: str = "run"
    profile_iters: int = DEFAULT_PROFILE_ITERS
    gpus: int = 1
    lr_scale: float = 1.0
    emulated_speed: float = 1.0
    rank: int = 0
    world_size: int = 1
    rank_shares: tuple[float, ...] = ()
    first_rank: int = 0  # HOPS_FIRST_RANK: this node's first GPU's global rank
    # The index of this process in HOPS_RANK_SHARES: HOPS_FIRST_RANK + LOCAL_RANK when the master set
    # HOPS_FIRST_RANK (torchrun's c10d rendezvous orders nodes its own way, so RANK may not follow
    # the placement's order; any consistent index keeps the slices tiling the batch), else RANK.
    share_rank: int = 0
    world_gpus: int = 1  # HOPS_WORLD_GPUS: GPUs of the whole placement
    base_gpus: int = 1  # HOPS_BASE_GPUS: the job's smallest GPU count (R1), the unit of its work

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read `HOPS_*` variables; a malformed value raises ValueError naming the variable."""
        env = os.environ if env is None else env
        mode = env.get(nc.MODE, "").strip() or "run"
        if mode not in MODES:
            raise ValueError(f"{nc.MODE}={mode!r} must be one of {', '.join(MODES)}")
        world_size = _env_int(env, TORCH_WORLD_SIZE, 1, 1)
        rank = _env_int(env, TORCH_RANK, 0, 0)
        if rank >= world_size:
            raise ValueError(f"{TORCH_RANK}={rank} must be below {TORCH_WORLD_SIZE}={world_size}")
        sized = world_size if env.get(TORCH_WORLD_SIZE, "").strip() else None
        return cls(
            job_id=env.get(nc.JOB_ID) or None,
            attempt_id=env.get(nc.ATTEMPT_ID) or None,
            attempt_dir=_env_path(env, nc.ATTEMPT_DIR),
            checkpoint_dir=_env_path(env, nc.CHECKPOINT_DIR),
            mode=mode,
            profile_iters=_env_int(env, nc.PROFILE_ITERS, DEFAULT_PROFILE_ITERS, 1),
            gpus=_env_int(env, nc.GPUS, 1, 1),
            lr_scale=_env_float(env, nc.LR_SCALE, 1.0),
            emulated_speed=_env_float(env, nc.EMULATED_SPEED, 1.0),
            rank=rank,
            world_size=world_size,
            rank_shares=balance.parse_shares(env.get(nc.RANK_SHARES, ""), sized),
            first_rank=_env_int(env, nc.FIRST_RANK, 0, 0),
            share_rank=(
                _env_int(env, nc.FIRST_RANK, 0, 0) + _env_int(env, TORCH_LOCAL_RANK, 0, 0)
                if env.get(nc.FIRST_RANK, "").strip()
                else rank
            ),
            world_gpus=_env_int(env, nc.WORLD_GPUS, _env_int(env, nc.GPUS, 1, 1), 1),
            base_gpus=_env_int(
                env, nc.BASE_GPUS, _env_int(env, nc.WORLD_GPUS, _env_int(env, nc.GPUS, 1, 1), 1), 1
            ),
        )
