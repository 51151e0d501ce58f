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
- Resumed: a run that did not end in a busy step of its own (its series ended while idle: an eviction; or a gap
  cut it) counts as a stretch that ended in work if its workload worked within `resume_horizon_seconds` after the
  run's last idle step, in a series that began after it (the replacement, or the pod itself after the gap):
  ending at that busy step, lasting from the run's start to it (`resumed()`). So an eviction followed by work
  widens the window.
- Workload: by owner references (`workload()`): a ReplicaSet's or Job's pods share their controller's controller's
  history (a Deployment's, a CronJob's), found in the ReplicaSets and Jobs read (`Controllers`, UID-checked), else
  their ReplicaSet's or Job's; an unknown ReplicaSet or Job leaves the pod alone; any other controller is the
  workload itself; a bare pod has its own. A gone pod's series belongs to the workload the shell saw it in, else to
  the ReplicaSet or Job whose generateName made its name, if known (`series_workload()`), else to itself.
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
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from common import label_values, settings, snapshot

GAP_TOLERANCE = 1.5  # points further apart than this many steps have a gap between them
K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass(frozen=True, init=False)
class History:
    """What `fold()` keeps of one pod's series: its idle stretches that ended in work, the open run, the runs cut
    short by a gap, and where each stretch of data (a segment: after a gap, or the series' start) began and first
    worked (`resumed()` reads those two). Kept as flat arrays of floats, 16 bytes a stretch (a tuple of two floats
    is about 110: 10,000 pods x 7 d of stretches were 200 MB); `stretches` reads them as pairs."""

    last: float | None  # time of the last point folded
    run_start: float | None  # time of the first point of the open idle run (None: not idle)
    run_steps: int
    ends: array.array[float]  # time of the busy step that ended each stretch, in time order
    seconds: array.array[float]  # each stretch's seconds idle
    cut_at: array.array[float]  # time of the last idle point of each run a gap cut short, in time order
    cut_seconds: array.array[float]  # its seconds idle
    segment_at: array.array[float]  # time of each segment's first point, in time order
    segment_busy: array.array[float]  # time of its first busy point (NaN: none yet)

    def __init__(self, last: float | None = None, run_start: float | None = None, run_steps: int = 0,
                 stretches: Iterable[tuple[float, float]] = (), cuts: Iterable[tuple[float, float]] = (),
                 segments: Iterable[tuple[float, float]] = ()) -> None:
        self._set(last, run_start, run_steps, *_columns(stretches), *_columns(cuts), *_columns(segments))

    def _set(self, last: float | None, run_start: float | None, run_steps: int, *columns: array.array[float]) -> None:
        for name, value in (("last", last), ("run_start", run_start), ("run_steps", run_steps),
                            *zip(_COLUMNS, columns, strict=True)):
            object.__setattr__(self, name, value)

    @classmethod
    def _of(cls, last: float | None, run_start: float | None, run_steps: int, *columns: array.array[float]) -> History:
        """Over these arrays, not copied (never changed after)."""
        made = object.__new__(cls)
        made._set(last, run_start, run_steps, *columns)
        return made

    @property
    def _columns(self) -> tuple[array.array[float], ...]:
        return tuple(getattr(self, name) for name in _COLUMNS)

    @property
    def stretches(self) -> tuple[tuple[float, float], ...]:
        """(time of the busy step that ended it, seconds idle) of each stretch, in time order."""
        return tuple(zip(self.ends, self.seconds, strict=True))

    @property
    def cuts(self) -> tuple[tuple[float, float], ...]:
        """(time of its last idle point, seconds idle) of each run a gap cut short, in time order."""
        return tuple(zip(self.cut_at, self.cut_seconds, strict=True))

    @property
    def segments(self) -> tuple[tuple[float, float], ...]:
        """(time of its first point, of its first busy point or NaN) of each segment, in time order."""
        return tuple(zip(self.segment_at, self.segment_busy, strict=True))

    def since(self, start: float) -> History:
        """Forget the stretches that ended, the cuts and the segments that began before `start` (out of the
        look-back)."""
        columns = self._columns
        pairs = [(columns[k], columns[k + 1]) for k in range(0, len(columns), 2)]
        if all(not times or min(times) >= start for times, _ in pairs):
            return self
        kept: list[array.array[float]] = []
        for times, values in pairs:
            keep = [t >= start for t in times]
            kept += [array.array("d", itertools.compress(times, keep)), array.array("d", itertools.compress(values,
                                                                                                           keep))]
        return History._of(self.last, self.run_start, self.run_steps, *kept)


_COLUMNS = ("ends", "seconds", "cut_at", "cut_seconds", "segment_at", "segment_busy")


def _columns(pairs: Iterable[tuple[float, float]]) -> tuple[array.array[float], array.array[float]]:
    listed = list(pairs)
    return array.array("d", [a for a, _ in listed]), array.array("d", [b for _, b in listed])


def fold(history: History, points: Iterable[tuple[float, float]], *, step_seconds: float,
         threshold_percent: float) -> History:
    """`history` after the points (time, peak %) in time order; points not after `history.last` are ignored,
    so overlapping reads fold once. NaN is a missing step (a gap)."""
    last, start, steps = history.last, history.run_start, history.run_steps
    columns = history._columns  # copied before the first change
    copied = False

    def cut() -> None:  # the open run ends in a gap: no stretch, a cut (`resumed()` may make it one)
        nonlocal start, steps
        if start is not None and last is not None:
            changing()
            columns[2].append(last)
            columns[3].append(steps * step_seconds)
        start, steps = None, 0

    def changing() -> None:
        nonlocal columns, copied
        if not copied:
            columns, copied = tuple(array.array("d", c) for c in columns), True

    for t, value in points:
        if last is not None and t <= last:
            continue
        if math.isnan(value):
            cut()  # the run ends in a gap: it did not end in work
            continue  # `last` stays: the next point is then seen after a gap
        if last is None or t - last > GAP_TOLERANCE * step_seconds:
            cut()
            changing()
            columns[4].append(t)  # a new segment
            columns[5].append(math.nan)
        if value < threshold_percent:
            if start is None:
                start, steps = t, 0
            steps += 1
        else:
            if columns[5] and math.isnan(columns[5][-1]):  # (none kept: it began before the look-back)
                changing()
                columns[5][-1] = t
            if start is not None:
                changing()
                columns[0].append(t)
                columns[1].append(steps * step_seconds)
                start, steps = None, 0
        last = t
    return History._of(last, start, steps, *columns)


def resumed(histories: Mapping[K, History], *, of: Callable[[K], Hashable], step_seconds: float,
            horizon_seconds: float) -> dict[K, History]:
    """`histories` with each run that a gap cut short, or that was still idle when its pod's series ended (an
    eviction, a deletion), made a stretch that ended in work where its workload (`of`) worked again within the
    horizon: the first busy point, at most `horizon_seconds` after the run's last idle point, of a segment that
    began after it (the pod that replaced it, or the pod itself after the gap). The stretch ends at that point and
    lasted from the run's start to it: the run's seconds plus the wait. Other histories are returned as they are."""
    groups: dict[Hashable, list[K]] = {}
    for key in histories:
        groups.setdefault(of(key), []).append(key)
    out = dict(histories)
    for keys in groups.values():
        starts = sorted((s, b) for k in keys for s, b in zip(histories[k].segment_at, histories[k].segment_busy,
                                                             strict=True) if not math.isnan(b))
        if not starts:
            continue
        at = [s for s, _ in starts]
        for key in keys:
            h = histories[key]
            runs = list(h.cuts)
            if h.run_start is not None and h.last is not None:
                runs.append((h.last, h.run_steps * step_seconds))
            added, ended_open = [], False
            for i, (t, seconds) in enumerate(runs):
                first = bisect.bisect_right(at, t)
                stop = bisect.bisect_right(at, t + horizon_seconds)
                busy = min((b for _, b in starts[first:stop] if b - t <= horizon_seconds), default=None)
                if busy is not None:
                    added.append((busy, seconds + (busy - t) - step_seconds))
                    ended_open = ended_open or i == len(h.cut_at)
            if added:
                merged = sorted([*h.stretches, *added])
                out[key] = History._of(h.last, None if ended_open else h.run_start, 0 if ended_open else h.run_steps,
                                       *_columns(merged), *h._columns[2:])
    return out


# --- Workloads ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ref:
    """A controller reference (`metadata.ownerReferences[]` with `controller: true`)."""

    kind: str
    name: str
    uid: str  # "" where the reference carries none


@dataclasses.dataclass(frozen=True)
class Controller:
    """A ReplicaSet or a Job as the API server has it: its UID and its own controller (None: none)."""

    uid: str
    owner: Ref | None


Controllers = Mapping[tuple[str, str, str], Controller]  # (namespace, kind, name) -> ReplicaSets and Jobs
# The pod controllers whose own controller (a ReplicaSet's Deployment, a Job's CronJob) is the workload, if any.
GROUPED = ("ReplicaSet", "Job")
# The suffix the API server appends to a generateName: 5 characters of this alphabet (apimachinery's
# `utilrand.String`); a Job's indexed pods carry `<index>-` before it.
_GENERATED = re.compile(r"(?:[0-9]+-)?[bcdfghjklmnpqrstvwxz2456789]{5}")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What shares a history: a Deployment (through its ReplicaSets), a CronJob (through its Jobs), another
    controller, or a pod alone (`kind` "pod"), told apart by UID."""

    namespace: str
    kind: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def controller_ref(raw: Mapping[str, object]) -> Ref | None:
    """An object's controller reference (the first one marked `controller`), or None."""
    meta = raw.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") and ref.get("name"):
            return Ref(str(ref["kind"]), str(ref["name"]), str(ref.get("uid") or ""))
    return None


def controller(raw: Mapping[str, object]) -> Controller:
    """A ReplicaSet's or Job's UID and controller, from its object (or its metadata alone)."""
    meta = raw.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return Controller(str(uid or ""), controller_ref(raw))


def workload_of(namespace: str, owner: Ref | None, *, pod: tuple[str, str], controllers: Controllers) -> Workload:
    """The workload of a pod (`pod`: its name and UID) whose controller is `owner`: for a ReplicaSet or Job, its
    own controller (a Deployment, a CronJob), found by the ReplicaSet's or Job's reference as `controllers` has it
    (its UID checked against the pod's reference), else the ReplicaSet or Job itself; a ReplicaSet or Job not in
    `controllers` (not read, gone, or another object of that name) leaves the pod alone rather than guessing;
    any other controller (a StatefulSet) is the workload itself."""
    alone = Workload(namespace, "pod", *pod)
    if owner is None:
        return alone
    if owner.kind not in GROUPED:
        return Workload(namespace, owner.kind, owner.name, owner.uid)
    found = controllers.get((namespace, owner.kind, owner.name))
    if found is None or (owner.uid and found.uid != owner.uid):
        return alone
    if found.owner is not None:  # a Deployment, a CronJob (or another controller's: an Argo Rollout)
        return Workload(namespace, found.owner.kind, found.owner.name, found.owner.uid)
    return Workload(namespace, owner.kind, owner.name, found.uid)


def workload(pod: snapshot.Pod, *, controllers: Controllers) -> Workload:
    """The workload of a pod the snapshot holds, by its controller reference (`workload_of`)."""
    return workload_of(pod.namespace, controller_ref(pod.raw), pod=(pod.name, pod.uid), controllers=controllers)


def series_workload(namespace: str, name: str, *, controllers: Controllers) -> Workload | None:
    """The workload of a pod known only by its series (gone before it was seen): the ReplicaSet or Job whose
    generateName made its name (`<owner>-<5 generated characters>`, an indexed Job's `<owner>-<index>-<...>`), if
    `controllers` holds one of that name; None: unknown, the series stays its own."""
    for cut in [i for i, c in enumerate(name) if c == "-"][-2:]:
        if not _GENERATED.fullmatch(name[cut + 1:]):
            continue
        for kind in GROUPED:
            found = controllers.get((namespace, kind, name[:cut]))
            if found is not None:
                return workload_of(namespace, Ref(kind, name[:cut], found.uid), pod=(name, ""),
                                   controllers=controllers)
    return None


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
    of: Callable[[tuple[str, str]], Hashable],
    since: float,
    pool: Pool,
    config: settings.LearnedWindow,
) -> dict[str, Learned]:
    """Per pod key, the learned window of pods whose class learns (`tier_windows`: class -> its window), judged
    on `pool` (of the same histories). `of`: the workload of a series (namespace, pod), the pods' own included: the
    series of one workload share a history. `histories` None: not read (every pod keeps its tier window, so says)."""
    chosen = [p for p in pods if p.priority_class_name in tier_windows]
    owned: dict[Hashable, list[tuple[str, str]]] = {}
    for key in histories or {}:
        owned.setdefault(of(key), []).append(key)
    out = {}
    for pod in chosen:
        found = None
        if histories is not None:  # its workload's series, and its own
            own = (pod.namespace, pod.name)
            keys = set(owned.get(of(own), ())) | {own}
            found = stretches_of((histories[k] for k in sorted(keys) if k in histories), since=since)
        out[pod.key] = learn(found, tier_window=tier_windows[pod.priority_class_name or ""], pool=pool,
                             config=config)
    return out
