"""Release: the scheduling-side controller that lifts our gate from gated pods and gangs.

- `planning`: which gated gangs (and single pods, gangs of one) may start now, where, and why the others wait (pure);
- `layout`: where a gang's members go, a search over the one capacity model (pure);
- `patches`: the patches that nominate and un-gate a pod (pure);
- `outcomes`: what earlier releases came to — placed elsewhere, not bound in time, a gang spread or part-bound
  (pure, level-triggered; observed and reported, never repaired);
- `controller`: the loop that plans on the shared snapshot and applies the patches, and tells outcomes, with Events
  and metrics (I/O).

Independent of reclaim (an import-linter contract): the two share only `common/`; the process plumbing (leader,
supervisor, health) wires them together in `gpu_steward.cmd_descheduler`.
"""
