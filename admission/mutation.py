"""The admission engine: one pure function from an admission request's pod to a patch and its reasons.

No I/O, no clock: the HTTP shell (`admission.server`) passes the snapshot and `now`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common import settings, snapshot


@dataclasses.dataclass(frozen=True)
class NodeScoreView:
    node: str
    score: float
    normalized: int


@dataclasses.dataclass(frozen=True)
class Outcome:
    patch: list[dict[str, Any]]  # RFC 6902 operations; empty => nothing to change
    changes: tuple[str, ...]  # kinds of mutation made: tier, affinity-required, affinity-preferred, gate, decision
    record: str  # the decision record (also written to the decision annotation when anything changed)
    warnings: tuple[str, ...]  # returned to the client as AdmissionResponse warnings
    skipped: str | None  # why the pod was left alone entirely (None: it was considered)
    tier: str | None = None
    gated: bool = False
    scores: tuple[NodeScoreView, ...] = ()


def decide(
    *,
    operation: str,
    namespace: str | None,
    pod: Mapping[str, Any],
    cluster: snapshot.Snapshot,
    config: settings.Settings,
    now: float,
) -> Outcome:
    raise NotImplementedError
