"""The error every master operation raises for a request it cannot do: an HTTP status, the field, why."""

from __future__ import annotations


class RequestError(ValueError):
    """A request that cannot be done: HTTP `status`, the `field` at fault (or None), and why."""

    def __init__(self, status: int, field: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message
