"""A device's reading over a window: one fold over its parts' numbers, and the kept shares of it. Pure.

A window's reading is one fold over its parts in order (`Acc.add`), the state it carries from part to part being
the last sample so far. From a part with samples and a last sample (an anchor) on, that state no longer depends
on where the window started: each final part's share of the fold after the window's first anchor is kept
(`Stretches`, per window and device), so a cycle folds only the parts before the anchor (usually none), the
parts not final yet and the live stretch, and a start that moves drops the oldest shares. Exactly the reading a
fold from scratch gives (tests/unit/test_utilisation_fold.py).

A part's numbers per device (`Numbers`: samples, the fewest samples, peak or sum, the last sample's time) are kept
on the grid of descheduler.reclaim.utilisation_parts; which parts and devices a window takes is
descheduler.reclaim.utilisation_window's.
"""

from __future__ import annotations

import array
import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

BOUNDARY = 1e-3  # seconds: Prometheus keeps milliseconds; a last sample this close to a part's start is on it
NAN = math.nan

Numbers = tuple[float, float, float, float]  # n, n_min, value (peak or sum), last
EMPTY: Numbers = (0.0, math.inf, NAN, NAN)  # no sample; a value NaN with n > 0 is a NaN reading


@dataclasses.dataclass(frozen=True)
class DeviceReading:
    """One device over a window, from its stretches (each part's samples split its stretch, from the last sample
    before it, or the window's start on the grid where the series started later, to its own last, into between
    n_lo and n_hi stretches): `observed`, the smallest mean stretch (span / n_hi; inf: none); `worst`, the
    largest span / (n_lo + b - 1) (b = `max_gap_intervals`: every stretch but one at least the interval I, the
    longest is at most b I exactly when this is at most I); its newest sample (NaN: none within the store's
    lookback); parts with samples whose last sample the store did not find (`lost`); and its value: the peak,
    or the average (None: no sample)."""

    observed: float
    worst: float
    newest: float
    lost: int
    value: float | None


class Acc:
    """A device's stretches so far, folded (see DeviceReading), part after part (`add`); a window's final parts
    are folded once, their shares kept (`Stretches`)."""

    __slots__ = ("counted", "lost", "nan", "observed", "on_sample", "peak", "previous", "samples", "total", "worst")

    def __init__(self, previous: float, on_sample: bool) -> None:
        self.previous, self.on_sample = previous, on_sample
        self.observed, self.worst, self.lost = math.inf, 0.0, 0
        self.peak, self.nan, self.samples = -math.inf, False, False
        self.total, self.counted = 0.0, 0.0

    def add(self, numbers: Numbers, start: float, *, average: bool, left_closed: bool | None, bound: float,
            length: float = 0.0) -> None:
        """One part of `length` seconds (0: the live stretch) starting at `start`; `left_closed`: see
        `device_reading`. A part of the window without a sample of its own holds a stretch of at least its length
        (longer than `bound` intervals exactly when length / bound > I)."""
        n, n_min, value, last = numbers
        on_start = n > 0 and self.on_sample and left_closed is not False and abs(self.previous - start) <= BOUNDARY
        n_lo = n - 1 if on_start else n
        n_hi = n_lo if on_start and left_closed else n
        if n_lo <= 0 and length > 0:
            self.worst = max(self.worst, length / bound)
        if n <= 0:
            return
        if math.isnan(last):
            self.lost += 1
        else:
            span = last - self.previous
            if span > 0:
                if n_hi > 0:
                    self.observed = min(self.observed, span / n_hi)
                room = n_lo + bound - 1
                self.worst = max(self.worst, span / room if room > 0 else math.inf)
            self.previous, self.on_sample = last, True
        self.samples = True
        if average:
            self.total += value
            self.counted += n_min - on_start
        elif math.isnan(value):
            self.nan = True
        else:
            self.peak = max(self.peak, value)

    def reading(self, newest: float, *, average: bool) -> DeviceReading:
        if not self.samples:
            value = None
        elif average:
            value = self.total / self.counted if self.counted > 0 else NAN
        else:
            value = NAN if self.nan else self.peak
        return DeviceReading(self.observed, self.worst, newest, self.lost, value)


def device_reading(numbers: Sequence[Numbers], starts: Sequence[float], *, average: bool,
                   left_closed: bool | None = None, bound: float = 2.0) -> DeviceReading:
    """A device's reading from its folded numbers: the part before the window, then each part of the window and
    the live stretch, with each one's start (`starts`, one fewer). `left_closed`: whether the store's ranges
    include their left end (Prometheus 2.x; None: not known yet); `bound`: `max_gap_intervals`."""
    before = numbers[0][3]
    acc = Acc(before, True) if not math.isnan(before) else Acc(starts[0], False)
    for k, (found, start) in enumerate(zip(numbers[1:], starts, strict=True)):
        length = starts[k + 1] - start if k + 1 < len(starts) else 0.0
        acc.add(found, start, average=average, left_closed=left_closed, bound=bound, length=length)
    return acc.reading(numbers[-1][3], average=average)


WIDTH = 7  # numbers a part in `Stretches.columns`: observed, worst, lost, value, counted, samples, previous


class Stretches:
    """One device's shares of the fold (`Acc.add`) over consecutive final parts `first`.. (`WIDTH` numbers each, in
    one `array('d')`), from an anchor on: a part with samples and a last sample, which sets the state the fold
    carries (`Acc.previous`) by itself. A share depends only on its part and the state the part before left, so
    the shares after an anchor are the same for every window start at or before it: a start that moves drops the
    oldest shares and folds nothing again (`Cache.stretches`). The first row is the anchor's: only its state. The
    shares' sum (`summary`) is kept until they change: a cycle whose window start and final parts stay adds one
    summary, not every share."""

    __slots__ = ("_summary", "columns", "first")

    def __init__(self, first: int, state: float) -> None:
        self.first = first
        self.columns = array.array("d", (math.inf, 0.0, 0.0, -math.inf, 0.0, 0.0, state))
        self._summary: Summary | None = None

    @property
    def end(self) -> int:
        return self.first + len(self.columns) // WIDTH

    def drop_before(self, j: int) -> None:
        if j > self.first:
            del self.columns[:(j - self.first) * WIDTH]
            self.first, self._summary = j, None

    def extend(self, numbers: Numbers, start: float, *, average: bool, left_closed: bool | None, bound: float,
               length: float) -> None:
        """The share of the next part (`numbers`, from `start`, `length` seconds), after the state the part before
        left (`Acc.add`)."""
        share = Acc(self.columns[-1], True)
        share.add(numbers, start, average=average, left_closed=left_closed, bound=bound, length=length)
        value = share.total if average else NAN if share.nan else share.peak
        self.columns.extend((share.observed, share.worst, share.lost, value, share.counted, share.samples,
                             share.previous))
        self._summary = None

    def summary(self) -> Summary | None:
        """The shares after the anchor's row, summed (None: none): the smallest observed, the largest worst, lost,
        whether a peak is NaN, the largest other peak, whether any has samples, counted, and the values added one
        after the other from 0.0 (the average's sum, `into`)."""
        if self._summary is None and len(self.columns) > WIDTH:
            columns = self.columns
            values = columns[WIDTH + 3::WIDTH]
            numbers = [value for value in values if not math.isnan(value)]
            total = 0.0
            for value in values:
                total += value
            self._summary = Summary(min(columns[WIDTH::WIDTH]), max(columns[WIDTH + 1::WIDTH]),
                                    int(sum(columns[WIDTH + 2::WIDTH])), len(numbers) < len(values),
                                    max(numbers, default=-math.inf), any(columns[WIDTH + 5::WIDTH]),
                                    sum(columns[WIDTH + 4::WIDTH]), total)
        return self._summary

    def into(self, acc: Acc, *, average: bool) -> None:
        """The shares after the anchor's row, folded into `acc` in the parts' order (the average's sum adds as the
        fold does: exactly the same number; the kept sum from 0.0 where the fold so far has added nothing)."""
        found = self.summary()
        if found is None:
            return
        acc.observed = min(acc.observed, found.observed)
        acc.worst = max(acc.worst, found.worst)
        acc.lost += found.lost
        if average:
            if acc.total == 0.0 and math.copysign(1.0, acc.total) > 0:
                acc.total = found.total
            else:
                for value in self.columns[WIDTH + 3::WIDTH]:
                    acc.total += value
            acc.counted += found.counted
        else:
            acc.nan = acc.nan or found.nan
            acc.peak = max(acc.peak, found.peak)
        acc.samples = acc.samples or found.samples
        acc.previous, acc.on_sample = self.columns[-1], True


class Summary(NamedTuple):
    """`Stretches.summary`: its shares summed."""

    observed: float
    worst: float
    lost: int
    nan: bool
    peak: float
    samples: bool
    counted: float
    total: float  # the values added one after the other from 0.0
