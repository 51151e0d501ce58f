"""Idle windows learned per workload from its own history — pure: no I/O, no clock.

A tier whose PriorityClass says `<prefix>learned-idle-window: "true"` reclaims a pod once it has been idle
for its workload's learned window instead of the tier's fixed one: the shortest idle time (from the floor, in
steps of `bucket_seconds`, below the tier's window) at which an idle stretch that long is estimated to end in work
within the next `resume_horizon_seconds` with a probability below `resume_probability`:

    window = min { a = floor, floor + bucket, ... < tier window : P(resumes within h | idle a) < p }, else the tier's

The probability comes from every series read (all pods, in the look-back), each stretch measured against the
longest earlier stretch of its own pod (a scale-free survival estimate; `Pool`), at the workload's scale: its
longest idle stretch that ended in work. So a workload whose stretches lasted 15 min at most is judged at 30 min
by how often stretches that lasted 2x their pod's longest ended in work within the next 0.67x, and one whose
stretches lasted 1 h by the same pool at 0.5x and the next 0.17x.
Rules, each with its reason in words:
- History: per pod, the peak utilisation of each `step_seconds` (a range query; `fold()` consumes it in time
  order, chunk by chunk, keeping only what it needs). An idle step is below the threshold. An idle stretch is
  a run of consecutive idle steps; it counts only if it *ended in work*: the very next step is busy. A step
  with no value (no sample, NaN) is a gap: never idle, and the run before it ended in a gap, not in work, so
  it does not count (a restart that loses data teaches nothing; one that keeps the series counts as the idle
  time it was). A stretch is measured in whole steps and taken to have lasted one step more (`lasted()`: the busy
  steps on either side of it are partly idle, half a step each on average).
- Workload: a Deployment's pods (through their ReplicaSets, across rollouts), a ReplicaSet's, Job's or
  StatefulSet's pods share one history, found by their controller's pod names (`workload()`); a bare pod has
  its own. Pods that are gone still count: their series carry their names.
- Too little history: fewer than `min_stretches` stretches that ended in work within the look-back, or
  history not read yet (`None`): the tier window.
- The pool (`pool()`): each pod's stretches that ended in work, in time order, each divided by the longest of
  that pod's earlier ones in the look-back (counted once `min_stretches` came before it: a prediction, not
  hindsight), and each pod's open idle run (idle at the last point read: still idle, or the pod gone while
  idle; a run that ended in a gap is no open run, see History) divided by its longest, as *censored*: it
  lasted at least that long. Kaplan-Meier over these ratios estimates the
  probability that a stretch which has lasted a/longest ends in work before (a + h)/longest (h:
  `resume_horizon_seconds`). It assumes stretches independent: pods that go idle and resume together (a fleet
  at night) weigh as many.
- Few stretches that long: a probability is only taken from at least `min_at_risk` pooled stretches that
  lasted at least as long as the idle time judged (relative to their pod's longest) and were *followed* over the
  horizon: ended in work (then or later), or still idle at its end (`Pool.followed()`). A run still idle, or
  gone, before the horizon's end counts in Kaplan-Meier's estimate but not here: it says nothing of the horizon,
  and pods that have just gone quiet together must not make an idle time learnable on their own. Fewer, that idle
  time is not learned (and longer ones are judged in turn). None qualifies below the tier's window: the tier's
  window.
- The probability must be strictly below `resume_probability`. Idle times are judged from the floor rounded up
  to `bucket_seconds`, in steps of it; the first that qualifies is the window.
- Missing data fails closed: everything that is not a full, fresh history keeps the tier window, and a pod
  screened with a learned window is still judged idle over it by the normal fail-closed assessment.
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import itertools
import math
import operator
import re
from collections.abc import Iterable, Mapping, Sequence

from common import label_values, settings, snapshot

GAP_TOLERANCE = 1.5  # points further apart than this many steps have a gap between them
DEPLOYMENT_HASH = "pod-template-hash"  # label the Deployment controller puts on its ReplicaSets' pods
_TOKEN = r"[a-z0-9]+"
_ONE = re.compile(_TOKEN)  # a controller's pod suffix: ReplicaSet, Job (random), StatefulSet (ordinal)
_TWO = re.compile(rf"{_TOKEN}-{_TOKEN}")  # a Deployment's: ReplicaSet hash + random; an indexed Job's: index + random


@dataclasses.dataclass(frozen=True, init=False)
class History:
    """What `fold()` keeps of one pod's series: its idle stretches that ended in work, and the open run. The
    stretches are kept as two flat arrays of floats, 16 bytes a stretch (a tuple of two floats is about 110: 10,000
    pods x 7 d of stretches were 200 MB); `stretches` reads them as pairs."""

    last: float | None  # time of the last point folded
    run_start: float | None  # time of the first point of the open idle run (None: not idle)
    run_steps: int
    ends: array.array[float]  # time of the busy step that ended each stretch, in time order
    seconds: array.array[float]  # each stretch's seconds idle

    def __init__(self, last: float | None = None, run_start: float | None = None, run_steps: int = 0,
                 stretches: Iterable[tuple[float, float]] = ()) -> None:
        pairs = list(stretches)
        self._set(last, run_start, run_steps, array.array("d", [e for e, _ in pairs]),
                  array.array("d", [s for _, s in pairs]))

    def _set(self, last: float | None, run_start: float | None, run_steps: int, ends: array.array[float],
             seconds: array.array[float]) -> None:
        for name, value in (("last", last), ("run_start", run_start), ("run_steps", run_steps), ("ends", ends),
                            ("seconds", seconds)):
            object.__setattr__(self, name, value)

    @classmethod
    def _of(cls, last: float | None, run_start: float | None, run_steps: int, ends: array.array[float],
            seconds: array.array[float]) -> History:
        """Over these arrays, not copied (never changed after)."""
        made = object.__new__(cls)
        made._set(last, run_start, run_steps, ends, seconds)
        return made

    @property
    def stretches(self) -> tuple[tuple[float, float], ...]:
        """(time of the busy step that ended it, seconds idle) of each stretch, in time order."""
        return tuple(zip(self.ends, self.seconds, strict=True))

    def since(self, start: float) -> History:
        """Forget the stretches that ended before `start` (out of the look-back)."""
        if not self.ends or min(self.ends) >= start:
            return self
        kept = [end >= start for end in self.ends]
        return History._of(self.last, self.run_start, self.run_steps,
                           array.array("d", itertools.compress(self.ends, kept)),
                           array.array("d", itertools.compress(self.seconds, kept)))


def fold(history: History, points: Iterable[tuple[float, float]], *, step_seconds: float,
         threshold_percent: float) -> History:
    """`history` after the points (time, peak %) in time order; points not after `history.last` are ignored,
    so overlapping reads fold once. NaN is a missing step (a gap)."""
    last, start, steps = history.last, history.run_start, history.run_steps
    ends, seconds = history.ends, history.seconds  # copied before the first stretch is added
    copied = False
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
            if not copied:
                ends, seconds, copied = array.array("d", ends), array.array("d", seconds), True
            ends.append(t)
            seconds.append(steps * step_seconds)
            start, steps = None, 0
        last = t
    return History._of(last, start, steps, ends, seconds)


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


def _floats() -> array.array[float]:
    return array.array("d")


@dataclasses.dataclass(frozen=True)
class Pool:
    """Idle stretches of every series read, as ratios to their pod's longest earlier stretch (`pool()`), and
    their Kaplan-Meier survival. `resumed()` reads it. Flat arrays of floats: 8 bytes a stretch, not a float
    object's 32."""

    # `ended`: ratios of the stretches that ended in work, ascending; `censored`: of the open runs (lasted at least
    # that long), ascending; `times`: the distinct ratios in `ended`; `survival`: the estimated share of stretches
    # lasting beyond each of `times`.
    ended: array.array[float] = dataclasses.field(default_factory=_floats)
    censored: array.array[float] = dataclasses.field(default_factory=_floats)
    times: array.array[float] = dataclasses.field(default_factory=_floats)
    survival: array.array[float] = dataclasses.field(default_factory=_floats)

    def surviving(self, ratio: float) -> float:
        """The estimated share of stretches lasting at least `ratio` (none ended before it)."""
        ended = bisect.bisect_left(self.times, ratio)
        return self.survival[ended - 1] if ended else 1.0

    def at_risk(self, ratio: float) -> int:
        """Pooled stretches that lasted at least `ratio` (ended in work then or later, or still idle past it)."""
        return (len(self.ended) - bisect.bisect_left(self.ended, ratio)
                + len(self.censored) - bisect.bisect_left(self.censored, ratio))

    def followed(self, ratio: float, until: float) -> int:
        """Pooled stretches that lasted at least `ratio` and were seen to work or to `until`: what is known of
        the next stretch of time. A run still idle (or gone) short of `until` says nothing of it."""
        return (len(self.ended) - bisect.bisect_left(self.ended, ratio)
                + len(self.censored) - bisect.bisect_left(self.censored, until))

    def resumed(self, ratio: float, until: float) -> float:
        """Estimated probability that a stretch which has lasted `ratio` ends in work before `until` (1 when
        none lasted that long)."""
        if not self.at_risk(ratio):
            return 1.0
        return 1.0 - self.surviving(until) / self.surviving(ratio)


def percent(share: float) -> str:
    """A setting's share in percent, as written (0.05: 5%, 0.025: 2.5%), without float noise (0.07 x 100 is
    7.000000000000001)."""
    return f"{round(share * 100, 9):g}%"


def below(share: float, limit: float) -> str:
    """`share` (under `limit`) in percent, with as many decimals as it takes to print it under `limit` (4.96 %,
    not 5.0 %)."""
    under = float(percent(limit)[:-1])
    for decimals in range(1, 16):
        said = f"{share:.{decimals}%}"
        if float(said[:-1]) < under:
            return said
    return said


def lasted(seconds: float, *, step_seconds: float) -> float:
    """How long an idle stretch of whole idle steps lasted: one step more (its partly idle neighbours, a busy
    step on either side, add half a step each on average)."""
    return seconds + step_seconds


def pool(series: Iterable[History], *, step_seconds: float, min_stretches: int) -> Pool:
    """The pool of `series`' stretches (see the module's rules): ended in work when at least `min_stretches`
    of its pod's stretches ended before it, censored (its open run) when the pod has `min_stretches`."""
    ended: list[float] = []
    censored: list[float] = []
    for history in series:
        if len(history.seconds) < min_stretches:
            continue
        lengths = [seconds + step_seconds for seconds in history.seconds]  # lasted(), in time order
        longest = list(itertools.accumulate(lengths, max))  # the longest up to each stretch
        ended.extend(map(operator.truediv, lengths[min_stretches:], longest[min_stretches - 1:-1]))
        if history.run_start is not None:
            censored.append(lasted(history.run_steps * step_seconds, step_seconds=step_seconds) / longest[-1])
    ended.sort()
    censored.sort()
    times, survival, alive = [], [], 1.0
    for ratio in sorted(set(ended)):
        first = bisect.bisect_left(ended, ratio)
        at_risk = len(ended) - first + len(censored) - bisect.bisect_left(censored, ratio)
        alive *= 1 - (bisect.bisect_right(ended, ratio) - first) / at_risk  # of those lasting this long, ended
        times.append(ratio)
        survival.append(alive)
    return Pool(*(array.array("d", floats) for floats in (ended, censored, times, survival)))


def learn(stretches: Sequence[float] | None, *, tier_window: int, pool: Pool,
          config: settings.LearnedWindow) -> Learned:
    """The window for a workload whose idle stretches that ended in work (seconds, within the look-back) are
    `stretches` (None: its history is not known: not read yet, or the read failed), judged on `pool`."""
    span = duration(config.lookback_seconds)
    if stretches is None:
        return Learned(tier_window, False, "history not read (yet): tier window")
    if len(stretches) < config.min_stretches:
        return Learned(tier_window, False, f"{len(stretches)} idle stretch(es) of this workload ended in work in "
                       f"{span}, fewer than {config.min_stretches}: tier window")
    longest = lasted(max(stretches), step_seconds=config.step_seconds)
    scale = (f"this workload's longest idle stretch that ended in work in {span} (about {duration(longest)}, "
             f"of {len(stretches)})")
    horizon, limit = config.resume_horizon_seconds, config.resume_probability
    idle = math.ceil(config.floor_seconds / config.bucket_seconds) * config.bucket_seconds
    while idle < tier_window:
        ratio, until = idle / longest, (idle + horizon) / longest  # one division each: no rounding gap at its end
        followed = pool.followed(ratio, until)
        resumed = pool.resumed(ratio, until)
        if followed >= config.min_at_risk and resumed < limit:
            return Learned(math.ceil(idle), True, f"learned idle window {duration(idle)} = {ratio:.1f}x {scale}: of "
                           f"the {followed} idle stretches of all pods that lasted {ratio:.1f}x their pod's longest, "
                           f"followed to work or to {until:.1f}x, an estimated {below(resumed, limit)} ended in work "
                           f"within {duration(horizon)}, under {percent(limit)}")
        idle += config.bucket_seconds
    return Learned(tier_window, False, f"{scale[0].upper()}{scale[1:]}: at no idle time under the tier window did "
                   f"fewer than {percent(limit)} of at least {config.min_at_risk} idle stretches of all pods as long "
                   f"(against their pod's longest), followed to work or {duration(horizon)} further, end in work "
                   f"within {duration(horizon)}: tier window")


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
    return [seconds for h in series for end, seconds in zip(h.ends, h.seconds, strict=True) if end >= since]


def windows(
    pods: Iterable[snapshot.Pod],
    *,
    tier_windows: Mapping[str, int],
    histories: Mapping[tuple[str, str], History] | None,
    since: float,
    pool: Pool,
    config: settings.LearnedWindow,
) -> dict[str, Learned]:
    """Per pod key, the learned window of pods whose class learns (`tier_windows`: class -> its window), judged
    on `pool` (of the same histories). `histories` None: not read (every pod keeps its tier window, so says)."""
    chosen = [p for p in pods if p.priority_class_name in tier_windows]
    of = {p.key: workload(p) for p in chosen}
    owned = members(set(of.values()), histories or {})
    out = {}
    for pod in chosen:
        found = None
        if histories is not None:  # its workload's pods, and itself whatever its name (not its owner's pattern)
            keys = set(owned.get(of[pod.key], ())) | {(pod.namespace, pod.name)}
            found = stretches_of((histories[k] for k in sorted(keys) if k in histories), since=since)
        out[pod.key] = learn(found, tier_window=tier_windows[pod.priority_class_name or ""], pool=pool,
                             config=config)
    return out
