"""What one reclaim cycle may still evict: the eviction limits (`descheduler.limits`) and the cluster's
PodDisruptionBudgets (`snapshot.DisruptionBudget`). Pure: no I/O.

A plan evicts a demand's victims all or none, so every victim's budget is checked before the first call: a batch
of units is refused if it would cross a limit, or if some PodDisruptionBudget selecting its pods allows fewer
disruptions than the batch (plus what earlier decisions of this plan took from it) makes. A pod two budgets select
is never evicted: the Eviction API refuses such a pod outright (HTTP 500, "more than one PodDisruptionBudget").
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence

from common import settings, snapshot
from descheduler import limits
from descheduler.reclaim import gang_units


class Allowance:
    def __init__(self, cluster: snapshot.Snapshot, config: settings.EvictionLimits,
                 *, spent: Iterable[limits.Slot] = ()) -> None:
        """`spent`: evictions already made this cycle (an earlier round of it) that count against the limits."""
        self.limits = limits.Budget(config)
        self.limits.charge(spent)
        self._by_namespace: dict[str, list[snapshot.DisruptionBudget]] = collections.defaultdict(list)
        for budget in cluster.disruption_budgets.values():
            self._by_namespace[budget.namespace].append(budget)
        self._used: dict[str, set[str]] = collections.defaultdict(set)  # budget key -> pods planned
        self._of: dict[str, list[snapshot.DisruptionBudget]] = {}  # pod key -> the budgets selecting it

    def budgets_of(self, pod: snapshot.Pod) -> list[snapshot.DisruptionBudget]:
        found = self._of.get(pod.key)
        if found is None:
            found = self._of[pod.key] = [b for b in self._by_namespace.get(pod.namespace, ()) if b.selects(pod)]
        return found

    def refuse(self, units: Sequence[gang_units.Unit]) -> str | None:
        """Why evicting all of these units would cross a limit or a PodDisruptionBudget, or None."""
        refused = self.limits.refuse(s for u in units for s in u.slots())
        return refused or self.disruption_refused(units)

    def disruption_refused(self, units: Sequence[gang_units.Unit]) -> str | None:
        if not self._by_namespace:
            return None  # no budget in the cluster: nothing to look up for each of many units
        wanted: dict[str, set[str]] = collections.defaultdict(set)
        found: dict[str, snapshot.DisruptionBudget] = {}
        for pod in (p for u in units for p in u.pods):
            budgets = self.budgets_of(pod)
            if len(budgets) > 1:
                return (f"{pod.key} is selected by {len(budgets)} PodDisruptionBudgets "
                        f"({', '.join(sorted(b.key for b in budgets))}): the Eviction API refuses it")
            for budget in budgets:
                wanted[budget.key].add(pod.key)
                found[budget.key] = budget
        for key, pods in sorted(wanted.items()):
            budget, used = found[key], self._used[key]
            if len(used | pods) > budget.disruptions_allowed:
                planned = f", {len(used)} taken earlier in this plan" if used else ""
                return (f"PodDisruptionBudget {key} allows {budget.disruptions_allowed} disruption(s){planned}; "
                        f"evicting {', '.join(sorted(pods - used))} needs {len(pods - used)}")
        return None

    def spent(self) -> str | None:
        return self.limits.spent()

    def charge(self, units: Sequence[gang_units.Unit]) -> None:
        self.limits.charge(s for u in units for s in u.slots())
        for pod in (p for u in units for p in u.pods):
            for budget in self.budgets_of(pod):
                self._used[budget.key].add(pod.key)
