"""`--log-format json`: one JSON object per line, with the time, level, logger, message and structured fields."""

from __future__ import annotations

import json
import logging
import pathlib
import sys
from typing import Any

import pytest

from gpu_steward import cli, logs

CREATED = 1_800_000_000.25  # 2027-01-15T08:00:00.250Z


def record(message: str, *args: Any, extra: dict[str, Any] | None = None, error: bool = False) -> logging.LogRecord:
    exc_info = None
    if error:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    made = logging.getLogger("gpu_steward.test").makeRecord(
        "gpu_steward.test", logging.WARNING, __file__, 1, message, args, exc_info, extra=extra
    )
    made.created = CREATED
    return made


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        pytest.param(record("plain"), {}, id="plain"),
        pytest.param(record("pod %s evicted", "team/a"), {"message": "pod team/a evicted"}, id="arguments-merged"),
        pytest.param(record("evicted", extra={"pod": "team/a", "gpus": 4}), {"pod": "team/a", "gpus": 4},
                     id="structured-fields"),
        pytest.param(record("x", extra={"path": pathlib.Path("/a")}), {"path": "/a"}, id="non-json-field-as-text"),
        pytest.param(record("x", extra={"level": "shadow"}), {}, id="a-field-never-shadows-a-key"),
    ],
)
def test_json_line(made: logging.LogRecord, expected: dict[str, Any]) -> None:
    line = logs.JsonFormatter().format(made)
    assert "\n" not in line
    base = {"time": "2027-01-15T08:00:00.250Z", "level": "WARNING", "logger": "gpu_steward.test",
            "message": made.getMessage()}
    assert json.loads(line) == {**base, **expected}


def test_json_line_carries_the_traceback_in_one_field() -> None:
    entry = json.loads(logs.JsonFormatter().format(record("failed", error=True)))
    assert entry["message"] == "failed"
    assert entry["exception"].startswith("Traceback") and entry["exception"].endswith("RuntimeError: boom")


@pytest.mark.parametrize(
    ("argv", "environment"),
    [
        pytest.param(["--log-format", "json"], {}, id="flag"),
        pytest.param([], {logs.FORMAT_ENV: "json"}, id="environment"),
    ],
)
def test_a_command_logs_json_lines_to_stderr(
    argv: list[str], environment: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    # label-node's failed read is one ERROR record, with no cluster needed.
    assert cli.main(["label-node", "--once", "--dry-run", "--nvidia-smi", "/nonexistent/nvidia-smi", *argv]) == 1
    [line] = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert set(entry) == {"time", "level", "logger", "message"}
    assert (entry["level"], entry["logger"]) == ("ERROR", "gpu_steward.label_node")
    assert entry["message"].startswith("cannot run /nonexistent/nvidia-smi")


def test_text_is_the_default(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    assert cli.main(["label-node", "--once", "--dry-run", "--nvidia-smi", "/nonexistent/nvidia-smi"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert " ERROR gpu_steward.label_node: cannot run /nonexistent/nvidia-smi" in line
