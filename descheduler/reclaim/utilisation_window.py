"""A window's reading of each pod's devices, from the kept parts and the live stretch. Pure.

Which parts a window takes, and when it is unknown: descheduler.reclaim.utilisation_parts; how a device's parts
fold into its reading: descheduler.reclaim.utilisation_fold.

Which series are one device of a pod (`utilisation_parts.gpus`), kept per pod by the parts' cache
(`Cache.devices`): descheduler.reclaim.utilisation_parts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping

from descheduler.reclaim import utilisation_fold as folding
from descheduler.reclaim import utilisation_parts as parts

NAN = math.nan


@dataclasses.dataclass(frozen=True)
class KindReading:
    """A pod's devices of one kind over a window (copies folded); `unknown`: why the window cannot be judged
    yet (parts not read, or not read this cycle), else None."""

    devices: Mapping[str, folding.DeviceReading]
    unknown: str | None = None
    by_index: tuple[str, ...] = ()  # devices identified by host and GPU index: their series carry no UUID

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


@dataclasses.dataclass(frozen=True)
class Judging:
    """What a window's reading depends on besides the data."""

    window: float
    now: float
    grid: parts.Grid
    average: bool
    bound: float  # max_gap_intervals
    left_closed: bool | None = None


def _anchored(numbers: folding.Numbers) -> bool:
    """Whether a part sets the fold's state by itself: samples, and a last sample (see `Acc.add`)."""
    return numbers[0] > 0 and not math.isnan(numbers[3])


def final_end(cache: parts.Cache, needed: range) -> int:
    """The part after the run of final kept parts from the window's first needed one (the part before it)."""
    end = needed[0]
    while end in needed and end in cache.parts and cache.parts[end].final:
        end += 1
    return end


def _kept(cache: parts.Cache, judging: Judging, needed: range, end: int, copies: tuple[int, ...]) -> folding.Acc:
    """A device's fold over the window's final kept parts before `end`: from the part before the window (its last
    sample) through the parts up to the first anchor, then the shares after it (`Stretches`, kept per window in
    `Cache.stretches`, extended to `end`)."""
    first, part = needed[0], judging.grid.part
    numbers = parts.numbers_of(cache.parts.get(first), copies)
    acc = folding.Acc(numbers[3], True) if not math.isnan(numbers[3]) else folding.Acc((first + 1) * part, False)
    anchor = first
    while not _anchored(numbers):
        anchor += 1
        if anchor >= end:
            return acc
        numbers = parts.numbers_of(cache.parts[anchor], copies)
        acc.add(numbers, anchor * part, average=judging.average, left_closed=judging.left_closed,
                bound=judging.bound, length=part)
    if anchor >= end:  # the part before the window is not final yet: no part to fold
        return acc
    kept = cache.stretches.setdefault((judging.window, judging.average, judging.bound, judging.left_closed), {})
    stretches = kept.get(copies)
    if stretches is None or not stretches.first <= anchor < stretches.end or stretches.end > end:
        stretches = kept[copies] = folding.Stretches(anchor, numbers[3])
    stretches.drop_before(anchor)
    for j in range(stretches.end, end):
        stretches.extend(parts.numbers_of(cache.parts[j], copies), j * part, average=judging.average,
                          left_closed=judging.left_closed, bound=judging.bound, length=part)
    stretches.into(acc, average=judging.average)
    return acc


def readings(caches: Mapping[str, parts.Cache], lives: Mapping[str, parts.Part], *, pods: Mapping[tuple[str, str], str],
             judging: Judging, unread: Mapping[str, Collection[int]],
             short: tuple[Mapping[str, parts.Part], Mapping[str, parts.Part]] | None = None,
             short_name: bool = False) -> dict[tuple[str, str], PodReading]:
    """Each pod's reading over window (now - window, now] ((namespace, pod) -> its node). `short`: a window
    shorter than the live stretch, read as a stretch of its own (per kind: the stretch, and the last sample
    before it), exactly from now - window; no kept part is needed. `short_name`: hosts compared up to the first
    dot (`utilisation_parts.same_host`)."""
    grid, average = judging.grid, judging.average
    needed = grid.needed(judging.window, judging.now) if short is None else range(0)
    live_start = grid.live_start(judging.now) if short is None else judging.now - judging.window
    starts = [j * grid.part for j in needed[1:]] + [live_start]
    out: dict[tuple[str, str], PodReading] = {}
    unknown, ends = {}, {}
    for kind, cache in caches.items():
        missing = [j for j in needed if j not in cache.parts or j in unread.get(kind, ())]
        unknown[kind] = (f"{len(missing)} of the {len(needed)} parts of {grid.part}s the window needs are not read "
                         "from the store yet (the part cache is rebuilt after a start or a leader change) or their "
                         "read failed this cycle") if missing else None
        ends[kind] = final_end(cache, needed) if needed and not missing else 0
    for key, node in pods.items():
        hosts: set[str] = set()
        kinds: dict[str, KindReading] = {}
        for kind, cache in caches.items():
            spellings, found_gpus = cache.devices(key, node, short_name=short_name)
            hosts.update(spellings)
            if not found_gpus:
                continue
            live = lives.get(kind) if short is None else short[0].get(kind)
            devices = {}
            for gpu in found_gpus:
                if unknown[kind] is not None:  # not judged: only whether it is busy anyway (no coverage needed)
                    acc = folding.Acc(NAN, False)
                    for part in [*(cache.parts.get(j) for j in needed), live]:
                        for i in gpu.copies:
                            n, n_min, value, _ = part.get(i) if part is not None else folding.EMPTY
                            acc.add((n, n_min, value, NAN), 0.0, average=average, left_closed=False, bound=1.0)
                    devices[gpu.name] = acc.reading(max((live.get(i)[3] for i in gpu.copies), default=NAN)
                                                    if live is not None else NAN, average=average)
                elif short is None:  # the kept fold of the final parts, then the newer parts and the live stretch
                    end = ends[kind]
                    acc = _kept(cache, judging, needed, end, gpu.copies)
                    for j in range(max(end, needed[0] + 1), needed[-1] + 1):
                        acc.add(parts.numbers_of(cache.parts.get(j), gpu.copies), j * grid.part, average=average,
                                left_closed=judging.left_closed, bound=judging.bound, length=grid.part)
                    numbers = parts.numbers_of(live, gpu.copies)
                    acc.add(numbers, live_start, average=average, left_closed=judging.left_closed,
                            bound=judging.bound)
                    devices[gpu.name] = acc.reading(numbers[3], average=average)
                else:  # a short window: its stretch and the last sample before it
                    stretch = [parts.numbers_of(part, gpu.copies) for part in (short[1].get(kind), live)]
                    devices[gpu.name] = folding.device_reading(stretch, starts, average=average,
                                                       left_closed=judging.left_closed, bound=judging.bound)
            kinds[kind] = KindReading(devices, unknown[kind], tuple(gpu.name for gpu in found_gpus if gpu.by_index))
        if hosts:
            out[key] = PodReading(tuple(sorted(hosts)), kinds)
    return out
