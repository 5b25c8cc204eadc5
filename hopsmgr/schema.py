"""Small typed schema values that both validate decoded JSON and describe it as JSON Schema.

One definition per wire message (hopsmgr.protocol) serves the validator (`spec.check(value, name)`,
raising `WireError` naming the dotted field) and the OpenAPI document (`spec.json_schema()`), so the
document cannot drift from what the API accepts. Patterns are full matches in Python and are written
as `^(?:...)$` in the document, which means the same in JSON Schema's (ECMA-262) regular expressions;
free text refuses NUL characters, and says so with a pattern.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

JsonSchema = dict[str, Any]
NO_NUL = "[^\\u0000]*"


class WireError(ValueError):
    """A message that does not match its schema: `field` (dotted path) and why."""

    def __init__(self, field_name: str | None, message: str) -> None:
        self.field = field_name
        self.message = message
        super().__init__(f"{field_name}: {message}" if field_name else message)


def show(value: object) -> str:
    """A value for an error message, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def join(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


class Spec:
    """A schema: `check` returns the validated value (or raises WireError), `json_schema` describes it."""

    def check(self, value: object, name: str) -> Any:
        raise NotImplementedError

    def json_schema(self) -> JsonSchema:
        raise NotImplementedError


@dataclass(frozen=True)
class Str(Spec):
    max_len: int = 4096
    min_len: int = 0
    pattern: str | None = None  # a full match; None: any text without NUL
    enum: tuple[str, ...] = ()
    forbid: tuple[str, str] | None = None  # (regex searched for, why it is refused)
    replace_nul: bool = False  # NUL becomes U+FFFD instead of a refusal (a job's output)
    description: str = ""

    def check(self, value: object, name: str) -> str:
        if not isinstance(value, str):
            raise WireError(name, f"must be a string, got {show(value)}")
        if self.replace_nul:
            value = value.replace("\x00", "\ufffd")
        if len(value) > self.max_len:
            raise WireError(name, f"must be at most {self.max_len} characters, got {len(value)}")
        if len(value) < self.min_len:
            raise WireError(name, f"must be at least {self.min_len} characters, got {show(value)}")
        if "\x00" in value:
            raise WireError(name, "must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise WireError(name, "must be valid Unicode (it holds a lone surrogate)") from None
        if self.enum and value not in self.enum:
            raise WireError(name, f"must be one of {', '.join(self.enum)}, got {show(value)}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise WireError(name, f"must match {self.pattern}, got {show(value)}")
        if self.forbid is not None and re.search(self.forbid[0], value):
            raise WireError(name, f"{self.forbid[1]}, got {show(value)}")
        return value

    def json_schema(self) -> JsonSchema:
        if self.enum:
            return _described({"type": "string", "enum": list(self.enum)}, self.description)
        out: JsonSchema = {"type": "string", "maxLength": self.max_len}
        if self.min_len:
            out["minLength"] = self.min_len
        if not self.replace_nul:
            out["pattern"] = f"^(?:{self.pattern or NO_NUL})$"
        if self.forbid is not None:
            out["not"] = {"pattern": self.forbid[0]}
        return _described(out, self.description)


@dataclass(frozen=True)
class Int(Spec):
    low: int | None = None
    high: int | None = None
    description: str = ""

    def check(self, value: object, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(name, f"must be an integer, got {show(value)}")
        if self.low is not None and value < self.low:
            raise WireError(name, f"must be >= {self.low}, got {value}")
        if self.high is not None and value > self.high:
            raise WireError(name, f"must be <= {self.high}, got {value}")
        return value

    def json_schema(self) -> JsonSchema:
        out: JsonSchema = {"type": "integer"}
        if self.low is not None:
            out["minimum"] = self.low
        if self.high is not None:
            out["maximum"] = self.high
        return _described(out, self.description)


@dataclass(frozen=True)
class Num(Spec):
    low: float | None = None
    high: float | None = None
    positive: bool = False  # > 0 (exclusive minimum 0)
    description: str = ""

    def check(self, value: object, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(name, f"must be a number, got {show(value)}")
        try:
            result = float(value)
        except OverflowError:  # an integer with hundreds of digits
            result = math.inf
        if not math.isfinite(result):
            raise WireError(name, f"must be a finite number, got {show(value)}")
        if self.positive and result <= 0:
            raise WireError(name, f"must be > 0, got {value}")
        if self.low is not None and result < self.low:
            raise WireError(name, f"must be >= {self.low:g}, got {value}")
        if self.high is not None and result > self.high:
            raise WireError(name, f"must be <= {self.high:g}, got {value:g}")
        return result

    def json_schema(self) -> JsonSchema:
        out: JsonSchema = {"type": "number"}
        if self.positive:
            out["exclusiveMinimum"] = 0
        if self.low is not None:
            out["minimum"] = self.low
        if self.high is not None:
            out["maximum"] = self.high
        return _described(out, self.description)


@dataclass(frozen=True)
class Bool(Spec):
    description: str = ""

    def check(self, value: object, name: str) -> bool:
        if not isinstance(value, bool):
            raise WireError(name, f"must be true or false, got {show(value)}")
        return value

    def json_schema(self) -> JsonSchema:
        return _described({"type": "boolean"}, self.description)


@dataclass(frozen=True)
class Nullable(Spec):
    inner: Spec

    def check(self, value: object, name: str) -> Any:
        return None if value is None else self.inner.check(value, name)

    def json_schema(self) -> JsonSchema:
        return {"anyOf": [self.inner.json_schema(), {"type": "null"}]}


@dataclass(frozen=True)
class Arr(Spec):
    items: Spec
    max_items: int
    min_items: int = 0
    unique: bool = False
    first: Spec | None = None  # a stricter schema for item 0 (a command's program)
    description: str = ""

    def check(self, value: object, name: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise WireError(name, f"must be a JSON array, got {show(value)}")
        if len(value) > self.max_items:
            raise WireError(name, f"must have at most {self.max_items} items, got {len(value)}")
        if len(value) < self.min_items:
            raise WireError(name, f"must have at least {self.min_items} item(s), got {len(value)}")
        out = tuple(
            (self.first if i == 0 and self.first is not None else self.items).check(v, f"{name}[{i}]")
            for i, v in enumerate(value)
        )
        if self.unique and len(set(out)) != len(out):
            raise WireError(name, f"must not repeat an item, got {show(list(out))}")
        return out

    def json_schema(self) -> JsonSchema:
        out: JsonSchema = {"type": "array", "items": self.items.json_schema(), "maxItems": self.max_items}
        if self.first is not None:
            out["prefixItems"] = [self.first.json_schema()]
        if self.min_items:
            out["minItems"] = self.min_items
        if self.unique:
            out["uniqueItems"] = True
        return _described(out, self.description)


@dataclass(frozen=True)
class Map(Spec):
    """A JSON object with free keys (checked by `keys`) and values of one schema."""

    values: Spec
    keys: Str = Str(max_len=64)
    max_items: int = 64
    description: str = ""

    def check(self, value: object, name: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise WireError(name or None, f"must be a JSON object, got {show(value)}")
        if len(value) > self.max_items:
            raise WireError(name, f"must have at most {self.max_items} entries, got {len(value)}")
        return {
            self.keys.check(k, join(name, k)): self.values.check(v, join(name, k)) for k, v in value.items()
        }

    def json_schema(self) -> JsonSchema:
        out: JsonSchema = {
            "type": "object",
            "propertyNames": self.keys.json_schema(),
            "additionalProperties": self.values.json_schema(),
            "maxProperties": self.max_items,
        }
        return _described(out, self.description)


@dataclass(frozen=True)
class Obj(Spec):
    """A JSON object with known keys only; `build` turns the checked keys into a value (a dataclass)."""

    title: str
    fields: dict[str, Spec]
    required: tuple[str, ...] = ()
    one_of: tuple[str, ...] = ()  # exactly one of these keys must be given
    build: Callable[..., Any] | None = None  # may raise WireError for rules across fields
    description: str = ""
    rules: tuple[JsonSchema, ...] = ()  # those rules in JSON Schema (`allOf`), for the document

    def check(self, value: object, name: str) -> Any:
        if not isinstance(value, Mapping):
            raise WireError(name or None, f"must be a JSON object, got {show(value)}")
        for key in value:
            if key not in self.fields:
                raise WireError(join(name, key), f"unknown field (known: {', '.join(self.fields)})")
        for key in self.required:
            if key not in value:
                raise WireError(join(name, key), "is required")
        if self.one_of and sum(k in value for k in self.one_of) != 1:
            raise WireError(join(name, self.one_of[0]), f"give exactly one of {' and '.join(self.one_of)}")
        checked = {
            key: spec.check(value[key], join(name, key)) for key, spec in self.fields.items() if key in value
        }
        return checked if self.build is None else self.build(**checked)

    def json_schema(self) -> JsonSchema:
        out: JsonSchema = {
            "title": self.title,
            "type": "object",
            "additionalProperties": False,
            "properties": {k: s.json_schema() for k, s in self.fields.items()},
        }
        if self.required:
            out["required"] = list(self.required)
        if self.one_of:
            out["oneOf"] = [{"required": [k]} for k in self.one_of]
        if self.rules:
            out["allOf"] = list(self.rules)
        return _described(out, self.description)


def _described(schema: JsonSchema, description: str) -> JsonSchema:
    return {**schema, "description": description} if description else schema


@dataclass(frozen=True)
class Anything(Spec):
    """Any JSON value (parts of answers whose shape belongs to another module, e.g. plan statistics)."""

    description: str = ""

    def check(self, value: object, name: str) -> Any:
        return value

    def json_schema(self) -> JsonSchema:
        return _described({}, self.description)
