"""Per-device utilisation by parts of the store's time: the grid, the kept parts, a window's reading. Pure.

The grid: part j holds the samples of (j·P, (j+1)·P] in the store's time (P = `reclaim.part_seconds`). Per
device and part the store is asked for a few numbers (descheduler.utilisation_promql): samples `n`, `peak` (or
`sum` and `n_min` for the `average` statistic) and `last`, the time of its last sample at or before the part's
end. One set of parts serves every window: a window's verdict is derived from the parts it overlaps.

- Settled: a part whose end is `settle_seconds` old at the store's time is read once (a range query, one step
  per part) and kept (`Cache`); newer parts and the part being written are read every cycle as one stretch
  ("live": from the end of the newest settled part to the store's time).
- Late samples: a kept part in which a device that reports later has fewer samples than its own spacing
  implies, or none near the part's end, is read again every cycle until it looks complete or its end is
  `late_seconds` old; then it is final and its missing samples are gaps the coverage rule judges.
- A window (now - W, now] takes every part it overlaps: it starts at S = the start of the part holding now - W
  (up to one part earlier than W asks: stricter, never laxer), or at the live stretch's start if that is
  earlier. It needs the parts from S on plus the one before S (the last sample before the window).
  A part not read yet (a start, a leader change: the cache is empty and is read back from the store, newest
  first, `rebuild_parts_per_cycle` parts a cycle), or whose read failed this cycle, leaves the window unknown:
  its pods are not idle, and the reason says so. Nothing only in memory matters for correctness.
- Prometheus 2.x ranges include their left end: a sample exactly on a part's start may be counted in the
  part as well as in the one before. Where the last sample before a part sits exactly on its start, the part's
  count is read as between n - 1 and n: the observed interval from n (shorter: stricter), the gaps from n - 1
  (wider: stricter). A peak may take such a sample twice (stricter).

Devices: the pod, namespace and host (from `prometheus.labels`, a later non-empty spelling wins) and the GPU
index on the host, else the UUID, plus the MIG instance. Copies of a device (two scrape jobs, one dropping
`UUID`; the same device under two host spellings of the pod's node) fold per part: the most samples, the
newest time, the higher peak (a NaN peak stays: not idle), the fewest samples for the average. A device that
moves to another pod is another device (its series are another pod's). Storage is compact: one index per
device, and per part four `array('d')` columns.
"""

from __future__ import annotations

import array
import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from common import dcgm, settings

DeviceKey = tuple[str, str, str, str]  # namespace, pod, host, device (GPU index or UUID, "/", MIG instance)
BOUNDARY = 1e-3  # seconds: Prometheus keeps milliseconds; a last sample this close to a part's start is on it
NAN = math.nan


@dataclasses.dataclass(frozen=True)
class Grid:
    part: int  # seconds
    settle: float
    late: float
    budget: int  # parts read back per cycle at most

    @classmethod
    def of(cls, config: settings.Reclaim) -> Grid:
        return cls(config.part_seconds, config.settle_seconds, config.late_seconds, config.rebuild_parts_per_cycle)

    def live_start(self, now: float) -> int:
        """The end of the newest settled part (the live stretch starts there), in seconds."""
        return self.part * math.floor((now - self.settle) / self.part)

    def start(self, window: float, now: float) -> int:
        """Where window (now - window, now] starts on the grid: never later than it asks."""
        return min(self.part * math.floor((now - window) / self.part), self.live_start(now))

    def needed(self, window: float, now: float) -> range:
        """The kept parts window needs: from the one before its start to the newest settled one."""
        return range(self.start(window, now) // self.part - 1, self.live_start(now) // self.part)


Numbers = tuple[float, float, float, float]  # n, n_min, value (peak or sum), last
EMPTY: Numbers = (0.0, math.inf, NAN, NAN)  # no sample; a value NaN with n > 0 is a NaN reading


class Part:
    """One part's (or the live stretch's) numbers for every device index, in compact columns; a device beyond
    the columns' length has no sample. `final`: read again no more (see the module's docstring)."""

    __slots__ = ("final", "last", "n", "n_min", "value")

    def __init__(self, folded: Mapping[int, Sequence[float | None]], *, final: bool = False) -> None:
        size = max(folded, default=-1) + 1
        self.n = array.array("d", [0.0]) * size
        self.n_min = array.array("d", [math.inf]) * size
        self.value = array.array("d", [NAN]) * size
        self.last = array.array("d", [NAN]) * size
        for i, (n, n_min, value, last) in folded.items():
            self.n[i], self.n_min[i] = n or 0.0, math.inf if n_min is None else n_min
            self.value[i], self.last[i] = NAN if value is None else value, NAN if last is None else last
        self.final = final

    def get(self, i: int) -> Numbers:
        if i >= len(self.n):
            return EMPTY
        return self.n[i], self.n_min[i], self.value[i], self.last[i]


FIELD = {"n": 0, "n_min": 1, "peak": 2, "sum": 2, "last": 3}


def fold(into: list[float | None], stat: str, value: float) -> None:
    """One copy's number into a device's (see the module's docstring: copies of a device)."""
    k = FIELD[stat]
    old = into[k]
    if old is None:
        into[k] = value
    elif stat == "n_min":
        into[k] = min(old, value)
    elif k == 2 and (math.isnan(old) or math.isnan(value)):
        into[k] = NAN  # a NaN reading stays: not idle
    else:
        into[k] = max(old, value)


def device_key(metric: Mapping[str, str], labels: settings.PrometheusLabels) -> DeviceKey | None:
    namespace, pod = dcgm.pick(metric, labels.namespace), dcgm.pick(metric, labels.pod)
    if not namespace or not pod:
        return None
    device = f"{metric.get(labels.gpu) or metric.get(labels.uuid, '')}/{metric.get(labels.mig_instance, '')}"
    return namespace, pod, dcgm.pick(metric, labels.hostname), device


def _value(point: Any) -> tuple[float, float] | None:
    try:
        return float(point[0]), float(point[1])
    except (IndexError, TypeError, ValueError):
        return None


class Cache:
    """The kept parts of one kind of device, and the index of its devices. Updated only by `store` (pure: the
    answers in, no I/O); the measuring shell (descheduler.measurement) holds one per kind across cycles."""

    def __init__(self) -> None:
        self.index: dict[DeviceKey, int] = {}
        self.pods: dict[tuple[str, str], list[int]] = {}  # (namespace, pod) -> its device indices
        self.keys: list[DeviceKey] = []
        self.parts: dict[int, Part] = {}

    def _at(self, key: DeviceKey) -> int:
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.pods.setdefault(key[:2], []).append(found)
        return found

    def fetch(self, grid: Grid, *, window: float, now: float) -> list[tuple[int, int]]:
        """The kept parts to read this cycle for windows up to `window`, as runs (first, last part index): every
        needed part not final, newest first, at most `grid.budget`."""
        wanted = [j for j in reversed(grid.needed(window, now)) if j not in self.parts or not self.parts[j].final]
        return runs(wanted[:grid.budget])

    def live(self, answers: Mapping[str, Iterable[Mapping[str, Any]]], *,
             labels: settings.PrometheusLabels) -> Part:
        """The live stretch from its instant answers (`stat` -> vector)."""
        folded: dict[int, list[float | None]] = {}
        for stat, rows in answers.items():
            for row in rows:
                key = device_key(row.get("metric") or {}, labels)
                point = _value(row.get("value"))
                if key is not None and point is not None:
                    fold(folded.setdefault(self._at(key), [None, None, None, None]), stat, point[1])
        return Part(folded)

    def store(self, grid: Grid, answers: Mapping[str, Iterable[Mapping[str, Any]]], *, first: int, last: int,
              now: float, live: Part, labels: settings.PrometheusLabels) -> list[int]:
        """Keep parts `first`..`last` from range answers (`stat` -> matrix, one step per part end); returns the
        parts kept final. `live`: this cycle's live stretch (a device reporting there reports later)."""
        folded: dict[int, dict[int, list[float | None]]] = {j: {} for j in range(first, last + 1)}
        for stat, rows in answers.items():
            for row in rows:
                key = device_key(row.get("metric") or {}, labels)
                if key is None:
                    continue
                i = self._at(key)
                for raw in row.get("values") or ():
                    point = _value(raw)
                    if point is None:
                        continue
                    j = round(point[0] / grid.part) - 1
                    if j in folded:
                        fold(folded[j].setdefault(i, [None, None, None, None]), stat, point[1])
        final = []
        later = [i for i in range(len(live.n)) if live.n[i] > 0]
        reporting = set(later)
        before = self.parts.get(first - 1)
        for j in range(last, first - 1, -1):
            part = Part(folded[j])
            end = (j + 1) * grid.part
            previous = Part(folded[j - 1]) if j - 1 in folded else before
            part.final = now - end >= grid.late or not any(
                short(part.get(i), previous.get(i) if previous else EMPTY, end=end, part=grid.part,
                      after=self._after(i, j, folded, live))
                for i in reporting)
            if part.final:
                final.append(j)
            self.parts[j] = part
            reporting |= {i for i in range(len(part.n)) if part.n[i] > 0}
        return final

    def _after(self, i: int, j: int, folded: Mapping[int, Mapping[int, Sequence[float | None]]], live: Part) -> float:
        """The device's observed spacing in the part after j (or the live stretch): span / samples, or NaN."""
        nxt = folded.get(j + 1, {}).get(i)
        if nxt is not None and nxt[0] and nxt[3] is not None:
            n, last = float(nxt[0]), float(nxt[3])
        elif j + 1 in self.parts:
            n, _, _, last = self.parts[j + 1].get(i)
        else:
            n, _, _, last = live.get(i)
        mine = (folded.get(j) or {}).get(i)
        start = mine[3] if mine is not None and mine[3] is not None else NAN
        return (last - start) / n if n > 0 and not math.isnan(last) and not math.isnan(start) else NAN

    def prune(self, keep_from: int) -> None:
        """Drop parts before `keep_from`, and the devices no kept part has (rebuilding the index when they are
        over half of it)."""
        for j in [j for j in self.parts if j < keep_from]:
            del self.parts[j]
        seen = {i for part in self.parts.values() for i in range(len(part.n)) if part.n[i] > 0
                or not math.isnan(part.last[i])}
        if len(self.keys) < 1000 or len(seen) * 2 >= len(self.keys):
            return
        order = sorted(seen)
        remap = {old: new for new, old in enumerate(order)}
        self.keys = [self.keys[old] for old in order]
        self.index = {key: i for i, key in enumerate(self.keys)}
        self.pods = {}
        for i, key in enumerate(self.keys):
            self.pods.setdefault(key[:2], []).append(i)
        for j, part in self.parts.items():
            kept = {remap[old]: list(part.get(old)) for old in order if old < len(part.n)}
            self.parts[j] = Part(kept, final=part.final)


def runs(parts: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive part indices as (first, last) runs, newest first."""
    out: list[tuple[int, int]] = []
    for j in sorted(parts, reverse=True):
        if out and out[-1][0] == j + 1:
            out[-1] = (j, out[-1][1])
        else:
            out.append((j, j))
    return out


def short(numbers: Numbers, previous: Numbers, *, end: float, part: int, after: float) -> bool:
    """Whether a device that reports later looks short of samples in a part ending at `end`: fewer samples than
    its spacing (the smaller of this part's and the next stretch's, `after`) implies, or none within one spacing
    of the part's end (a late sample may still arrive). A device with no sample up to the part's end started
    later: not short."""
    n, _, _, last = numbers
    start = previous[3]
    if n == 0 and math.isnan(start):
        return False
    own = (last - start) / n if n > 0 and not math.isnan(start) and not math.isnan(last) else NAN
    spacings = [s for s in (after, own) if not math.isnan(s) and s > 0]
    if not spacings:
        return True  # reports later, and nothing to read a spacing from: read it again
    interval = min(spacings)
    newest = last if n > 0 and not math.isnan(last) else start
    if end - newest >= interval:
        return True
    return not math.isnan(own) and n < round((last - start) / interval)


@dataclasses.dataclass(frozen=True)
class DeviceReading:
    """One device over a window: its stretches oldest first as (n_lo, n_hi, span): the samples of a part split
    `span` (from the last sample before it, or the window's start, to its own last) into between n_lo and n_hi
    stretches; its newest sample (NaN: none within the store's lookback); parts with samples whose last sample
    the store did not find (`lost`); and its value: the peak, or the average (None: no sample)."""

    stretches: tuple[tuple[float, float, float], ...]
    newest: float
    lost: int
    value: float | None


@dataclasses.dataclass(frozen=True)
class KindReading:
    """A pod's devices of one kind over a window (copies folded); `unknown`: why the window cannot be judged
    yet (parts not read, or not read this cycle), else None."""

    devices: Mapping[str, DeviceReading]
    unknown: str | None = None

    @property
    def util(self) -> float | None:
        """The pod's reading: its busiest device's (a NaN stays)."""
        values = [d.value for d in self.devices.values() if d.value is not None]
        if not values:
            return None
        return NAN if any(math.isnan(v) for v in values) else max(values)


@dataclasses.dataclass(frozen=True)
class PodReading:
    hosts: tuple[str, ...]  # every host spelling its series carry
    kinds: Mapping[str, KindReading]  # of the series from the pod's node


Readings = Mapping[tuple[str, str], PodReading]  # (namespace, pod) -> ...


def same_host(host: str, node: str) -> bool:
    return not host or host == node or host.split(".")[0] == node.split(".")[0]


def _folded(parts: Sequence[Part | None], copies: Sequence[int]) -> list[Numbers]:
    out = []
    for part in parts:
        acc: list[float | None] = [None, None, None, None]
        for i in copies:
            n, n_min, value, last = part.get(i) if part is not None else EMPTY
            if n > 0:
                for stat, number in (("n", n), ("n_min", n_min), ("peak", value)):
                    fold(acc, stat, number)
            if not math.isnan(last):
                fold(acc, "last", last)
        out.append((acc[0] or 0.0, math.inf if acc[1] is None else acc[1], NAN if acc[2] is None else acc[2],
                    NAN if acc[3] is None else acc[3]))
    return out


def device_reading(numbers: Sequence[Numbers], starts: Sequence[float], *, average: bool) -> DeviceReading:
    """A device's reading from its folded numbers: the part before the window, then each part of the window and
    the live stretch, with each one's start (`starts`, one fewer: the window's parts and the live stretch)."""
    before = numbers[0][3]
    previous, on_sample = (before, True) if not math.isnan(before) else (starts[0], False)
    stretches, lost = [], 0
    peak: float | None = None
    total, counted = 0.0, 0.0
    for (n, n_min, value, last), start in zip(numbers[1:], starts, strict=True):
        on_start = on_sample and abs(previous - start) <= BOUNDARY
        n_lo = n - 1 if on_start and n > 0 else n
        span = 0.0
        if n > 0:
            if math.isnan(last):
                lost += 1
            else:
                span, previous, on_sample = last - previous, last, True
            if average:
                total += value
                counted += n_min - (1 if on_start else 0)
            else:
                nan = math.isnan(value) or (peak is not None and math.isnan(peak))
                peak = NAN if nan else value if peak is None else max(peak, value)
        stretches.append((n_lo, n, span))
    if average:
        result = None if not any(n for n, *_ in numbers[1:]) else total / counted if counted > 0 else NAN
    else:
        result = peak
    return DeviceReading(tuple(stretches), numbers[-1][3], lost, result)


def readings(caches: Mapping[str, Cache], lives: Mapping[str, Part], *, pods: Mapping[tuple[str, str], str],
             window: float, now: float, grid: Grid, average: bool,
             unread: Mapping[str, Collection[int]]) -> dict[tuple[str, str], PodReading]:
    """Each pod's reading over window (now - window, now] ((namespace, pod) -> its node)."""
    needed = grid.needed(window, now)
    live_start = grid.live_start(now)
    starts = [j * grid.part for j in needed[1:]] + [live_start]
    out: dict[tuple[str, str], PodReading] = {}
    unknown = {}
    for kind, cache in caches.items():
        missing = [j for j in needed if j not in cache.parts or j in unread.get(kind, ())]
        unknown[kind] = (f"{len(missing)} of the {len(needed)} parts of {grid.part}s the window needs are not read "
                         "from the store yet (the part cache is rebuilt after a start or a leader change) or their "
                         "read failed this cycle") if missing else None
    for key, node in pods.items():
        hosts: set[str] = set()
        kinds: dict[str, KindReading] = {}
        for kind, cache in caches.items():
            copies: dict[str, list[int]] = {}
            for i in cache.pods.get(key, ()):
                _, _, host, device = cache.keys[i]
                hosts.add(host)
                if same_host(host, node):
                    copies.setdefault(device, []).append(i)
            if not copies:
                continue
            parts = [cache.parts.get(j) for j in needed] + [lives.get(kind)]
            kinds[kind] = KindReading({device: device_reading(_folded(parts, found), starts, average=average)
                                       for device, found in sorted(copies.items())}, unknown[kind])
        if hosts:
            out[key] = PodReading(tuple(sorted(hosts)), kinds)
    return out
