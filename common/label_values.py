"""The one parser for every flag, count and choice gpu-steward reads from a label or an annotation.

Webhook and descheduler read the same keys through these functions, so a value means the same thing
to both. Pure: no I/O.

- `value(meta, key)`: a pod's label wins over its annotation of the same key.
- `flag`: present means on (`""`, `true`, `yes`, `on`, `1`), except the spellings of off (`false`,
  `no`, `off`, `0`); case and surrounding blanks ignored. Any other value is read as on, the cautious
  reading of an opt-out the user evidently meant, and reported as a problem.
- `count`: a positive integer in plain ASCII decimal, no sign, no leading zero, no blanks, no `_`, at
  most 2^31-1 (Kubernetes counts are int32). Python's `int()` would take `" 4"`, `"+4"`, `"1_000"`
  and non-ASCII digits; a gang size read more generously than the user wrote it gates pods forever.
- `integer`: the same spelling with an optional `-` (e.g. a PriorityClass's `toleration-seconds`), within
  int64.
- `choice`: one of an enum's values, exactly.
- `stamped`: `<RFC 3339 time> <text>` (the release record `gpu-steward.io/release`: when and where a pod was
  released): the time as unix seconds (None when absent or unreadable) and the text.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from common import timestamps

ON = frozenset({"", "true", "yes", "on", "1"})
OFF = frozenset({"false", "no", "off", "0"})
MAX_COUNT = 2**31 - 1
INT64 = range(-(2**63), 2**63)
_DECIMAL = re.compile(r"[1-9][0-9]*")
_SIGNED = re.compile(r"-?(0|[1-9][0-9]*)")

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)


@dataclasses.dataclass(frozen=True)
class Parsed(Generic[T]):
    value: T  # the meaning used (the fallback when the text is absent or unreadable)
    problem: str | None = None  # why the text was not read as written, for a warning or a record


def value(meta: Mapping[str, Any], key: str) -> str | None:
    """The text of `key` on an object's metadata: its label, else its annotation, else None."""
    for source in (meta.get("labels"), meta.get("annotations")):
        if isinstance(source, Mapping) and key in source:
            return str(source[key])
    return None


def flag(raw: str | None, *, key: str) -> Parsed[bool]:
    if raw is None:
        return Parsed(False)
    word = raw.strip().lower()
    if word in OFF:
        return Parsed(False)
    if word in ON:
        return Parsed(True)
    return Parsed(True, f"{key}={raw!r} is not true/false; read as true")


def count(raw: str | None, *, key: str) -> Parsed[int | None]:
    if raw is None:
        return Parsed(None, f"{key} is missing")
    if not _DECIMAL.fullmatch(raw) or len(raw) > len(str(MAX_COUNT)) or int(raw) > MAX_COUNT:
        return Parsed(None, f"{key}={raw!r} is not a positive integer")
    return Parsed(int(raw))


def integer(raw: str | None, *, key: str) -> Parsed[int | None]:
    if raw is None:
        return Parsed(None)
    if not _SIGNED.fullmatch(raw) or len(raw) > 20 or int(raw) not in INT64:
        return Parsed(None, f"{key}={raw!r} is not an integer")
    return Parsed(int(raw))


def choice(raw: str | None, kind: type[E], *, key: str, default: E) -> Parsed[E]:
    if raw is None:
        return Parsed(default)
    for member in kind:
        if member.value == raw:
            return Parsed(member)
    allowed = ", ".join(str(m.value) for m in kind)
    return Parsed(default, f"{key}={raw!r} is not one of {allowed}; using {default.value}")


def stamp(at: str, text: str) -> str:
    """The `stamped` spelling: an RFC 3339 time, one blank, the text."""
    return f"{at} {text}"


def stamped(raw: str | None) -> tuple[float | None, str]:
    if raw is None:
        return None, ""
    at, _, text = raw.partition(" ")
    when = timestamps.epoch(at) if "T" in at else None
    return (when, text) if when is not None else (None, raw)
