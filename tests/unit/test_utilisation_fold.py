"""The kept shares of a window's fold (utilisation_fold.Stretches) against the plain fold, part after part.

A reading built from kept shares, cycle after cycle, as the window's start moves (by no part, one or several), parts
turn final, windows of several lengths share a cache and prune drops old parts, must be exactly the reading
`device_reading` folds from scratch over the same parts: on random sample counts, gaps, parts without a last sample,
last samples on a part's start, NaN readings, copies of one GPU, both statistics, ranges closed on the left or not
or not known yet, and a store time that steps back (another replica behind the same address)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from descheduler.reclaim import utilisation_fold as folding
from descheduler.reclaim import utilisation_parts as parts
from descheduler.reclaim import utilisation_window as window

P = 300
GRID = parts.Grid(part=P, settle=120.0, late=900.0, budget=100)
START = 1_800_000_000.0  # on the grid
NAN = math.nan


def _numbers(rng: random.Random, j: int) -> folding.Numbers:
    """A device's numbers in part j: (j P, (j + 1) P]; its last sample on the part's end (the next part's start),
    inside it, missing, or none at all (no sample: the last one from before, or none within the lookback)."""
    end = (j + 1) * P
    n = rng.choice([0.0, 1.0, 2.0, 19.0, 20.0, 20.0, 21.0])
    value = rng.choice([0.0, 0.5, 1.0, 3.0, 40.0, NAN, rng.uniform(0, 7)]) * (n if rng.random() < 0.5 else 1.0)
    n_min = max(0.0, n - rng.choice([0.0, 0.0, 1.0]))
    if n == 0:
        last = rng.choice([NAN, end - P - 15.0, end - P])
        return (0.0, math.inf, NAN, last)
    last = rng.choice([end, end, end - 7.5, end - 15.0, end - 200.0, NAN])
    return (n, n_min, value, last)


def _part(rng: random.Random, j: int, devices: int, *, final: bool) -> parts.Part:
    return parts.Part({i: _numbers(rng, j) for i in range(devices) if rng.random() > 0.05}, final=final)


def _cache(rng: random.Random) -> tuple[parts.Cache, dict[tuple[str, str], str]]:
    """Pods of one to three GPUs on n1; some GPUs scraped twice (one copy without its index)."""
    cache = parts.Cache()
    pods = {}
    for p in range(rng.randrange(1, 5)):
        pods[("ns", f"p{p}")] = "n1"
        for g in range(rng.randrange(1, 4)):
            cache._at(("ns", f"p{p}", "n1", str(g), f"GPU-{p}-{g}", ""))
            if rng.random() < 0.4:
                cache._at(("ns", f"p{p}", "n1", "", f"GPU-{p}-{g}", ""))
    return cache, pods


def _key(reading: folding.DeviceReading) -> tuple[str, ...]:
    return tuple(repr(v) for v in dataclasses.astuple(reading))  # NaN equal to NaN, 0.0 unequal to -0.0


def _from_scratch(cache: parts.Cache, live: parts.Part, judging: window.Judging,
                  pods: dict[tuple[str, str], str]) -> dict[tuple[tuple[str, str], str], tuple[str, ...]]:
    grid = judging.grid
    needed = grid.needed(judging.window, judging.now)
    starts = [j * grid.part for j in needed[1:]] + [grid.live_start(judging.now)]
    out = {}
    for pod in pods:
        identities = {i: cache.keys[i][2:] for i in cache.pods.get(pod, ())}
        for gpu in parts.gpus(identities):
            numbers = [parts.numbers_of(cache.parts.get(j), gpu.copies) for j in needed]
            numbers.append(parts.numbers_of(live, gpu.copies))
            out[pod, gpu.name] = _key(folding.device_reading(numbers, starts, average=judging.average,
                                                           left_closed=judging.left_closed, bound=judging.bound))
    return out


def _run(seed: int) -> int:
    """Cycles over one cache; returns how many readings were compared."""
    rng = random.Random(seed)
    cache, pods = _cache(rng)
    devices = len(cache.keys)
    average, bound = rng.random() < 0.5, rng.choice([1.0, 2.0, 3.5])
    left_closed = rng.choice([None, True, False])
    windows = rng.sample([600.0, 1500.0, 3600.0, 5400.0], k=rng.randrange(1, 3))
    now, compared = START + rng.uniform(0, P), 0
    for _ in range(rng.randrange(3, 14)):
        now += rng.choice([0.0, 60.0, 60.0, 60.0, 240.0, 300.0, 700.0, -360.0])  # back: another replica's time
        longest = GRID.needed(max(windows), now)
        for j in longest:  # final parts stay; the others are read again (their numbers may change)
            if j not in cache.parts or not cache.parts[j].final:
                old = now - (j + 1) * P >= GRID.late
                cache.parts[j] = _part(rng, j, devices, final=old or rng.random() < 0.7)
        live = _part(rng, longest[-1] + 1, devices, final=False)
        for seconds in rng.sample(windows, k=len(windows)):
            judging = window.Judging(seconds, now, GRID, average, bound, left_closed)
            found = window.readings({"gpu": cache}, {"gpu": live}, pods=pods, judging=judging, unread={})
            got = {(pod, name): _key(device) for pod, reading in found.items()
                   for name, device in reading.kinds["gpu"].devices.items()}
            assert got == _from_scratch(cache, live, judging, pods), (seed, seconds, now)
            compared += len(got)
        cache.prune(longest[0])
    return compared


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_kept_shares_read_as_the_fold_from_scratch(seed: int) -> None:
    assert _run(seed) > 0


def test_the_random_cycles_reach_the_cases() -> None:
    """The generator is no straw man: over a few seeds, starts move and shares are kept, dropped and rebuilt."""
    compared = sum(_run(seed) for seed in range(40))
    assert compared > 500


@pytest.mark.parametrize(
    ("before", "first", "expected"),
    [
        # adversarial: the part before the window has samples but no last sample: the fold starts at the window's
        # start, and the first part of the window is the anchor
        pytest.param((20.0, 20.0, 1.0, NAN), (20.0, 20.0, 1.0, 2 * P), 1, id="before-without-last"),
        pytest.param((0.0, math.inf, NAN, P - 15.0), (20.0, 20.0, 1.0, 2 * P), 1, id="before-only-a-lookback-sample"),
        pytest.param((20.0, 20.0, 1.0, P), (20.0, 20.0, 1.0, 2 * P), 0, id="before-is-the-anchor"),
        pytest.param((20.0, 20.0, 1.0, P), (0.0, math.inf, NAN, P), 0, id="before-anchor-then-an-empty-part"),
    ],
)
def test_the_anchor_is_the_first_part_with_samples_and_a_last_sample(before: folding.Numbers, first: folding.Numbers,
                                                                     expected: int) -> None:
    """Kept shares start after the anchor (`Stretches.first`): the part before the window if it anchors, else the
    first window part that does."""
    cache = parts.Cache()
    cache._at(("ns", "p", "n1", "0", "GPU-0", ""))
    cache.parts = {j: parts.Part({0: numbers}, final=True) for j, numbers in ((0, before), (1, first))}
    cache.parts[2] = parts.Part({0: (20.0, 20.0, 1.0, 3 * P)}, final=True)
    judging = window.Judging(700.0, 3 * P + 130.0, GRID, False, 2.0, True)
    needed = GRID.needed(judging.window, judging.now)
    assert list(needed) == [0, 1, 2]
    window._kept(cache, judging, needed, 3, (0,))
    (kept,) = cache.stretches[700.0, False, 2.0, True].values()
    assert (kept.first, kept.end) == (expected, 3)


@pytest.mark.parametrize(
    ("first", "end", "keep_from", "expected"),
    [
        # adversarial: a part read again after prune may differ (late samples): no share may outlive its part
        pytest.param(3, 6, 5, (5, 6), id="older-parts-dropped-the-rest-kept"),
        pytest.param(3, 6, 6, None, id="every-part-dropped"),
        pytest.param(3, 6, 3, (3, 6), id="nothing-dropped-on-the-boundary"),
        pytest.param(3, 6, 2, (3, 6), id="nothing-dropped"),
    ],
)
def test_prune_drops_the_shares_of_dropped_parts(first: int, end: int, keep_from: int,
                                                  expected: tuple[int, int] | None) -> None:
    cache = parts.Cache()
    cache._at(("ns", "p", "n1", "0", "GPU-0", ""))
    stretches = folding.Stretches(first, first * P)
    for j in range(first + 1, end):
        stretches.extend((20.0, 20.0, 1.0, (j + 1) * P), j * P, average=False, left_closed=True, bound=2.0,
                         length=P)
    cache.stretches[3600.0, False, 2.0, True] = {(0,): stretches}
    cache.prune(keep_from)
    kept = cache.stretches.get((3600.0, False, 2.0, True), {}).get((0,))
    assert ((kept.first, kept.end) if kept is not None else None) == expected
