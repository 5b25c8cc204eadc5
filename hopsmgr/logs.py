"""structlog set-up shared by the master and the agent: JSON lines (or a console renderer on a tty).

Context such as job_id, attempt_id and node is bound per event by the callers.
"""

from __future__ import annotations

import logging
import sys

import structlog


def _stderr_logger(*_: object) -> structlog.PrintLogger:
    """A logger on whatever sys.stderr is now (it may be replaced, e.g. by a test's capture)."""
    return structlog.PrintLogger(sys.stderr)


def configure_logging(json_logs: bool | None = None, level: int = logging.INFO) -> None:
    """JSON to stderr unless stderr is a terminal (then a readable console format); `json_logs` forces one."""
    use_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
