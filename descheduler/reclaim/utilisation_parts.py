"""Per-device utilisation by parts of the store's time: the grid and the kept parts. Pure.

The grid: part j holds the samples of (j·P, (j+1)·P] in the store's time (P = `reclaim.part_seconds`). Per
device and part the store is asked for a few numbers (descheduler.reclaim.utilisation_promql): samples `n`, `peak` (or
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
  first, `rebuild_parts_per_cycle` parts a cycle, `PARTS_PER_QUERY` per range query), or whose read failed this
  cycle, leaves the window unknown: its pods are not idle, and the reason says so. Nothing only in memory
  matters for correctness.
- Prometheus 2.x ranges include their left end (3.x and VictoriaMetrics do not): a sample exactly on a part's
  start is then counted in the part as well as in the one before. The shell asks the store which it does once
  (`left_closed`, a 1 ms range ending 1 ms after a known sample); where the last sample before a part sits
  exactly on its start, the part's count is then n - 1 or n; until it is known, between n - 1 and n: the
  observed interval from n (shorter: stricter), the gaps from n - 1 (wider: stricter), which fails closed on
  series whose samples sit on the grid. A peak may take such a sample twice (stricter).

A window's reading folds its parts (descheduler.reclaim.utilisation_fold) per device of a pod
(descheduler.reclaim.utilisation_window).

Devices: the pod, namespace and host (from `prometheus.labels`, a later non-empty spelling wins), with the GPU
index, the UUID and the MIG instance. A pod's series from its node (the host compared as a whole name, or up to the
first dot with `prometheus.hostname_match: short-name`; no host label: the pod's) are one GPU (`gpus`; kept per pod
and node by `Cache.devices` until the pod has another series) when they carry the same UUID; a copy without UUID is
the GPU of the one UUID seen with its host and index, else a GPU of its own identified by host and index (the
reading says so); a copy with neither is a device of its own. Copies of a GPU (two scrape jobs, one dropping `UUID`
or `gpu`; the same GPU under two host spellings) fold per part: the most samples, the newest time, the higher peak
(a NaN peak stays: not idle), the fewest samples for the average. A device that moves to another pod is another
device (its series are another pod's). Storage is compact: one index per series' identity, and per part four
`array('d')` columns.
"""

from __future__ import annotations

import array
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from common import dcgm, settings
from descheduler.reclaim import utilisation_fold as folding

DeviceKey = tuple[str, str, str, str, str, str]  # namespace, pod, host, GPU index, UUID, MIG instance
NAN = math.nan
PARTS_PER_QUERY = 4  # a range query reads at most this many parts: each query stays small whatever the rebuild


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

    def short(self, window: float, now: float) -> bool:
        """Whether a window starts inside the live stretch: it is read as a stretch of its own, exactly."""
        return now - window > self.live_start(now)

    def start(self, window: float, now: float) -> int:
        """Where window (now - window, now] starts on the grid: never later than it asks."""
        return min(self.part * math.floor((now - window) / self.part), self.live_start(now))

    def needed(self, window: float, now: float) -> range:
        """The kept parts window needs: from the one before its start to the newest settled one."""
        return range(self.start(window, now) // self.part - 1, self.live_start(now) // self.part)


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

    def get(self, i: int) -> folding.Numbers:
        if i >= len(self.n):
            return folding.EMPTY
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
    return (namespace, pod, dcgm.pick(metric, labels.hostname), metric.get(labels.gpu, ""),
            metric.get(labels.uuid, ""), metric.get(labels.mig_instance, ""))


def _names(labels: settings.PrometheusLabels) -> tuple[str, ...]:
    """The labels a series' device key is read from, every spelling (`Cache._row`)."""
    return (*labels.namespace, *labels.pod, *labels.hostname, labels.gpu, labels.uuid, labels.mig_instance)


def _value(point: Any) -> tuple[float, float] | None:
    try:
        return float(point[0]), float(point[1])
    except (IndexError, TypeError, ValueError):
        return None


class Cache:
    """The kept parts of one kind of device, and the index of its devices. Updated only by `store` (pure: the
    answers in, no I/O); the measuring shell (descheduler.reclaim.measurement) holds one per kind across cycles."""

    def __init__(self) -> None:
        self.index: dict[DeviceKey, int] = {}
        self.pods: dict[tuple[str, str], list[int]] = {}  # (namespace, pod) -> its device indices
        self.keys: list[DeviceKey] = []
        self.parts: dict[int, Part] = {}
        # (window, average, max_gap_intervals, left_closed) -> a device's copies -> its shares of the window's fold
        self.stretches: dict[tuple[float, bool, float, bool | None], dict[tuple[int, ...], folding.Stretches]] = {}
        self._raw: dict[tuple[str | None, ...], int | None] = {}  # raw label values -> device (None: no pod)
        # (namespace, pod), node, short_name -> the pod's series indices then, their hosts, its devices (`devices`)
        self._devices: dict[tuple[tuple[str, str], str, bool], tuple[int, tuple[str, ...], tuple[Gpu, ...]]] = {}

    def _at(self, key: DeviceKey) -> int:
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.pods.setdefault(key[:2], []).append(found)
        return found

    def _row(self, metric: Mapping[str, str], labels: settings.PrometheusLabels, names: tuple[str, ...]) -> int | None:
        """A row's device index (None: no pod): keyed by its raw label values (`names`: `_names(labels)`) first, so
        that the spellings are picked once per series, not once per row."""
        raw = tuple(map(metric.get, names))
        found = self._raw.get(raw, -1)
        if found == -1:
            key = device_key(metric, labels)
            found = self._raw[raw] = self._at(key) if key is not None else None
        return found

    def devices(self, pod: tuple[str, str], node: str, *, short_name: bool) -> tuple[tuple[str, ...], tuple[Gpu, ...]]:
        """The host spellings of a pod's series and its devices (`gpus`) among the series from its node
        (`same_host`). Kept until the pod has another series (its indices only grow until `prune` renumbers them)."""
        indices = self.pods.get(pod, ())
        memo = (pod, node, short_name)
        found = self._devices.get(memo)
        if found is None or found[0] != len(indices):
            hosts: set[str] = set()
            identities: dict[int, tuple[str, str, str, str]] = {}
            for i in indices:
                _, _, host, index, uuid, mig = self.keys[i]
                hosts.add(host)
                if same_host(host, node, short_name=short_name):
                    identities[i] = (host, index, uuid, mig)
            found = self._devices[memo] = (len(indices), tuple(hosts), tuple(gpus(identities)) if identities else ())
        return found[1], found[2]

    def fetch(self, grid: Grid, *, window: float, now: float) -> list[tuple[int, int]]:
        """The kept parts to read this cycle for windows up to `window`, as runs (first, last part index) of at
        most `PARTS_PER_QUERY` parts: every needed part not final, newest first, at most `grid.budget`."""
        wanted = [j for j in reversed(grid.needed(window, now)) if j not in self.parts or not self.parts[j].final]
        return [(max(first, last - k - PARTS_PER_QUERY + 1), last - k)
                for first, last in runs(wanted[:grid.budget]) for k in range(0, last - first + 1, PARTS_PER_QUERY)]

    def live(self, answers: Mapping[str, Iterable[Mapping[str, Any]]], *,
             labels: settings.PrometheusLabels) -> Part:
        """The live stretch from its instant answers (`stat` -> vector)."""
        folded: dict[int, list[float | None]] = {}
        names = _names(labels)
        for stat, rows in answers.items():
            for row in rows:
                i = self._row(row.get("metric") or {}, labels, names)
                point = _value(row.get("value"))
                if i is not None and point is not None:
                    fold(folded.setdefault(i, [None, None, None, None]), stat, point[1])
        return Part(folded)

    def store(self, grid: Grid, answers: Mapping[str, Iterable[Mapping[str, Any]]], *, first: int, last: int,
              now: float, live: Part, labels: settings.PrometheusLabels,
              left_closed: bool | None = None) -> list[int]:
        """Keep parts `first`..`last` from range answers (`stat` -> matrix, one step per part end); returns the
        parts kept final. `live`: this cycle's live stretch (a device reporting there reports later);
        `left_closed`: see `device_reading` (a sample on a part's start is not counted as the part's)."""
        folded: dict[int, dict[int, list[float | None]]] = {j: {} for j in range(first, last + 1)}
        names = _names(labels)
        for stat, rows in answers.items():
            for row in rows:
                i = self._row(row.get("metric") or {}, labels, names)
                if i is None:
                    continue
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
                short(part.get(i), previous.get(i) if previous else folding.EMPTY, end=end, part=grid.part,
                      after=self._after(i, j, folded, live, part=grid.part, left_closed=left_closed),
                      left_closed=left_closed)
                for i in reporting)
            if part.final:
                final.append(j)
            self.parts[j] = part
            reporting |= {i for i in range(len(part.n)) if part.n[i] > 0}
        return final

    def _after(self, i: int, j: int, folded: Mapping[int, Mapping[int, Sequence[float | None]]], live: Part, *,
               part: int, left_closed: bool | None) -> float:
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
        n -= _on_start(start, (j + 1) * part, n, left_closed)
        return (last - start) / n if n > 0 and not math.isnan(last) and not math.isnan(start) else NAN

    def prune(self, keep_from: int) -> None:
        """Drop parts before `keep_from`, and the devices no kept part has (rebuilding the index when they are
        over half of it)."""
        for j in [j for j in self.parts if j < keep_from]:
            del self.parts[j]
        for window, shares in list(self.stretches.items()):  # shares of dropped parts (a part read again may differ)
            for copies, found in list(shares.items()):
                if found.end <= keep_from:
                    del shares[copies]
                elif found.first < keep_from:
                    found.drop_before(keep_from)
            if not shares:
                del self.stretches[window]
        if len(self.keys) < 1000:
            return
        newest_first = [self.parts[j] for j in sorted(self.parts, reverse=True)]  # a live device: one look, not 37
        order = [i for i in range(len(self.keys)) if any(
            i < len(part.n) and (part.n[i] > 0 or not math.isnan(part.last[i])) for part in newest_first)]
        if len(order) * 2 >= len(self.keys):
            return
        remap = {old: new for new, old in enumerate(order)}
        self._raw, self.stretches, self._devices = {}, {}, {}
        self.keys = [self.keys[old] for old in order]
        self.index = {key: i for i, key in enumerate(self.keys)}
        self.pods = {}
        for i, key in enumerate(self.keys):
            self.pods.setdefault(key[:2], []).append(i)
        for j, part in self.parts.items():
            kept = {remap[old]: list(part.get(old)) for old in order if old < len(part.n)}
            self.parts[j] = Part(kept, final=part.final)


def same_host(host: str, node: str, *, short_name: bool = False) -> bool:
    """Whether a series' host label names the pod's node: the whole name (`prometheus.hostname_match` exact), or
    up to the first dot (short-name). A series without a host label is the pod's (without a scope `utilisation.assess`
    then never finds the pod idle: it could be another cluster's)."""
    return not host or host == node or (short_name and host.split(".")[0] == node.split(".")[0])


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One physical device of a pod: its name in readings and reasons, and its copies (series indices)."""

    name: str
    copies: tuple[int, ...]
    by_index: bool  # identified by host and GPU index (no UUID), or by nothing at all


def gpus(copies: Mapping[int, tuple[str, str, str, str]]) -> list[Gpu]:
    """A pod's devices from its series' identities (index -> (host, GPU index, UUID, MIG instance)), see the
    module's docstring: one device per UUID (with its MIG instance); a UUID-less copy joins the one UUID seen with
    its host and index, else is a device of host and index; a copy with neither is a device of its own."""
    groups: dict[tuple[str, ...], list[int]] = {}
    uuids: dict[tuple[str, str, str], set[str]] = {}  # (host, index, MIG instance) -> UUIDs seen there
    for host, index, uuid, mig in copies.values():
        if uuid and index:
            uuids.setdefault((host, index, mig), set()).add(uuid)
    for i, (host, index, uuid, mig) in sorted(copies.items()):
        seen = uuids.get((host, index, mig), set()) if index else set()
        if not uuid and len(seen) == 1:
            uuid = next(iter(seen))
        key: tuple[str, ...] = (("uuid", uuid, mig) if uuid else ("index", host, index, mig) if index
                                else ("none", str(i)))
        groups.setdefault(key, []).append(i)
    out = []
    for key, found in sorted(groups.items()):
        by, *identity = key
        instance = f" MIG instance {identity[-1]}" if by != "none" and identity[-1] else ""
        if by == "uuid":
            name = f"{identity[0]}{instance}"
        elif by == "index":
            name = f"GPU {identity[1]}{instance} on {identity[0] or 'no host'}"
        else:
            name = f"series {identity[0]} (no UUID, no GPU index)"
        out.append(Gpu(name, tuple(found), by != "uuid"))
    return out


def runs(parts: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive part indices as (first, last) runs, newest first."""
    out: list[tuple[int, int]] = []
    for j in sorted(parts, reverse=True):
        if out and out[-1][0] == j + 1:
            out[-1] = (j, out[-1][1])
        else:
            out.append((j, j))
    return out


def _on_start(previous: float, start: float, n: float, left_closed: bool | None) -> int:
    """1 where a part's count may hold the last sample before it (on its start, ranges closed on the left)."""
    return int(n > 0 and left_closed is not False and abs(previous - start) <= folding.BOUNDARY)


def short(numbers: folding.Numbers, previous: folding.Numbers, *, end: float, part: int, after: float,
          left_closed: bool | None = None) -> bool:
    """Whether a device that reports later looks short of samples in a part ending at `end`: fewer samples than
    its spacing (the smaller of this part's and the next stretch's, `after`) implies, or none within one spacing
    of the part's end (a late sample may still arrive). A device with no sample up to the part's end started
    later: not short."""
    n, _, _, last = numbers
    start = previous[3]
    n -= _on_start(start, end - part, n, left_closed)
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


def numbers_of(part: Part | None, copies: Sequence[int]) -> folding.Numbers:
    """A device's numbers in a part, its copies folded (see the module's docstring: copies of a device)."""
    if part is None:
        return folding.EMPTY
    if len(copies) == 1:
        return part.get(copies[0])
    acc: list[float | None] = [None, None, None, None]
    for i in copies:
        n, n_min, value, last = part.get(i)
        if n > 0:
            for stat, number in (("n", n), ("n_min", n_min), ("peak", value)):
                fold(acc, stat, number)
        if not math.isnan(last):
            fold(acc, "last", last)
    return (acc[0] or 0.0, math.inf if acc[1] is None else acc[1], NAN if acc[2] is None else acc[2],
            NAN if acc[3] is None else acc[3])
