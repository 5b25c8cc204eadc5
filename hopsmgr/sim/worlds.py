"""The ground-truth worlds by name (hopsmgr.sim.truth): "gavel" or "paper"."""

from __future__ import annotations

from hopsmgr.sim.gavelworld import gavel_world
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.truth import World


def world_by_name(name: str, **kw: object) -> World:
    """'gavel' (needs `throughputs_path`) or 'paper'; other keywords go to the world's factory."""
    if name == "paper":
        return paper_world(**kw)  # type: ignore[arg-type]
    if name == "gavel":
        return gavel_world(**kw)  # type: ignore[arg-type]
    raise ValueError(f"unknown world {name!r} (known: gavel, paper)")
