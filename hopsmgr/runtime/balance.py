"""Speed-balanced batches: split a job's global batch over ranks of unequal speed (standard library only).

On a placement that mixes GPU models (2 x V100 and 2 x P100, say) the scheduler gives each rank a share
of the global batch in proportion to its GPU's measured speed, in `HOPS_RANK_SHARES`. A rank trains on
`local_batch_sizes(B, shares)[rank]` samples and multiplies its (mean) loss by `loss_scale(b, B, N)`
before `backward()`: DDP's all-reduce averages the N gradients, so the update is then the gradient of
the mean loss over the whole global batch, as one process on B samples would compute it, and the
learning rate and global batch stay what the user set. Equal shares give every rank a scale of 1.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction

from hopsmgr.nodecontract import RANK_SHARES

SUM_TOLERANCE = 1e-6  # how far from 1 the shares in HOPS_RANK_SHARES may sum


def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")


def equal_shares(world_size: int) -> tuple[float, ...]:
    """Every rank the same share: 1/N each."""
    _check_world_size(world_size)
    return (1.0 / world_size,) * world_size


def parse_shares(text: str, world_size: int | None) -> tuple[float, ...]:
    """The shares in a `HOPS_RANK_SHARES` value ("0.3,0.3,0.2,0.2"), one per rank in rank order.

    Empty text means equal shares (`()` when `world_size` is None). Every share must be a finite number
    above 0, there must be `world_size` of them (not checked when `world_size` is None), and they must
    sum to 1 within 1e-6; they are returned divided by their sum, so they sum to 1 up to rounding.
    Anything else raises ValueError naming the variable and its value.
    """
    text = text.strip()
    if not text:
        return () if world_size is None else equal_shares(world_size)
    where = f"{RANK_SHARES}={text!r}"
    values: list[float] = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{where}: {item.strip()!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where}: every share must be a positive number, got {item.strip()!r}")
        values.append(value)
    if world_size is not None:
        _check_world_size(world_size)
        if len(values) != world_size:
            raise ValueError(f"{where}: {len(values)} shares for a world of {world_size} ranks")
    total = math.fsum(values)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{where}: the shares sum to {total!r}, not 1")
    return tuple(v / total for v in values)


def shares_from_env(env: Mapping[str, str] | None, world_size: int) -> tuple[float, ...]:
    """`parse_shares` of `HOPS_RANK_SHARES` in `env` (default `os.environ`): equal shares when unset."""
    env = os.environ if env is None else env
    return parse_shares(env.get(RANK_SHARES, ""), world_size)


def format_shares(shares: Sequence[float]) -> str:
    """The `HOPS_RANK_SHARES` value for `shares` (exact: `parse_shares` reads back the same floats)."""
    return ",".join(repr(float(s)) for s in shares)


def balanced_shares(rates: Sequence[float]) -> tuple[float, ...]:
    """Shares in proportion to the ranks' speeds (samples/s, or any positive measure of it)."""
    if not rates:
        raise ValueError("no rates given")
    if any(not math.isfinite(r) or r <= 0 for r in rates):
        raise ValueError(f"every rate must be a positive number, got {list(rates)!r}")
    total = math.fsum(rates)
    return tuple(r / total for r in rates)


def local_batch_sizes(global_batch: int, shares: Sequence[float]) -> tuple[int, ...]:
    """Each rank's number of samples: proportional to its share, summing exactly to `global_batch`.

    Largest-remainder rounding, computed exactly (the shares' binary values, normalised by their sum);
    equal remainders go to the lower rank. When `global_batch >= len(shares)` no rank gets 0: a rank
    whose quota rounded to 0 takes one sample from the rank furthest above its quota (lowest rank on a
    tie). The result depends only on the arguments.
    """
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 0:
        raise ValueError(f"global_batch must be an integer >= 0, got {global_batch!r}")
    if not shares:
        raise ValueError("no shares given")
    if any(not math.isfinite(s) or s <= 0 for s in shares):
        raise ValueError(f"every share must be a positive number, got {list(shares)!r}")
    exact = [Fraction(s) for s in shares]
    total = sum(exact)
    quotas = [global_batch * s / total for s in exact]
    sizes = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_remainder[: global_batch - sum(sizes)]:
        sizes[i] += 1
    if global_batch >= len(sizes):
        for empty in [i for i, n in enumerate(sizes) if n == 0]:
            donor = max((i for i, n in enumerate(sizes) if n >= 2), key=lambda i: (sizes[i] - quotas[i], -i))
            sizes[donor] -= 1
            sizes[empty] += 1
    return tuple(sizes)


def local_slice(global_batch: int, shares: Sequence[float], rank: int) -> slice:
    """Where rank `rank`'s samples lie in the global batch: ranks take consecutive runs in rank order."""
    sizes = local_batch_sizes(global_batch, shares)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(sizes):
        raise ValueError(f"rank must be an integer in [0, {len(sizes)}), got {rank!r}")
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def loss_scale(local_batch: int, global_batch: int, world_size: int) -> float:
    """What a rank multiplies its mean loss by so DDP's gradient average is the global-batch mean: N * b / B."""
    _check_world_size(world_size)
    if global_batch < 1 or not 0 <= local_batch <= global_batch:
        raise ValueError(
            f"need 0 <= local_batch <= global_batch and global_batch >= 1, got {local_batch}, {global_batch}"
        )
    return world_size * local_batch / global_batch
