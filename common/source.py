"""Where a component gets its cluster snapshot from: a live feeder, or a file replayed offline."""

from __future__ import annotations

import json
import pathlib
from typing import Protocol

from common import settings, snapshot


class SnapshotSource(Protocol):
    @property
    def snapshot(self) -> snapshot.Snapshot: ...

    @property
    def synced(self) -> bool:
        """True once the first full list of every watched kind has landed in the snapshot."""
        ...


class StaticSource:
    """A fixed snapshot (from `--cluster STATE.json`, or built by a test)."""

    def __init__(self, fixed: snapshot.Snapshot) -> None:
        self._snapshot = fixed

    @property
    def snapshot(self) -> snapshot.Snapshot:
        return self._snapshot

    @property
    def synced(self) -> bool:
        return True


def from_file(path: pathlib.Path, *, names: settings.Names, taken_at: float | None) -> StaticSource:
    """Load `kubectl get nodes,pods,priorityclasses,namespaces -A -o json` output."""
    document = json.loads(path.read_text())
    return StaticSource(snapshot.from_list(document, names=names, taken_at=taken_at))
