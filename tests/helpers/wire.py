"""Wire helpers for tests: send a message through its JSON text form, as the network would."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Message(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def through_json(message: Message, parse: Callable[[object], T]) -> T:
    """`message` serialised by its own `to_json`, written as JSON text, read back and parsed."""
    return parse(json.loads(json.dumps(message.to_json())))
