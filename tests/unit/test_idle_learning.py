"""Idle windows learned per workload (descheduler/reclaim/idle_learning.py): match, no-match, boundary per rule."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence

import hypothesis
import pytest
from hypothesis import strategies as st

from common import settings, snapshot, snapshot_build
from descheduler.reclaim import idle_learning
from tests import builders

STEP = 300.0
IDLE, BUSY, NAN = 0.0, 50.0, float("nan")
CONFIG = settings.LearnedWindow()  # p 5 % within 10 min, 20 at risk, floor 1800 s, 6 stretches, 600-s buckets
TIER = 10800


def points(values: Sequence[float | None], *, start: float = 0.0) -> list[tuple[float, float]]:
    """One point per step; None: no point at that step (a gap in the data)."""
    return [(start + i * STEP, v) for i, v in enumerate(values) if v is not None]


def fold(values: Sequence[float | None], *, threshold: float = 5.0) -> idle_learning.History:
    return idle_learning.fold(idle_learning.History(), points(values), step_seconds=STEP, threshold_percent=threshold)


@pytest.mark.parametrize(
    ("values", "stretches", "open_steps"),
    [
        pytest.param([BUSY, IDLE, IDLE, BUSY], [(900.0, 600.0)], 0, id="stretch-ended-in-work-counts"),
        pytest.param([BUSY, IDLE, IDLE], [], 2, id="still-idle-is-no-stretch-yet"),
        pytest.param([BUSY, IDLE, IDLE, None, BUSY], [], 0, id="gap-ends-the-run-not-work"),
        pytest.param([BUSY, IDLE, NAN, BUSY], [], 0, id="nan-step-is-a-gap-never-idle"),
        pytest.param([BUSY, IDLE, IDLE, NAN], [], 0, id="nan-at-the-end-leaves-no-open-run"),
        pytest.param([BUSY, IDLE, NAN, BUSY, IDLE, BUSY], [(1500.0, 300.0)], 0, id="folding-goes-on-after-nan"),
        pytest.param([IDLE, None, IDLE, BUSY], [(900.0, 300.0)], 0, id="only-the-idle-after-a-gap-counts"),
        pytest.param([IDLE, IDLE, BUSY], [(600.0, 600.0)], 0, id="idle-from-the-first-step-counts"),
        pytest.param([BUSY, IDLE, BUSY, IDLE, IDLE, IDLE, BUSY], [(600.0, 300.0), (1800.0, 900.0)], 0,
                     id="two-stretches"),
        pytest.param([BUSY, 4.99, 5.0], [(600.0, 300.0)], 0, id="threshold-boundary-is-busy"),
        pytest.param([BUSY, 5.0, 5.0, BUSY], [], 0, id="at-threshold-is-not-idle"),
        # A restart that keeps the series (the pod's GPUs idle while it reloads) is idle time like any.
        pytest.param([BUSY, 0.0, 0.0, 0.0, 80.0], [(1200.0, 900.0)], 0, id="restart-with-data-counts"),
    ],
)
def test_fold(values: list[float | None], stretches: list[tuple[float, float]], open_steps: int) -> None:
    history = fold(values)
    assert list(history.stretches) == stretches
    assert history.run_steps == open_steps
    assert (history.run_start is not None) is (open_steps > 0)


def nan_none(pairs: Sequence[tuple[float, float]]) -> list[tuple[float, float | None]]:
    return [(a, None if math.isnan(b) else b) for a, b in pairs]


@pytest.mark.parametrize(
    ("values", "cuts", "segments"),
    [
        pytest.param([BUSY, IDLE, IDLE, None, BUSY], [(600.0, 600.0)], [(0.0, 0.0), (1200.0, 1200.0)],
                     id="a-gap-cuts-the-run-and-begins-a-segment"),
        pytest.param([BUSY, IDLE, NAN, BUSY], [(300.0, 300.0)], [(0.0, 0.0), (900.0, 900.0)],
                     id="nan-cuts-the-run"),
        pytest.param([IDLE, None, IDLE, BUSY], [(0.0, 300.0)], [(0.0, None), (600.0, 900.0)],
                     id="a-segment-first-busy-later"),
        pytest.param([BUSY, None, BUSY], [], [(0.0, 0.0), (600.0, 600.0)], id="a-gap-in-work-cuts-no-run"),
        pytest.param([IDLE, IDLE], [], [(0.0, None)], id="still-idle-no-cut-one-segment"),
        pytest.param([BUSY, IDLE, BUSY], [], [(0.0, 0.0)], id="a-stretch-is-no-cut"),
    ],
)
def test_fold_keeps_cuts_and_segments(values: list[float | None], cuts: list[tuple[float, float]],
                                      segments: list[tuple[float, float | None]]) -> None:
    got = fold(values)
    assert (list(got.cuts), nan_none(got.segments)) == (cuts, segments)


def timed(pairs: Sequence[tuple[float, float]]) -> idle_learning.History:
    return idle_learning.fold(idle_learning.History(), pairs, step_seconds=STEP, threshold_percent=5.0)


# Pod "old" worked at 0, idled from 300 to 2400 (8 steps) and its series ended there: evicted while idle.
EVICTED = [(0.0, BUSY), *((300.0 * i, IDLE) for i in range(1, 9))]


@pytest.mark.parametrize(
    ("others", "stretch"),
    [
        # Adversarial first: the eviction's replacement worked 5 min later: the run ended in work then.
        pytest.param({("new", "web"): [(2700.0, BUSY)]}, (2700.0, 2400.0), id="next-pod-works-within-the-horizon"),
        pytest.param({("new", "web"): [(2700.0, IDLE), (3000.0, BUSY)]}, (3000.0, 2700.0),
                     id="boundary-exactly-the-horizon"),
        pytest.param({("new", "web"): [(2700.0, IDLE), (3000.0, IDLE), (3300.0, BUSY)]}, None,
                     id="works-past-the-horizon"),
        pytest.param({("sibling", "web"): [*((300.0 * i, IDLE) for i in range(9)), (2700.0, BUSY)]}, None,
                     id="a-pod-running-before-the-eviction-is-no-next-pod"),
        pytest.param({("new", "other"): [(2700.0, BUSY)]}, None, id="another-workload-s-pod"),
        pytest.param({("new", "web"): [(2100.0, BUSY), (2400.0, BUSY), (2700.0, BUSY)]}, None,
                     id="began-before-the-run-ended"),
        # The pod itself back after a gap (a StatefulSet's pod keeps its name): its cut run resumed.
        pytest.param({"self": [(3000.0, BUSY)]}, (3000.0, 2700.0), id="same-pod-after-a-gap"),
    ],
)
def test_resumed_makes_an_evicted_run_followed_by_work_a_stretch(
    others: dict[object, list[tuple[float, float]]], stretch: tuple[float, float] | None
) -> None:
    own = [*EVICTED, *others.get("self", [])]
    histories: dict[object, idle_learning.History] = {("old", "web"): timed(own)}
    histories.update({key: timed(pairs) for key, pairs in others.items() if key != "self"})
    got = idle_learning.resumed(histories, of=lambda key: key[1], step_seconds=STEP,  # type: ignore[index]
                                horizon_seconds=600.0)
    old = got[("old", "web")]
    assert old.stretches == (() if stretch is None else (stretch,))
    if "self" not in others:  # resumed: no open (censored) run left; else it stays
        assert (old.run_start, old.run_steps) == ((None, 0) if stretch is not None else (300.0, 8))
    assert old.last == histories[("old", "web")].last
    assert all(got[k] is histories[k] for k in histories if k != ("old", "web"))


def test_resumed_keeps_an_open_run_nobody_resumed_beside_a_cut_that_was() -> None:
    """A cut run resumed after its gap, then idle again to the end: the cut is a stretch, the open run stays."""
    own = timed([(0.0, BUSY), (300.0, IDLE), (600.0, IDLE), (1200.0, BUSY), (1500.0, IDLE), (1800.0, IDLE)])
    got = idle_learning.resumed({"p": own}, of=lambda key: key, step_seconds=STEP, horizon_seconds=600.0)["p"]
    assert got.stretches == ((1200.0, 600.0 + 600.0 - STEP),)
    assert (got.run_start, got.run_steps, got.last) == (1500.0, 2, 1800.0)


def test_resumed_looks_at_every_workload_and_at_runs_only() -> None:
    """A workload with no work at all comes first (it is skipped, not the end); a pod whose series ended busy has
    no run to resume, whatever its next pod does."""
    quiet = timed([(0.0, IDLE), (300.0, IDLE)])
    ended_busy = timed([(0.0, BUSY), (300.0, IDLE), (600.0, BUSY)])
    histories = {("a", "quiet"): quiet, ("old", "web"): timed(EVICTED), ("new", "web"): timed([(2700.0, BUSY)]),
                 ("old", "job"): ended_busy, ("new", "job"): timed([(900.0, BUSY)])}
    got = idle_learning.resumed(histories, of=lambda key: key[1], step_seconds=STEP, horizon_seconds=600.0)
    assert got[("old", "web")].stretches == ((2700.0, 2400.0),)
    assert got[("old", "job")] is ended_busy and got[("a", "quiet")] is quiet


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param({"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "a", "uid": "u"},
                                                       {"kind": "Job", "name": "b", "controller": True}]}},
                     idle_learning.Ref("Job", "b", ""), id="the-controller-not-the-first-owner"),
        pytest.param({"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "a", "uid": "u"}]}}, None,
                     id="an-owner-that-is-no-controller"),
        pytest.param({"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "controller": True}]}}, None,
                     id="a-controller-without-a-name"),
        pytest.param({"metadata": {"ownerReferences": [{"name": "a", "controller": True}]}}, None,
                     id="a-controller-without-a-kind"),
        pytest.param({"metadata": ["not", "a", "mapping"]}, None, id="malformed-metadata"),
        pytest.param({"metadata": {"ownerReferences": ["x"]}}, None, id="malformed-reference"),
    ],
)
def test_controller_ref(raw: dict[str, object], expected: idle_learning.Ref | None) -> None:
    assert idle_learning.controller_ref(raw) == expected


@pytest.mark.parametrize(
    ("spacing", "counts"),
    [
        pytest.param(1.0, True, id="next-step-contiguous"),
        pytest.param(idle_learning.GAP_TOLERANCE, True, id="boundary-tolerated-jitter"),
        pytest.param(idle_learning.GAP_TOLERANCE + 0.01, False, id="past-tolerance-is-a-gap"),
    ],
)
def test_fold_gap_tolerance(spacing: float, counts: bool) -> None:
    got = idle_learning.fold(idle_learning.History(), [(0.0, BUSY), (STEP, IDLE), (STEP + spacing * STEP, BUSY)],
                             step_seconds=STEP, threshold_percent=5.0)
    assert bool(got.stretches) is counts


def test_fold_in_chunks_equals_one_fold_and_overlap_folds_once() -> None:
    values = [BUSY, IDLE, IDLE, IDLE, BUSY, IDLE, None, IDLE, IDLE, BUSY, IDLE]
    whole = fold(values)
    every = points(values)
    chunked = idle_learning.History()
    for cut in ((0, 3), (2, 7), (7, 11)):  # overlapping reads
        chunked = idle_learning.fold(chunked, every[cut[0]:cut[1]], step_seconds=STEP, threshold_percent=5.0)
    assert chunked == whole
    assert whole.stretches == ((1200.0, 900.0), (2700.0, 600.0))


@pytest.mark.parametrize(
    ("start", "kept"),
    [
        pytest.param(900.0, 2, id="ended-at-start-kept"),
        pytest.param(901.0, 1, id="ended-before-start-dropped"),
        pytest.param(1500.0, 1, id="boundary-one-dropped-one-ended-at-start-kept"),
    ],
)
def test_since(start: float, kept: int) -> None:
    history = fold([BUSY, IDLE, IDLE, BUSY, IDLE, BUSY])
    assert len(history.since(start).stretches) == kept


EARLIER = 2700.0  # each pooled pod's six earlier stretches: 45 min of whole idle steps, lasting about 50 min


def one(ratio: float, *, ended: bool = True, before: int = 6) -> idle_learning.History:
    """A pod with `before` earlier stretches that ended in work, then one lasting `ratio` x theirs (a multiple of
    0.1: whole steps): ended in work, or still idle (censored)."""
    earlier = tuple((float(i), EARLIER) for i in range(before))
    steps = round(ratio * 10) - 1  # lasting (steps + 1) x 300 s = ratio x 3000 s
    if ended:
        return idle_learning.History(last=99.0, stretches=(*earlier, (98.0, steps * STEP)))
    return idle_learning.History(last=99.0, run_start=50.0, run_steps=steps, stretches=earlier)


@dataclasses.dataclass(frozen=True)
class Pooled:
    """Pods (`one()`) whose last stretch ended in work at each of `ended` x their earlier ones, or is still idle at
    each of `censored` x. Rows hold this, and the test builds the pool (`build()`): a pool built while pytest
    collects would be no test's, and a mutation tool would not run `pool()`'s mutants against the rows."""

    ended: Sequence[float] = ()
    censored: Sequence[float] = ()

    def build(self) -> idle_learning.Pool:
        return idle_learning.pool([*(one(r) for r in self.ended), *(one(r, ended=False) for r in self.censored)],
                                  step_seconds=STEP, min_stretches=6)


def pooled(ended: Sequence[float] = (), censored: Sequence[float] = ()) -> Pooled:
    return Pooled(tuple(ended), tuple(censored))


SAFE = pooled(censored=[10.0] * 20)  # 20 stretches still idle at 10x their pod's longest: none resumed


@pytest.mark.parametrize(
    ("histories", "ended", "censored"),
    [
        pytest.param([one(2.0)], [2.0], [], id="ratio-to-the-longest-earlier-stretch"),
        pytest.param([one(2.0, before=5)], [], [], id="fewer-earlier-than-min-stretches-not-pooled"),
        pytest.param([idle_learning.History(stretches=tuple((float(i), EARLIER) for i in range(7)))], [1.0], [],
                     id="boundary-the-seventh-counts"),
        # Lasting 1500 s (1200 s of whole steps) against 3000 s, then 3000 s against 3000 s (not against 1500 s).
        pytest.param([idle_learning.History(stretches=((0.0, 1200.0), *((float(i), EARLIER) for i in range(1, 6)),
                                                       (6.0, 1200.0), (7.0, 2700.0)))], [0.5, 1.0], [],
                     id="each-against-the-longest-before-it"),
        # A new longest counts from the next stretch on: 3000 s against 1500 s, then 1500 s against 3000 s.
        pytest.param([idle_learning.History(stretches=(*((float(i), 1200.0) for i in range(6)), (6.0, 2700.0),
                                                       (7.0, 1200.0)))], [2.0, 0.5], [],
                     id="a-new-longest-counts-from-the-next-stretch"),
        pytest.param([one(2.0, before=4), one(3.0)], [3.0], [], id="a-short-history-skipped-not-the-rest"),
        pytest.param([one(3.0, ended=False)], [], [3.0], id="open-run-censored"),
        # Still idle for 3000 s, against the longest of all (3000 s, the last), not an earlier one (1500 s).
        pytest.param([idle_learning.History(run_start=50.0, run_steps=9,
                                            stretches=(*((float(i), 1200.0) for i in range(6)), (6.0, 2700.0)))],
                     [2.0], [1.0], id="open-run-against-the-longest-of-all"),
        pytest.param([one(3.0, ended=False, before=5)], [], [], id="open-run-of-a-short-history-not-pooled"),
        pytest.param([fold([BUSY, IDLE, IDLE, BUSY] * 6 + [IDLE, IDLE, NAN])], [], [],
                     id="run-ended-in-a-gap-not-pooled"),
        pytest.param([fold([BUSY, IDLE, IDLE, BUSY] * 6 + [IDLE, IDLE])], [], [1.0], id="boundary-run-still-open"),
    ],
)
def test_pool(histories: list[idle_learning.History], ended: list[float], censored: list[float]) -> None:
    got = idle_learning.pool(histories, step_seconds=STEP, min_stretches=6)
    assert got.ended == pytest.approx(sorted(ended))
    assert got.censored == pytest.approx(sorted(censored))


@pytest.mark.parametrize(
    ("pool", "ratio", "until", "resumed", "at_risk"),
    [
        pytest.param(pooled([2.0, 2.0], [1.5, 1.5, 3.0, 3.0]), 1.0, 1.6, 0.0, 6, id="censored-earlier-is-no-end"),
        # Kaplan-Meier: at 2.0, 4 still at risk (the two censored at 1.5 left), 2 end: half of them (not 2 of 6).
        pytest.param(pooled([2.0, 2.0], [1.5, 1.5, 3.0, 3.0]), 1.0, 2.1, 0.5, 6, id="ends-before-until"),
        pytest.param(pooled([2.0, 2.0], [1.5, 1.5, 3.0, 3.0]), 1.0, 2.0, 0.0, 6, id="boundary-end-at-until-is-after"),
        # Lasted 2.0 and ended at 2.0: work in the very next step.
        pytest.param(pooled([2.0, 2.0], [1.5, 1.5, 3.0, 3.0]), 2.0, 2.5, 0.5, 4, id="boundary-ended-at-the-ratio"),
        pytest.param(pooled([2.0, 2.0], [1.5, 1.5, 3.0, 3.0]), 2.1, 3.1, 0.0, 2, id="after-the-ends"),
        pytest.param(pooled([2.0, 2.0], [1.5, 1.5]), 2.1, 3.0, 1.0, 0, id="none-that-long-is-certain-resumption"),
        pytest.param(pooled(), 1.0, 2.0, 1.0, 0, id="empty-pool"),
        # Kaplan-Meier over two end times: at 2.0, 1 of 5 ends (0.8 left); at 3.0, 2 of the 3 still at risk (the one
        # censored at 2.5 left): 0.8 x 1/3. From 2.1 to 3.1: 1 - (0.8 / 3) / 0.8 = 2/3, not the 2 of 4 that ended.
        pytest.param(pooled([2.0, 3.0, 3.0], [2.5, 4.0]), 2.1, 3.1, 2 / 3, 4, id="product-over-end-times"),
        pytest.param(pooled([2.0, 3.0, 3.0], [2.5, 4.0]), 1.0, 3.1, 1 - 0.8 / 3, 5, id="product-from-the-start"),
        pytest.param(pooled([2.0, 3.0, 3.0], [2.5, 4.0]), 2.0, 3.0, 0.2, 5, id="boundary-between-end-times"),
    ],
)
def test_pool_resumed(pool: Pooled, ratio: float, until: float, resumed: float, at_risk: int) -> None:
    built = pool.build()
    assert built.resumed(ratio, until) == pytest.approx(resumed)
    assert built.at_risk(ratio) == at_risk


@pytest.mark.parametrize(
    ("ratio", "until", "followed"),
    [
        # Ended at 2.0, 3.0, 3.0; still idle at 2.5 and 4.0.
        pytest.param(1.0, 2.4, 5, id="ended-later-or-idle-past-until"),
        pytest.param(1.0, 2.6, 4, id="idle-short-of-until-not-followed"),
        pytest.param(1.0, 2.5, 5, id="boundary-idle-at-until-followed"),
        pytest.param(2.1, 2.6, 3, id="ended-before-ratio-not-counted"),
        pytest.param(2.0, 2.6, 4, id="boundary-ended-at-ratio-counted"),
    ],
)
def test_pool_followed(ratio: float, until: float, followed: int) -> None:
    assert pooled([2.0, 3.0, 3.0], [2.5, 4.0]).build().followed(ratio, until) == followed


# A workload with 10-min stretches of whole idle steps (lasting about 15 min) is judged at 30 min (2.0x, the
# floor), 40 min (2.67x), ..., the next 10 min reaching 0.67x further.
@pytest.mark.parametrize(
    ("stretches", "pool", "config", "window", "learned", "reason"),
    [
        pytest.param(None, SAFE, CONFIG, TIER, False, "history not read (yet): tier window", id="no-history"),
        pytest.param([600.0] * 5, SAFE, CONFIG, TIER, False, "5 idle stretch(es) of this workload ended in work in "
                     "7 d, fewer than 6: tier window", id="too-few-stretches"),
        pytest.param([600.0] * 6, SAFE, CONFIG, 1800, True, "learned idle window 30 min = 2.0x this workload's "
                     "longest idle stretch that ended in work in 7 d (about 15 min, of 6): of the 20 idle stretches "
                     "of all pods that lasted 2.0x their pod's longest, followed to work or to 2.7x, an estimated 0.0% "
                     "ended in work within 10 min, under 5%",
                     id="boundary-just-enough-stretches-learned-at-the-floor"),
        pytest.param([600.0] * 6, pooled(censored=[10.0] * 19), CONFIG, TIER, False, "This workload's longest idle "
                     "stretch that ended in work in 7 d (about 15 min, of 6): at no idle time under the tier window "
                     "did fewer than 5% of at least 20 idle stretches of all pods as long (against their pod's "
                     "longest), followed to work or 10 min further, end in work within 10 min: tier window",
                     id="boundary-too-few-at-risk"),
        # A workload whose stretches lasted 20 min is judged at 30 min = 1.5x, the next 10 min reaching 2.0x. A run
        # still idle short of 2.0x (pods that have just gone quiet) tells nothing of those 10 min: no evidence.
        pytest.param([900.0] * 6, pooled(censored=[2.1] * 19 + [10.0]), CONFIG, 1800, True,
                     "of the 20 idle stretches of all pods that lasted 1.5x their pod's longest, followed to work or "
                     "to 2.0x, an estimated 0.0%", id="still-idle-past-the-horizon-is-followed"),
        pytest.param([900.0] * 6, pooled(censored=[1.9] * 19 + [10.0]), CONFIG, TIER, False, "tier window",
                     id="still-idle-short-of-the-horizon-is-no-evidence"),
        pytest.param([900.0] * 6, pooled(censored=[2.0] * 19 + [10.0]), CONFIG, 1800, True,
                     "of the 20 idle stretches", id="boundary-still-idle-at-the-horizon-is-followed"),
        pytest.param([600.0] * 6, pooled(censored=[10.0] * 19), CONFIG.model_copy(update={"min_at_risk": 19}),
                     1800, True, "of the 19 idle stretches", id="boundary-min-at-risk-met"),
        # 21 lasted 2.0x, one of them ended at 2.5x: 1/21 = 4.8 % resumed before 2.67x.
        pytest.param([600.0] * 6, pooled([2.5], [10.0] * 20), CONFIG, 1800, True, "4.8% ended in work",
                     id="resumed-under-the-probability"),
        pytest.param([600.0] * 6, pooled([2.5], [10.0] * 19), CONFIG, TIER, False, "tier window",
                     id="boundary-resumed-at-the-probability-is-not-under"),
        # 1 of 4 at risk ends in work: exactly 25 %, not under 25 %; at 40 min only 3 are at risk: the tier's.
        pytest.param([600.0] * 6, pooled([2.5], [10.0] * 3),
                     CONFIG.model_copy(update={"resume_probability": 0.25, "min_at_risk": 4}), TIER, False,
                     "tier window", id="boundary-resumed-exactly-at-the-probability-is-not-under"),
        pytest.param([600.0] * 6, pooled([2.5], [10.0] * 4),
                     CONFIG.model_copy(update={"resume_probability": 0.25, "min_at_risk": 4}), 1800, True,
                     "20.0% ended in work", id="resumed-just-under-a-wider-probability"),
        pytest.param([600.0] * 6, pooled([2.5] * 30, [10.0] * 20), CONFIG, 2400, True,
                     "learned idle window 40 min = 2.7x", id="first-qualifying-idle-time-past-the-floor"),
        # The limit as set, not rounded to a whole percent (2.5 %, not 2 %), in both reasons.
        pytest.param([600.0] * 6, pooled([2.5], [10.0] * 40), CONFIG.model_copy(update={"resume_probability": 0.025}),
                     1800, True, "2.4% ended in work within 10 min, under 2.5%", id="limit-with-decimals-said-so"),
        pytest.param([600.0] * 6, pooled([2.5], [2.6] * 38), CONFIG.model_copy(update={"resume_probability": 0.025}),
                     TIER, False, "did fewer than 2.5% of at least 20", id="limit-with-decimals-said-so-tier"),
        pytest.param([600.0] * 6, pooled([2.5] * 30, [10.0] * 20),
                     CONFIG.model_copy(update={"resume_horizon_seconds": 240}), 1800, True, "within 4 min",
                     id="horizon-short-of-the-resumptions"),
        pytest.param([600.0] * 6, SAFE, CONFIG.model_copy(update={"floor_seconds": 1801}), 2400, True,
                     "learned idle window 40 min", id="floor-rounded-up-to-the-bucket"),
        # Windows are whole seconds: a fractional floor and bucket round the window up, never under the floor.
        pytest.param([600.0] * 6, SAFE, CONFIG.model_copy(update={"floor_seconds": 1800.5, "bucket_seconds": 1800.5}),
                     1801, True, "learned idle window 30 min", id="fractional-window-rounded-up-not-under-the-floor"),
        pytest.param([600.0] * 6, SAFE, CONFIG.model_copy(update={"floor_seconds": 1800.0, "bucket_seconds": 1800.0}),
                     1800, True, "learned idle window 30 min", id="boundary-whole-window-kept"),
        pytest.param([600.0] * 5 + [1200.0], SAFE, CONFIG, 1800, True, "1.2x this workload's longest",
                     id="scale-is-the-longest"),
        # Resumptions at every 0.1x up to 3.3x; a workload whose stretches last 50 min (the next 10 min: 0.2x) is
        # safe at 3.4x = 170 min, under the 3-h tier; with resumptions up to 3.5x, only at 180 min: the tier's.
        pytest.param([2700.0] * 6, pooled([k / 10 for k in range(2, 34)] * 5, [100.0] * 20), CONFIG, 10200, True,
                     "learned idle window 2.8 h = 3.4x", id="boundary-just-under-the-tier"),
        pytest.param([2700.0] * 6, pooled([k / 10 for k in range(2, 36)] * 5, [100.0] * 20), CONFIG, TIER, False,
                     "at no idle time under the tier window", id="tier-window-bounds"),
        # A floor at the tier's window (a 10-min scavenger tier under the 30-min floor): learning never shortens it.
        pytest.param([600.0] * 6, SAFE, CONFIG.model_copy(update={"floor_seconds": TIER}), TIER, False,
                     "at no idle time under the tier window", id="boundary-floor-at-the-tier-keeps-the-tier"),
    ],
)
def test_learn(stretches: list[float] | None, pool: Pooled, config: settings.LearnedWindow, window: int,
               learned: bool, reason: str) -> None:
    got = idle_learning.learn(stretches, tier_window=TIER, pool=pool.build(), config=config)
    assert (got.window_seconds, got.learned) == (window, learned)
    assert reason in got.reason


@pytest.mark.parametrize(
    ("share", "said"),
    [
        pytest.param(0.047, "4.7%", id="one-decimal"),
        pytest.param(0.0496, "4.96%", id="boundary-rounds-to-the-limit-more-decimals"),
        pytest.param(0.04996, "4.996%", id="three-decimals"),
        pytest.param(0.0, "0.0%", id="zero"),
        pytest.param(0.049996, "4.9996%", id="four-decimals"),
        pytest.param(0.0499999999, "4.99999999%", id="eight-decimals"),
    ],
)
def test_below(share: float, said: str) -> None:
    assert idle_learning.below(share, 0.05) == said


@pytest.mark.parametrize(
    ("share", "limit", "said"),
    [
        pytest.param(0.4996, 0.5, "49.96%", id="two-digit-percent-rounds-to-the-limit"),
        pytest.param(0.0469, 0.047, "4.69%", id="limit-with-decimals-rounds-to-it"),
        pytest.param(0.0461, 0.047, "4.6%", id="limit-with-decimals-under-it"),
        # 0.07 x 100 is 7.000000000000001 in floating point: 7.0 is not under 7 %.
        pytest.param(0.06999, 0.07, "6.999%", id="limit-float-noise-rounds-to-it"),
        pytest.param(0.0689, 0.07, "6.9%", id="limit-float-noise-under-it"),
    ],
)
def test_below_other_limits(share: float, limit: float, said: str) -> None:
    assert idle_learning.below(share, limit) == said


@pytest.mark.parametrize(
    ("share", "said"),
    [
        pytest.param(0.05, "5%", id="whole-percent"),
        pytest.param(0.025, "2.5%", id="with-decimals"),
        pytest.param(0.07, "7%", id="float-noise-dropped"),
    ],
)
def test_percent(share: float, said: str) -> None:
    assert idle_learning.percent(share) == said


def parsed(raw: dict[str, object]) -> snapshot.Pod:
    built = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=[raw], names=settings.Names(),
                                 taken_at=0.0)
    return next(iter(built.pods.values()))


def owned(name: str, kind: str | None, owner: str = "", uid: str = "", *, class_name: str | None = None
          ) -> snapshot.Pod:
    """A running 1-GPU pod in `default` whose controller is `kind` `owner` (None: a bare pod)."""
    def own(p: dict[str, object]) -> None:
        if kind is not None:
            p["metadata"]["ownerReferences"] = [  # type: ignore[index]
                {"kind": kind, "name": owner, "uid": uid, "controller": True}]
        if class_name:
            p["spec"]["priorityClassName"] = class_name  # type: ignore[index]

    return parsed(builders.pod(name, gpus=1, node="n1", phase="Running", mutate=own))


Ref, Controller, Workload = idle_learning.Ref, idle_learning.Controller, idle_learning.Workload
# ReplicaSets and Jobs as the API server has them: serve's two rollouts, a bare ReplicaSet serve-canary, a CronJob
# serve's run (a Job serve-29400000), a Job train without a CronJob, a ReplicaSet of an Argo Rollout.
CONTROLLERS = {
    ("default", "ReplicaSet", "serve-7d9f8"): Controller("rs-1", Ref("Deployment", "serve", "dep-serve")),
    ("default", "ReplicaSet", "serve-55cc4"): Controller("rs-0", Ref("Deployment", "serve", "dep-serve")),
    ("default", "ReplicaSet", "serve-canary"): Controller("rs-canary", None),
    ("default", "Job", "serve-29400000"): Controller("job-1", Ref("CronJob", "serve", "cron-serve")),
    ("default", "Job", "train"): Controller("job-train", None),
    ("default", "ReplicaSet", "roll-6b8f9"): Controller("rs-roll", Ref("Rollout", "roll", "rollout-roll")),
    ("default", "Job", "db"): Controller("job-db", None),
}
SERVE = Workload("default", "Deployment", "serve", "dep-serve")


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        # Adversarial first: names that a pattern on `serve-` would take for Deployment serve's pods.
        pytest.param(owned("serve-cache-0", "StatefulSet", "serve-cache", "sts-1"),
                     Workload("default", "StatefulSet", "serve-cache", "sts-1"), id="statefulset-serve-cache"),
        pytest.param(owned("serve-canary-bcdfg", "ReplicaSet", "serve-canary", "rs-canary"),
                     Workload("default", "ReplicaSet", "serve-canary", "rs-canary"), id="bare-replicaset-serve-canary"),
        pytest.param(owned("serve-29400000-bcdfg", "Job", "serve-29400000", "job-1"),
                     Workload("default", "CronJob", "serve", "cron-serve"), id="cronjob-serve-run"),
        pytest.param(owned("serve-7d9f8-bcdfg", "ReplicaSet", "serve-7d9f8", "rs-9"), Workload(
            "default", "pod", "serve-7d9f8-bcdfg", "uid-serve-7d9f8-bcdfg"), id="replicaset-uid-differs-alone"),
        pytest.param(owned("web-7d9f8-bcdfg", "ReplicaSet", "web-7d9f8", "rs-web"),
                     Workload("default", "pod", "web-7d9f8-bcdfg", "uid-web-7d9f8-bcdfg"),
                     id="replicaset-not-read-alone"),
        # Matches.
        pytest.param(owned("serve-7d9f8-bcdfg", "ReplicaSet", "serve-7d9f8", "rs-1"), SERVE, id="deployment"),
        pytest.param(owned("serve-7d9f8-bcdfg", "ReplicaSet", "serve-7d9f8", ""), SERVE,
                     id="reference-without-uid-trusts-the-name"),
        pytest.param(owned("train-0-bcdfg", "Job", "train", "job-train"),
                     Workload("default", "Job", "train", "job-train"), id="job-without-cronjob"),
        pytest.param(owned("roll-6b8f9-bcdfg", "ReplicaSet", "roll-6b8f9", "rs-roll"),
                     Workload("default", "Rollout", "roll", "rollout-roll"), id="replicaset-of-another-controller"),
        pytest.param(owned("notebook", None), Workload("default", "pod", "notebook", "uid-notebook"),
                     id="bare-pod-alone"),
    ],
)
def test_workload_by_owner_references(pod: snapshot.Pod, expected: idle_learning.Workload) -> None:
    assert idle_learning.workload(pod, controllers=CONTROLLERS) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Adversarial first: a StatefulSet's pod beside a Job of its name prefix; suffixes no generateName makes.
        pytest.param("db-0", None, id="statefulset-ordinal-is-no-generated-suffix"),
        pytest.param("serve-7d9f8-aaaaa", None, id="vowels-are-no-generated-suffix"),
        pytest.param("serve-7d9f8-bcdf", None, id="four-characters-are-no-generated-suffix"),
        pytest.param("serve-cache-bcdfg", None, id="no-replicaset-or-job-of-that-name"),
        pytest.param("serve-canary-bcdfg", Workload("default", "ReplicaSet", "serve-canary", "rs-canary"),
                     id="bare-replicaset-is-its-own-workload"),
        pytest.param("serve-29400000-bcdfg", Workload("default", "CronJob", "serve", "cron-serve"),
                     id="cronjob-run"),
        # Matches: a rollout gone before it was seen, an indexed Job's pod.
        pytest.param("serve-55cc4-z2z2z", SERVE, id="older-rollout"),
        pytest.param("train-3-bcdfg", Workload("default", "Job", "train", "job-train"), id="indexed-job"),
    ],
)
def test_series_workload_by_the_controller_that_named_it(name: str, expected: idle_learning.Workload | None) -> None:
    assert idle_learning.series_workload("default", name, controllers=CONTROLLERS) == expected
    assert idle_learning.series_workload("other", name, controllers=CONTROLLERS) is None  # its namespace only


def learning_class(annotations: dict[str, str]) -> snapshot.PriorityClass:
    return snapshot.PriorityClass("normal", 10_000, "PreemptLowerPriority", annotations)


@pytest.mark.parametrize(
    ("annotations", "on", "problem"),
    [
        pytest.param({"gpu-steward.io/learned-idle-window": "true"}, True, None, id="on"),
        pytest.param({"gpu-steward.io/learned-idle-window": " TRUE "}, True, None, id="on-spelling"),
        pytest.param({}, False, None, id="absent-off"),
        pytest.param({"gpu-steward.io/learned-idle-window": "false"}, False, None, id="off"),
        pytest.param({"gpu-steward.io/learned-idle-window": "maybe"}, False, "PriorityClass normal: "
                     "gpu-steward.io/learned-idle-window='maybe' is not true/false; learned idle windows off",
                     id="unreadable-off-with-problem"),
        pytest.param({"example.com/learned-idle-window": "true"}, False, None, id="other-prefix-ignored"),
    ],
)
def test_enabled(annotations: dict[str, str], on: bool, problem: str | None) -> None:
    got = idle_learning.enabled(learning_class(annotations), names=settings.Names())
    assert got.value is on
    assert got.problem == problem


def identity(pods: Sequence[snapshot.Pod]) -> Callable[[tuple[str, str]], object]:
    """The Learner's grouping: live pods by their references, other series by the controller that named them."""
    live = {(p.namespace, p.name): idle_learning.workload(p, controllers=CONTROLLERS) for p in pods}
    return lambda key: live.get(key) or idle_learning.series_workload(*key, controllers=CONTROLLERS) or key


THREE = fold([BUSY] + [IDLE, IDLE, BUSY] * 3)  # three 10-min stretches, ending at 900, 1800, 2700


def test_windows_share_the_workload_history_by_owner_and_respect_the_lookback() -> None:
    """Deployment serve's pod learns from its own series and its older rollout's (6 stretches), never from the
    series of StatefulSet serve-cache, ReplicaSet serve-canary or CronJob serve, whose names begin as its do."""
    serving = owned("serve-7d9f8-bcdfg", "ReplicaSet", "serve-7d9f8", "rs-1", class_name="normal")
    stateful = owned("serve-cache-0", "StatefulSet", "serve-cache", "sts-1", class_name="normal")
    scavenger = owned("batch", None, class_name="scavenger")
    histories = {("default", "serve-7d9f8-bcdfg"): THREE, ("default", "serve-55cc4-z2z2z"): THREE,  # gone replica
                 ("default", "serve-cache-0"): THREE, ("default", "serve-cache-1"): THREE,
                 ("default", "serve-canary-bcdfg"): THREE, ("default", "serve-29400000-bcdfg"): THREE}
    of = identity([serving, stateful, scavenger])
    got = idle_learning.windows([serving, stateful, scavenger], tier_windows={"normal": TIER}, pool=SAFE.build(),
                                histories=histories, of=of, since=900.0, config=CONFIG)
    assert got[serving.key] == idle_learning.Learned(1800, True, got[serving.key].reason)
    assert "of 6)" in got[serving.key].reason
    assert got[stateful.key].reason.startswith("3 idle stretch(es) of this workload")  # its own only: serve-cache-1
    assert scavenger.key not in got  # its class does not learn  # is no pod of it, its ordinal names no generator
    later = idle_learning.windows([serving], tier_windows={"normal": TIER}, pool=SAFE.build(), histories=histories,
                                  of=of, since=901.0, config=CONFIG)
    assert not later[serving.key].learned and "4 idle stretch(es)" in later[serving.key].reason
    nothing = idle_learning.windows([serving], tier_windows={"normal": TIER}, pool=SAFE.build(), histories={},
                                    of=of, since=0.0, config=CONFIG)  # read, but no series of its workload
    assert nothing[serving.key].reason.startswith("0 idle stretch(es) of this workload")
    unread = idle_learning.windows([serving], tier_windows={"normal": TIER}, pool=SAFE.build(), histories=None,
                                   of=of, since=0.0, config=CONFIG)
    assert unread[serving.key] == idle_learning.Learned(TIER, False, "history not read (yet): tier window")


def test_a_pod_whose_replicaset_is_unknown_learns_alone() -> None:
    lone = owned("web-7d9f8-bcdfg", "ReplicaSet", "web-7d9f8", "rs-web", class_name="normal")
    got = idle_learning.windows([lone], tier_windows={"normal": TIER}, pool=SAFE.build(), since=0.0, config=CONFIG,
                                of=identity([lone]), histories={("default", lone.name): THREE,
                                                                ("default", "web-7d9f8-z2z2z"): THREE})
    assert got[lone.key].reason.startswith("3 idle stretch(es) of this workload")  # its own 3, not its sibling's


def test_cronjob_runs_share_a_history_through_the_cronjob() -> None:
    run = owned("serve-29400000-bcdfg", "Job", "serve-29400000", "job-1", class_name="normal")
    earlier = ("default", "serve-29398560-bcdfg")  # an earlier run's pod, seen alive: its Job is gone since
    of = identity([run])
    seen = {earlier: Workload("default", "CronJob", "serve", "cron-serve")}
    got = idle_learning.windows([run], tier_windows={"normal": TIER}, pool=SAFE.build(), since=0.0, config=CONFIG,
                                of=lambda key: seen.get(key) or of(key),
                                histories={("default", run.name): THREE, earlier: THREE})
    assert got[run.key].window_seconds == 1800 and "of 6)" in got[run.key].reason


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        pytest.param(86400 * 7, "7 d", id="whole-days"),
        pytest.param(86400, "1 d", id="boundary-one-day"),
        pytest.param(90000, "25.0 h", id="not-whole-days-in-hours"),
        pytest.param(907200, "252.0 h", id="ten-and-a-half-days-in-hours"),
        pytest.param(7200, "2.0 h", id="boundary-two-hours"),
        pytest.param(7140, "119 min", id="under-two-hours-in-minutes"),
        pytest.param(0, "0 min", id="zero"),
    ],
)
def test_duration(seconds: float, said: str) -> None:
    assert idle_learning.duration(seconds) == said


# --- The compact history is the tuple history it replaced ------------------------------------------


@dataclasses.dataclass(frozen=True)
class TupleHistory:
    """The representation `History` had before its arrays (a tuple of (end, seconds) pairs), with its `fold()`
    and `since()` as they were: the reference the compact one must equal, decision for decision."""

    last: float | None = None
    run_start: float | None = None
    run_steps: int = 0
    stretches: tuple[tuple[float, float], ...] = ()

    def since(self, start: float) -> TupleHistory:
        kept = tuple(s for s in self.stretches if s[0] >= start)
        return self if len(kept) == len(self.stretches) else dataclasses.replace(self, stretches=kept)

    def fold(self, points: Sequence[tuple[float, float]], *, threshold: float) -> TupleHistory:
        last, start, steps, stretches = self.last, self.run_start, self.run_steps, list(self.stretches)
        for t, value in points:
            if last is not None and t <= last:
                continue
            if math.isnan(value):
                start, steps = None, 0
                continue
            if last is not None and t - last > idle_learning.GAP_TOLERANCE * STEP:
                start, steps = None, 0
            if value < threshold:
                if start is None:
                    start, steps = t, 0
                steps += 1
            elif start is not None:
                stretches.append((t, steps * STEP))
                start, steps = None, 0
            last = t
        return TupleHistory(last, start, steps, tuple(stretches))


@st.composite
def series(draw: st.DrawFn) -> tuple[list[tuple[float, float]], list[int], float]:
    """A pod's points (idle, busy, NaN, missing or jittered steps), where its reads are cut, and a look-back's
    start."""
    values = draw(st.lists(st.sampled_from([IDLE, IDLE, IDLE, 4.99, 5.0, BUSY, BUSY, NAN, None]), max_size=120))
    jitter = draw(st.lists(st.sampled_from([0.0] * 8 + [100.0, 500.0]), min_size=len(values), max_size=len(values)))
    at = [(i * STEP + j, v) for i, (v, j) in enumerate(zip(values, jitter, strict=True)) if v is not None]
    cuts = sorted(draw(st.lists(st.integers(0, len(at)), max_size=4)))
    since = draw(st.sampled_from([0.0, 30000.0, *(t for t, _ in at)]))  # a point's time: the boundary
    return at, cuts, since


@hypothesis.settings(max_examples=100, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(st.lists(series(), min_size=1, max_size=12), st.sampled_from([600, 1800, 3600, 10800]))
def test_the_compact_history_decides_as_the_tuple_history(
    pods: list[tuple[list[tuple[float, float]], list[int], float]], tier: int
) -> None:
    """Random pods, folded in random chunks and cut to random look-backs: the same stretches, open runs, pool and
    learned windows (with their reasons) as the representation before (`TupleHistory`)."""
    compact, reference = [], []
    for at, cuts, since in pods:
        new, old = idle_learning.History(), TupleHistory()
        for begin, end in itertools.pairwise([0, *cuts, len(at)]):
            new = idle_learning.fold(new, at[begin:end], step_seconds=STEP, threshold_percent=5.0).since(since)
            old = old.fold(at[begin:end], threshold=5.0).since(since)
        assert (new.last, new.run_start, new.run_steps, new.stretches) == dataclasses.astuple(old)
        compact.append(new)
        reference.append(old)
    config = CONFIG.model_copy(update={"min_stretches": 2, "min_at_risk": 1})
    got = idle_learning.pool(compact, step_seconds=STEP, min_stretches=2)
    expected = idle_learning.pool([idle_learning.History(h.last, h.run_start, h.run_steps, h.stretches)
                                   for h in reference], step_seconds=STEP, min_stretches=2)
    assert got == expected
    for new, old in zip(compact, reference, strict=True):
        stretches = idle_learning.stretches_of([new], since=3000.0)
        assert stretches == [s for end, s in old.stretches if end >= 3000.0]
        assert idle_learning.learn(stretches, tier_window=tier, pool=got, config=config) == idle_learning.learn(
            [s for end, s in old.stretches if end >= 3000.0], tier_window=tier, pool=expected, config=config)


def test_a_history_keeps_what_it_is_made_of_and_a_fold_leaves_it_unchanged() -> None:
    """The arrays are shared between a history and the ones folded from it until a stretch is added: then copied,
    so that a history is never changed once made (an abandoned refresh leaves the learner's as it was)."""
    made = idle_learning.History(last=600.0, run_start=None, run_steps=0, stretches=((600.0, 300.0),))
    assert (made.last, made.stretches) == (600.0, ((600.0, 300.0),))
    folded = idle_learning.fold(made, points([IDLE, IDLE, BUSY], start=900.0), step_seconds=STEP,
                                threshold_percent=5.0)
    assert folded.stretches == ((600.0, 300.0), (1500.0, 600.0))
    assert made == idle_learning.History(last=600.0, stretches=((600.0, 300.0),))  # unchanged
