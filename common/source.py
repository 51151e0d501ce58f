"""Where a component gets its cluster snapshot from: a live feeder, or a file replayed offline."""

from __future__ import annotations

import copy
import json
import pathlib
from collections.abc import Callable
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


def from_file(path: pathlib.Path, *, names: settings.Names, clock: Callable[[], float]) -> StaticSource:
    """Load `kubectl get nodes,pods,priorityclasses,namespaces -A -o json` output, always current."""
    document = json.loads(path.read_text())
    return StaticSource(snapshot.from_list(document, names=names, taken_at=clock()), clock=clock)
