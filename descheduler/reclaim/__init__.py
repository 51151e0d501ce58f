"""Idle-GPU reclaim: a pure planner in one-job modules, its I/O shell, and this package's public face.

- `pending`: demands — pending pods, or whole gangs, that idle GPUs could let run;
- `screening`: may a running GPU pod be reclaimed once idle (everything but its utilisation);
- `gang_units`: victim units — an idle pod alone, or a gang reclaimed only as a whole;
- `search`: for one member of a demand, the node with the cheapest minimal victim set;
- `allowance`: what a cycle may still evict — the limits and the PodDisruptionBudgets (all or none);
- `planner`: orchestration — screening, units, demands in order, limits — into a `Plan`;
- `utilisation`, `utilisation_promql`, `utilisation_parts`, `utilisation_fold`, `utilisation_window`: is a pod idle,
  from per-GPU parts of the store's time (their queries, the kept parts, a device's fold over a window's parts, each
  pod's devices over a window);
- `idle_learning`: idle windows learned per workload;
- the I/O shell: `loop` (one reclaim cycle), `measurement` (reads and keeps the parts), `idle_history`.

Callers use the names below; the modules' own names are for the package and its tests.
"""

from descheduler.reclaim import pending, planner, screening

GANG = pending.GANG
Member = pending.Member
Demand = pending.Demand
demands_from_snapshot = pending.demands_from_snapshot
gang_demand = pending.gang_demand
Screened = screening.Screened
scheduled_at = screening.scheduled_at
screen = screening.screen
screen_all = screening.screen_all
windows_needed = screening.windows_needed
Eviction = planner.Eviction
Spared = planner.Spared
DemandOutcome = planner.DemandOutcome
Plan = planner.Plan
plan = planner.plan

__all__ = ["GANG", "Demand", "DemandOutcome", "Eviction", "Member", "Plan", "Screened", "Spared",
           "demands_from_snapshot", "gang_demand", "plan", "scheduled_at", "screen", "screen_all", "windows_needed"]
