"""Fakes shared by tests: a CBC executable that never answers (for the planner's deadlines)."""

from __future__ import annotations

from pathlib import Path


def stalling_cbc(folder: Path) -> str:
    """The path of a fake CBC binary in `folder` that sleeps a minute and writes nothing."""
    script = folder / "cbc"
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    return str(script)
