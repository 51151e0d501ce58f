"""Eviction limits of one reclaim cycle, counted in decisions: a single pod, or a whole gang.

A gang is evicted together or not at all, so it is one decision: it counts once in the cycle, once on
each node and once in each namespace where it has members, however many pods that is. Counting its pods
instead would make a gang larger than a limit never reclaimable, and the only way to honour a pod count
for it would be to split it — the one outcome worse than evicting it whole or not at all.

Shared by the planner (which plans within the limits) and the evictor (which re-checks before each API
call); a slot is `(unit, namespace, node)` for one eviction, and charging the same unit again (its next
member) costs nothing more where it was already counted. Pure: no I/O.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from common import settings

Slot = tuple[str, str, str]  # (unit key, namespace, node) of one eviction


class Budget:
    def __init__(self, limits: settings.EvictionLimits) -> None:
        self._limits = limits
        self._units: set[str] = set()
        self._node: dict[str, set[str]] = collections.defaultdict(set)
        self._namespace: dict[str, set[str]] = collections.defaultdict(set)

    def refuse(self, slots: Iterable[Slot]) -> str | None:
        """Why evicting these would cross a limit, or None."""
        batch = list(slots)
        units = {unit for unit, _, _ in batch}
        if len(self._units | units) > self._limits.per_cycle:
            return f"per-cycle limit of {self._limits.per_cycle} eviction decisions reached"
        by_node: dict[str, set[str]] = collections.defaultdict(set)
        by_namespace: dict[str, set[str]] = collections.defaultdict(set)
        for unit, namespace, node in batch:
            by_node[node].add(unit)
            by_namespace[namespace].add(unit)
        for node, more in sorted(by_node.items()):
            if len(self._node[node] | more) > self._limits.per_node:
                return f"per-node limit of {self._limits.per_node} eviction decisions reached on {node}"
        for namespace, more in sorted(by_namespace.items()):
            if len(self._namespace[namespace] | more) > self._limits.per_namespace:
                return f"per-namespace limit of {self._limits.per_namespace} eviction decisions reached in {namespace}"
        return None

    def spent(self) -> str | None:
        """Why no new decision at all fits in this cycle any more, or None."""
        if len(self._units) >= self._limits.per_cycle:
            return f"per-cycle limit of {self._limits.per_cycle} eviction decisions reached"
        return None

    def charge(self, slots: Iterable[Slot]) -> None:
        for unit, namespace, node in slots:
            self._units.add(unit)
            self._node[node].add(unit)
            self._namespace[namespace].add(unit)
