"""Where a component gets its cluster snapshot from: a live feeder, or a file replayed offline."""

from __future__ import annotations

import copy
import json
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import yaml

from common import jsontext, settings, snapshot, snapshot_build


class SnapshotSource(Protocol):
    @property
    def snapshot(self) -> snapshot.Snapshot: ...

    @property
    def synced(self) -> bool:
        """True once the first full list of every watched kind has landed in the snapshot."""
        ...


class LiveSource(SnapshotSource, Protocol):
    """A source whose snapshot trails a watch (`feeder.Feeder`): what the watch delivered since is asked apart."""

    def unbuilt(self) -> Mapping[str, Mapping[str, Any]]:
        """Pods delivered since the snapshot was built that newly hold a node: key -> object."""
        ...


class StaticSource:
    """A fixed snapshot (from `--cluster STATE.json`, or built by a test).

    With `clock`, the snapshot is reported as taken now: a replayed state is as current as the
    operator who chose it says, and must not age into "stale" while a long-running process serves it.
    """

    def __init__(self, fixed: snapshot.Snapshot, *, clock: Callable[[], float] | None = None) -> None:
        self._snapshot = fixed
        self._clock = clock

    @property
    def snapshot(self) -> snapshot.Snapshot:
        if self._clock is not None:
            # A shallow copy keeps the derived views (cached on the instance) of the fixed snapshot.
            stamped = copy.copy(self._snapshot)
            object.__setattr__(stamped, "taken_at", self._clock())
            return stamped
        return self._snapshot

    @property
    def synced(self) -> bool:
        return True

    def unbuilt(self) -> dict[str, Any]:
        """Nothing: the fixed snapshot is all there is."""
        return {}


SAVE_STATE = "kubectl get nodes,pods,priorityclasses,namespaces -A -o json > STATE.json"


class InputError(ValueError):
    """An input file that cannot be used; the message names the file, the line when known, and what was
    expected."""


def read_text(name: str, *, expected: str) -> str:
    """The text of file `name` (`-`: stdin); InputError naming it and what was `expected` when unreadable."""
    where = "<stdin>" if name == "-" else name
    try:
        return sys.stdin.read() if name == "-" else pathlib.Path(name).read_text()
    except FileNotFoundError:
        raise InputError(f"{where}: no such file; expected {expected}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: cannot read it: {exc}") from exc


def from_file(path: pathlib.Path, *, names: settings.Names, clock: Callable[[], float],
              gpu_classes: Sequence[str] = settings.Dra().gpu_device_classes) -> StaticSource:
    """Load `kubectl get nodes,pods,priorityclasses,namespaces -A -o json` output, always current (`gpu_classes`:
    `dra.gpu_device_classes`, for DRA objects in it)."""
    text = read_text(str(path), expected=f"the output of {SAVE_STATE}")
    try:
        document = jsontext.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno} column {exc.colno}: {_not_json(text, exc)}") from None
    if not isinstance(document, dict):
        start = len(text) - len(text.lstrip())
        line = text.count("\n", 0, start) + 1
        found = "a JSON array" if isinstance(document, list) else f"a JSON {type(document).__name__}"
        raise InputError(f"{path}: line {line}: {found}; expected an object of kind List ({SAVE_STATE})")
    try:
        fixed = snapshot_build.from_list(document, names=names, taken_at=clock(), gpu_classes=gpu_classes)
    except ValueError as exc:
        raise InputError(f"{path}: {exc} ({SAVE_STATE})") from exc
    return StaticSource(fixed, clock=clock)


def _not_json(text: str, exc: json.JSONDecodeError) -> str:
    """What went wrong, saying so when the whole file is YAML (`-o yaml` instead of `-o json`)."""
    try:
        as_yaml = yaml.safe_load(text)
    except yaml.YAMLError:
        as_yaml = None
    # JSON with a slip (a trailing comma) is YAML too; only a file not even shaped like JSON is "YAML".
    if isinstance(as_yaml, dict | list) and not text.lstrip().startswith(("{", "[")):
        return "this is YAML; expected JSON (save the state with -o json)"
    return f"invalid JSON ({exc.msg}); expected a JSON object of kind List"
