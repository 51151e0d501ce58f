"""Idle windows learned per workload from its own history — pure: no I/O, no clock.

A tier whose PriorityClass says `<prefix>learned-idle-window: "true"` reclaims a pod once it has been idle
for its workload's learned window instead of the tier's fixed one:

    window = clamp(quantile q of the workload's idle stretches that ended in work x margin, floor, tier window)

rounded up to `bucket_seconds` (one utilisation query per distinct window) and never above the tier window.
Rules, each with its reason in words:
- History: per pod, the peak utilisation of each `step_seconds` (a range query; `fold()` consumes it in time
  order, chunk by chunk, keeping only what it needs). An idle step is below the threshold. An idle stretch is
  a run of consecutive idle steps; it counts only if it *ended in work*: the very next step is busy. A step
  with no value (no sample, NaN) is a gap: never idle, and the run before it ended in a gap, not in work, so
  it does not count (a restart that loses data teaches nothing; one that keeps the series counts as the idle
  time it was). A stretch is measured in whole steps (its first and last step may be partly busy: the margin
  covers that).
- Workload: a Deployment's pods (through their ReplicaSets, across rollouts), a ReplicaSet's, Job's or
  StatefulSet's pods share one history, found by their controller's pod names (`workload()`); a bare pod has
  its own. Pods that are gone still count: their series carry their names.
- Too little history: fewer than `min_stretches` stretches that ended in work within the look-back, or
  history not read yet (`None`): the tier window.
- Missing data fails closed: everything that is not a full, fresh history keeps the tier window, and a pod
  screened with a learned window is still judged idle over it by the normal fail-closed assessment.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence

from common import label_values, settings, snapshot

GAP_TOLERANCE = 1.5  # points further apart than this many steps have a gap between them
DEPLOYMENT_HASH = "pod-template-hash"  # label the Deployment controller puts on its ReplicaSets' pods
_TOKEN = r"[a-z0-9]+"
_ONE = re.compile(_TOKEN)  # a controller's pod suffix: ReplicaSet, Job (random), StatefulSet (ordinal)
_TWO = re.compile(rf"{_TOKEN}-{_TOKEN}")  # a Deployment's: ReplicaSet hash + random; an indexed Job's: index + random


@dataclasses.dataclass(frozen=True)
class History:
    """What `fold()` keeps of one pod's series: its idle stretches that ended in work, and the open run."""

    last: float | None = None  # time of the last point folded
    run_start: float | None = None  # time of the first point of the open idle run (None: not idle)
    run_steps: int = 0
    stretches: tuple[tuple[float, float], ...] = ()  # (time of the busy step that ended it, seconds idle)

    def since(self, start: float) -> History:
        """Forget the stretches that ended before `start` (out of the look-back)."""
        kept = tuple(s for s in self.stretches if s[0] >= start)
        return self if len(kept) == len(self.stretches) else dataclasses.replace(self, stretches=kept)


def fold(history: History, points: Iterable[tuple[float, float]], *, step_seconds: float,
         threshold_percent: float) -> History:
    """`history` after the points (time, peak %) in time order; points not after `history.last` are ignored,
    so overlapping reads fold once. NaN is a missing step (a gap)."""
    last, start, steps, stretches = history.last, history.run_start, history.run_steps, list(history.stretches)
    for t, value in points:
        if last is not None and t <= last:
            continue
        if math.isnan(value):
            start, steps = None, 0  # the run ends in a gap: it did not end in work
            continue  # `last` stays: the next point is then seen after a gap
        if last is not None and t - last > GAP_TOLERANCE * step_seconds:
            start, steps = None, 0
        if value < threshold_percent:
            if start is None:
                start, steps = t, 0
            steps += 1
        elif start is not None:
            stretches.append((t, steps * step_seconds))
            start, steps = None, 0
        last = t
    return History(last, start, steps, tuple(stretches))


# --- Workloads ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    namespace: str
    name: str  # "Deployment web", "Job train", "pod notebook-0" (in reasons)
    prefix: str  # its pods' names: prefix + suffix (a bare pod: its whole name, no suffix)
    suffix: re.Pattern[str] | None  # what follows the prefix; None: exactly the prefix

    def owns(self, pod_name: str) -> bool:
        if self.suffix is None:
            return pod_name == self.prefix
        return pod_name.startswith(self.prefix) and bool(self.suffix.fullmatch(pod_name[len(self.prefix):]))


def workload(pod: snapshot.Pod) -> Workload:
    """The pods that share the pod's history: its Deployment's (the ReplicaSet's name less the
    `pod-template-hash`), else its controller's (`<owner>-<suffix>`), else the pod alone."""
    kind, owner = pod.owner_kind, pod.owner_name
    if not kind or not owner:
        return Workload(pod.namespace, f"pod {pod.name}", pod.name, None)
    template = pod.labels.get(DEPLOYMENT_HASH)
    if kind == "ReplicaSet" and template and owner.endswith(f"-{template}"):
        deployment = owner[: -len(template) - 1]
        return Workload(pod.namespace, f"Deployment {deployment}", f"{deployment}-", _TWO)
    suffix = _TWO if kind == "Job" and "batch.kubernetes.io/job-completion-index" in pod.labels else _ONE
    return Workload(pod.namespace, f"{kind} {owner}", f"{owner}-", suffix)


def members(workloads: Iterable[Workload], pods: Iterable[tuple[str, str]]) -> dict[Workload, list[tuple[str, str]]]:
    """Which (namespace, pod name) series belong to which workload: looked up by each '-'-ended prefix of
    the name, so the cost grows with series, not series x workloads."""
    by_prefix: dict[tuple[str, str], list[Workload]] = {}
    for w in workloads:
        by_prefix.setdefault((w.namespace, w.prefix), []).append(w)
    out: dict[Workload, list[tuple[str, str]]] = {}
    for namespace, name in pods:
        cuts = [i + 1 for i, c in enumerate(name) if c == "-"] + [len(name)]
        for cut in cuts:
            for w in by_prefix.get((namespace, name[:cut]), ()):
                if w.owns(name):
                    out.setdefault(w, []).append((namespace, name))
    return out


# --- The learned window ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Learned:
    window_seconds: int
    learned: bool  # False: the tier's window (too little history)
    reason: str


def duration(seconds: float) -> str:
    """Seconds in words for reasons: whole days in d, from 2 h in h, else in min."""
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def learn(stretches: Sequence[float] | None, *, tier_window: int, config: settings.LearnedWindow) -> Learned:
    """The window for a workload whose idle stretches that ended in work (seconds, within the look-back) are
    `stretches` (None: its history is not known: not read yet, or the read failed)."""
    span = duration(config.lookback_seconds)
    if stretches is None:
        return Learned(tier_window, False, "history not read (yet): tier window")
    if len(stretches) < config.min_stretches:
        return Learned(tier_window, False, f"{len(stretches)} idle stretch(es) of this workload ended in work in "
                       f"{span}, fewer than {config.min_stretches}: tier window")
    base = quantile(stretches, config.quantile)
    which = "longest" if config.quantile >= 1 else f"{config.quantile:.0%} quantile of the"
    said = (f"{which} idle stretch of this workload that ended in work in {span}: {duration(base)} "
            f"(of {len(stretches)}) x {config.margin:g}")
    window = max(base * config.margin, config.floor_seconds)
    floored = base * config.margin < config.floor_seconds
    bucketed = math.ceil(window / config.bucket_seconds) * config.bucket_seconds
    if bucketed >= tier_window:
        return Learned(tier_window, False, f"{said} (rounded up to {config.bucket_seconds:g}s) reaches the tier "
                       f"window {duration(tier_window)}: tier window")
    floor = f", raised to the floor {duration(config.floor_seconds)}" if floored else ""
    return Learned(int(bucketed), True, f"learned idle window {duration(bucketed)}: {said}{floor}")


def enabled(pc: snapshot.PriorityClass, *, names: settings.Names) -> label_values.Parsed[bool]:
    """The tier's opt-in. An unreadable value is off (the cautious reading of an opt-in), with the problem."""
    key = names.learned_idle_window
    parsed = label_values.flag(pc.annotations.get(key), key=key)
    if parsed.problem:
        return label_values.Parsed(False, f"PriorityClass {pc.name}: {key}={pc.annotations[key]!r} is not "
                                   "true/false; learned idle windows off")
    return parsed


def stretches_of(series: Iterable[History], *, since: float) -> list[float]:
    """The idle stretches (seconds) of a workload's pods that ended in work at or after `since`."""
    return [seconds for h in series for end, seconds in h.stretches if end >= since]


def windows(
    pods: Iterable[snapshot.Pod],
    *,
    tier_windows: Mapping[str, int],
    histories: Mapping[tuple[str, str], History] | None,
    since: float,
    config: settings.LearnedWindow,
) -> dict[str, Learned]:
    """Per pod key, the learned window of pods whose class learns (`tier_windows`: class -> its window).
    `histories` None: not read (every pod keeps its tier window, with that reason)."""
    chosen = [p for p in pods if p.priority_class_name in tier_windows]
    of = {p.key: workload(p) for p in chosen}
    owned = members(set(of.values()), histories or {}) if histories is not None else {}
    out = {}
    for pod in chosen:
        found = None
        if histories is not None:  # its workload's pods, and itself whatever its name (not its owner's pattern)
            keys = set(owned.get(of[pod.key], ())) | {(pod.namespace, pod.name)}
            found = stretches_of((histories[k] for k in sorted(keys) if k in histories), since=since)
        out[pod.key] = learn(found, tier_window=tier_windows[pod.priority_class_name or ""], config=config)
    return out
