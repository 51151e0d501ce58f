"""Log output: text for people, or one JSON object per line for log pipelines (`--log-format json`).

A JSON line carries `time` (RFC 3339, UTC, milliseconds), `level`, `logger` and `message`, then every
structured field the call passed with `extra={...}`, and `exception` with the traceback when there is one.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

FORMATS = ("text", "json")
FORMAT_ENV = "GPU_STEWARD_LOG_FORMAT"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"  # cut to milliseconds
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What every LogRecord carries; any other attribute came from `extra=` and is a structured field.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).strftime(TIME_FORMAT)[:-3] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES:
                entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: a field that is not JSON (a Path, an enum) is written as its text, never dropped.
        return json.dumps(entry, default=str, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to `sys.stderr` as it is when a record is emitted (a test may have swapped it since)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure(log_format: str) -> None:
    """Send log records at INFO and above to stderr in `log_format` (the settings may change the level)."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
