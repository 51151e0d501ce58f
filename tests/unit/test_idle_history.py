"""When the history reader queries (descheduler/reclaim/idle_history.py): bounded chunks, rare refreshes, no guess."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from common import prometheus, settings, settings_loader, snapshot, snapshot_build, source
from descheduler import cooldowns, evictor, policy, reclaim
from descheduler.reclaim import idle_history
from descheduler.reclaim import loop as reclaim_loop
from tests import builders
from tests.support.prometheus import DcgmStandIn

HOUR = 3600.0
T0 = 1_800_000_000.0  # a multiple of the 300 s step
CONFIG = settings_loader.load(overrides={"descheduler": {"reclaim": {"learned_window": {
    "lookback_seconds": 4 * HOUR, "chunk_seconds": HOUR, "refresh_seconds": 1800}}}})


class Fake:
    def __init__(self, *, fail_from: int | None = None) -> None:
        self.asked: list[tuple[float, float]] = []
        self.fail = False
        self.fail_from = fail_from  # the n-th query (from 1) and every later one fail

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        self.asked.append((start - T0, end - T0))
        if self.fail or (self.fail_from is not None and len(self.asked) >= self.fail_from):
            raise prometheus.PrometheusError("boom")
        return [{"metric": {"namespace": "a", "pod": "p"},
                 "values": [[t, "0"] for t in range(int(start), int(end) + 1, int(step))]}]


async def test_backfill_in_chunks_then_rare_refreshes() -> None:
    fake = Fake()
    learner = idle_history.Learner(config=CONFIG, prometheus=fake)
    for minute in range(0, 5):  # one chunk of an hour per cycle: 4 h of look-back in 4 cycles
        await learner.read(threshold=5.0, now=T0 + 60 * minute)
        assert learner.fresh(T0 + 60 * minute) is (minute >= 3)
    assert fake.asked == [(-4 * HOUR + 300, -3 * HOUR), (-3 * HOUR + 300, -2 * HOUR), (-2 * HOUR + 300, -HOUR),
                          (-HOUR + 300, 0)]
    await learner.read(threshold=5.0, now=T0 + 1800)  # boundary: read exactly refresh_seconds ago, not due
    assert len(fake.asked) == 4 and learner.fresh(T0 + 1800)
    await learner.read(threshold=5.0, now=T0 + 2100)  # due: only the new part
    assert fake.asked[-1] == (300, 2100)


@pytest.mark.parametrize(
    ("change", "reads_again_from"),
    [
        pytest.param({"threshold": 10.0, "now": T0}, -4 * HOUR + 300, id="other-threshold-folds-again"),
        pytest.param({"threshold": 5.0, "now": T0 - 600}, -4 * HOUR - 300, id="clock-went-back-folds-again"),
        pytest.param({"threshold": 5.0, "now": T0 + 300}, None, id="same-threshold-nothing-due"),
    ],
)
async def test_what_restarts_the_fold(change: dict[str, float], reads_again_from: float | None) -> None:
    fake = Fake()
    learner = idle_history.Learner(config=CONFIG.model_copy(update={}), prometheus=fake)
    for _ in range(4):
        await learner.read(threshold=5.0, now=T0)
    asked = len(fake.asked)
    await learner.read(**change)
    assert (fake.asked[-1][0] if len(fake.asked) > asked else None) == reads_again_from


async def test_a_failed_read_is_retried_and_history_goes_stale() -> None:
    fake = Fake()
    learner = idle_history.Learner(config=CONFIG, prometheus=fake)
    for _ in range(4):
        await learner.read(threshold=5.0, now=T0)
    fake.fail = True
    await learner.read(threshold=5.0, now=T0 + 2100)
    assert learner.errors == 1 and learner.fresh(T0 + 2100)  # read 2100 s ago: within refresh + a step
    await learner.read(threshold=5.0, now=T0 + 2400)
    assert learner.errors == 2 and not learner.fresh(T0 + 2400)  # stale: tier windows until a read succeeds
    assert fake.asked[-1] == (300, 2400)  # the same part asked again


class Bursty(Fake):
    """Busy every third 5-min step, idle the two between: a stretch of two steps ends at every busy one."""

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        rows = await super().query_range(promql, start=start, end=end, step=step)
        rows[0]["values"] = [[t, "50" if t // 300 % 3 == 0 else "0"] for t, _ in rows[0]["values"]]
        return rows


async def test_the_pool_is_rebuilt_after_each_read() -> None:
    learner = idle_history.Learner(config=CONFIG, prometheus=Bursty())
    for _ in range(4):
        await learner.read(threshold=5.0, now=T0)
    before = learner.pool
    assert (len(before.ended), len(before.censored)) == (16 - 6, 0)  # 16 stretches in 4 h, the first 6 not pooled
    assert learner.pool is before  # not rebuilt without a read
    await learner.read(threshold=5.0, now=T0 + 2100)  # 7 more steps: 2 stretches in, 2 out of the look-back,
    assert (len(learner.pool.ended), len(learner.pool.censored)) == (10, 1)  # and the last step idle: censored


async def test_until_reads_nothing_after_it() -> None:
    fake = Fake()
    learner = idle_history.Learner(config=CONFIG, prometheus=fake, until=T0 - HOUR)
    for minute in range(5):
        await learner.read(threshold=5.0, now=T0 + 60 * minute)
    assert max(end for _, end in fake.asked) == -HOUR
    assert learner.fresh(T0 + 240)


def test_a_client_without_range_queries_learns_nothing() -> None:
    class InstantOnly:
        async def query(self, promql: str, *, time: float | None = None) -> list[dict[str, Any]]:
            return []

    assert not idle_history.Learner(config=CONFIG, prometheus=InstantOnly()).fresh(T0)


async def test_a_look_back_shorter_than_a_refresh_is_still_read_before_it_counts() -> None:
    fake = Fake()
    short = settings_loader.load(overrides={"descheduler": {"reclaim": {"learned_window": {
        "lookback_seconds": 1800, "chunk_seconds": 1800, "refresh_seconds": 1800}}}})
    learner = idle_history.Learner(config=short, prometheus=fake)
    assert not learner.fresh(T0)
    await learner.read(threshold=5.0, now=T0)
    assert fake.asked == [(-1500, 0)] and learner.fresh(T0)


def learning_cluster() -> snapshot.Snapshot:
    tier = {f"{policy.PREFIX}resource-idle-seconds": "10800", CONFIG.names.learned_idle_window: "true"}

    def learning(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName="learning", priority=1000)

    return snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=1)],
                                pods=[builders.pod("p", namespace="a", gpus=1, node="n1", phase="Running",
                                                   mutate=learning, created="2020-01-01T00:00:00Z")],
                                priority_classes=[builders.priority_class("learning", 1000, annotations=tier)],
                                names=CONFIG.names, taken_at=T0)


async def screen(learner: idle_history.Learner, now: float) -> dict[str, str]:
    """One cycle's screening of `learning_cluster()` by `learner`: each learning pod's reason."""
    cluster = learning_cluster()
    policies = policy.parse_all(cluster.priority_classes, default_threshold_percent=5.0)
    screened = reclaim.screen_all(cluster, policies=policies, state=cooldowns.State(), config=CONFIG, now=now)
    _, reasons = await learner.screen(cluster, screened, policies=policies, state=cooldowns.State(), now=now)
    return reasons


@pytest.mark.parametrize(
    ("mode", "fail_from", "asked", "reason"),
    [
        pytest.param({}, None, 0, "history not read (yet): tier window", id="a-cycle-reads-nothing-itself"),
        pytest.param({"wait": True}, None, 1, "history not read (yet): tier window",
                     id="a-replay-cycle-waits-for-one-chunk"),
        pytest.param({"at_once": True}, None, 4, "0 idle stretch(es)",
                     id="once-reads-the-whole-look-back-in-one-cycle"),
        pytest.param({"at_once": True}, 2, 2, "history not read (yet): tier window",
                     id="once-stops-at-the-first-failed-read"),
        pytest.param({"at_once": True}, 4, 4, "history not read (yet): tier window",
                     id="boundary-once-last-chunk-fails"),
    ],
)
async def test_what_a_cycle_reads_before_its_plan(mode: dict[str, bool], fail_from: int | None, asked: int,
                                                  reason: str) -> None:
    """A cycle reads no history itself (`start()` reads it beside the cycles), except `gpu-steward descheduler
    --once`'s one cycle, which reads the whole look-back before its plan, and a replay in store time (`wait`),
    which reads its chunk first. Neither leaves a refresh running after it."""
    fake = Fake(fail_from=fail_from)
    learner = idle_history.Learner(config=CONFIG, prometheus=fake, **mode)
    reasons = await screen(learner, T0)
    learner.start(now=T0)
    assert len(fake.asked) == asked
    assert reasons["a/p"].startswith(reason)
    assert len(asyncio.all_tasks()) == 1 + (not mode)  # this test, and the refresh started beside the cycle
    await learner.close()


class Gate:
    """Holds a query until `answer` is set (a slow or hung Prometheus); counts the queries cancelled meanwhile."""

    def __init__(self) -> None:
        self.asking = asyncio.Event()
        self.answer = asyncio.Event()
        self.cancelled = 0

    async def held(self) -> None:
        self.asking.set()
        try:
            await self.answer.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


class Held(Fake, Gate):
    """A Prometheus that answers history only once `answer` is set: slow, or hung."""

    def __init__(self) -> None:
        Fake.__init__(self)
        Gate.__init__(self)
        self.broken = False  # answers what the fold cannot read (a bug's stand-in: not a PrometheusError)

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        await self.held()
        if self.broken:
            self.asked.append((start - T0, end - T0))
            return [{"metric": {"namespace": "a", "pod": "p"}, "values": [[None, "0"]]}]
        rows = await super().query_range(promql, start=start, end=end, step=step)
        rows[0]["values"] = [[t, "50" if t // 300 % 3 == 0 else "0"] for t, _ in rows[0]["values"]]  # Bursty
        return rows


FAST = CONFIG.model_copy(update={"prometheus": settings.Prometheus(timeout_seconds=0.05)})


async def learned(fake: Held) -> idle_history.Learner:
    """A learner that read the whole look-back up to T0 (fresh until T0 + 2100 s), `fake` held again."""
    learner = idle_history.Learner(config=FAST, prometheus=fake)
    fake.answer.set()
    for _ in range(4):
        await learner.read(threshold=5.0, now=T0)
    fake.answer.clear()
    fake.asking.clear()
    return learner


@pytest.mark.parametrize(
    ("how", "replaced", "errors"),
    [
        pytest.param("answers", True, 0, id="a-complete-refresh-replaces-the-pool"),
        pytest.param("fails", False, 1, id="a-failed-refresh-keeps-the-previous-pool"),
        pytest.param("hangs", False, 1, id="a-refresh-past-its-timeout-keeps-the-previous-pool"),
        pytest.param("breaks", False, 1, id="a-refresh-that-raises-unexpectedly-keeps-the-previous-pool"),
        pytest.param("cancelled", False, 0, id="a-refresh-cancelled-while-asking-keeps-the-previous-pool"),
    ],
)
async def test_a_refresh_runs_beside_the_cycles_and_replaces_the_pool_only_whole(how: str, replaced: bool,
                                                                                 errors: int) -> None:
    fake = Held()
    learner = await learned(fake)
    before = learner.pool
    now = T0 + 2100  # a refresh is due, the history still fresh
    reasons = await screen(learner, now)
    learner.start(now=now)
    await fake.asking.wait()  # the refresh asks Prometheus, beside the cycles ...
    assert await screen(learner, now) == reasons  # ... and a cycle runs meanwhile, on the previous pool
    assert learner.pool is before
    if how == "cancelled":
        await learner.close()  # shutdown, or leadership lost
        assert fake.cancelled == 1
    else:
        fake.fail = how == "fails"
        fake.broken = how == "breaks"
        if how != "hangs":
            fake.answer.set()
        await learner.settle()
    assert (learner.pool is not before, learner.errors) == (replaced, errors)
    assert learner.fresh(now)  # either way: a refresh that did not complete leaves the history as it was
    fake.fail = fake.broken = False
    fake.answer.set()
    learner.start(now=now)  # the next cycle's refresh reads what was missed
    await learner.settle()
    assert fake.asked[-1] == (300, 2100) and learner.pool is not before


async def test_a_refresh_cancelled_while_folding_keeps_the_previous_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold and the pool run in a worker thread; cancelled meanwhile, their result is never published."""
    fake = Held()
    learner = await learned(fake)
    before = learner.pool
    folding, go_on = threading.Event(), threading.Event()
    real = idle_history._folded

    def held_fold(*args: Any, **kwargs: Any) -> Any:
        folding.set()
        go_on.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(idle_history, "_folded", held_fold)
    await screen(learner, T0 + 2100)
    fake.answer.set()
    learner.start(now=T0 + 2100)
    await asyncio.to_thread(folding.wait)
    closing = asyncio.create_task(learner.close())
    await asyncio.sleep(0)  # the cancellation is delivered to the refresh
    go_on.set()
    await closing
    assert learner.pool is before and learner.errors == 0


class HeldDcgm(DcgmStandIn, Gate):
    """DCGM as the reclaim cycle reads it, the history's range query held until `answer` is set."""

    def __init__(self) -> None:
        DcgmStandIn.__init__(self, {("a", "p", "n1"): 1.0}, now=T0)
        Gate.__init__(self)
        self.history: list[tuple[float, float]] = []

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[prometheus.Series]:
        if " or " in promql:  # the history's (the utilisation parts are range queries too)
            self.history.append((start - T0, end - T0))
            await self.held()
        return await super().query_range(promql, start=start, end=end, step=step)


async def test_leadership_lost_cancels_the_refresh_and_the_next_leader_reads_that_chunk_again() -> None:
    """`ReclaimLoop.run()` is cancelled when this replica stops leading (or shuts down): the refresh it started
    stops with it, nothing of it is kept, and the loop (which lives as long as the process) reads it again."""
    dcgm = HeldDcgm()
    reclaim_ = reclaim_loop.ReclaimLoop(config=CONFIG, cluster=source.StaticSource(learning_cluster()),
                                        prometheus=dcgm, evictions=evictor.DryRunClient(), api=None,
                                        clock=lambda: T0)
    leading = asyncio.create_task(reclaim_.run())
    await dcgm.asking.wait()  # the first cycle is done, its refresh asks beside the next one
    leading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leading
    assert (dcgm.cancelled, reclaim_.learner.queries, reclaim_.learner.fresh(T0)) == (1, 1, False)
    assert len(asyncio.all_tasks()) == 1  # nothing left running
    dcgm.answer.set()
    await reclaim_.cycle()  # leading again
    await reclaim_.learner.settle()
    assert dcgm.history == [(-4 * HOUR + 300, -3 * HOUR)] * 2


@pytest.mark.parametrize(
    ("away", "cycles"),
    [
        # 7 d in 30-min chunks while the look-back's end moves on 60 s a cycle: 604800 / 1740 s, not 336 cycles.
        pytest.param(None, 347, id="cold-start-a-new-leader-5.8-h"),
        pytest.param(20 * 60, 0, id="back-within-refresh-still-fresh"),
        pytest.param(HOUR, 2, id="a-leader-back-after-an-hour-reads-what-it-missed"),
        pytest.param(24 * HOUR, 49, id="a-leader-back-after-a-day"),
    ],
)
async def test_cycles_until_learned_windows_apply_at_the_defaults(away: float | None, cycles: int) -> None:
    """docs/operations.md's numbers: the default settings, one read a 60 s cycle. A replica that leads again keeps
    what it read (the loop and its learner live as long as the process) and reads only the time it was away."""
    config = settings_loader.load()
    interval = config.descheduler.reclaim.interval_seconds
    learner = idle_history.Learner(config=config, prometheus=Fake())
    now = T0
    if away is not None:
        while not learner.fresh(now):
            await learner.read(threshold=5.0, now=now)
            now += interval
        now += away
    count = 0
    while not learner.fresh(now):
        await learner.read(threshold=5.0, now=now)
        now += interval
        count += 1
    assert count == cycles


@pytest.mark.parametrize(
    ("metric", "key"),
    [
        pytest.param({"namespace": "a", "pod": "p"}, ("a", "p"), id="plain"),
        pytest.param({"namespace": "gpu-operator", "pod": "dcgm-x", "exported_namespace": "a", "exported_pod": "p"},
                     ("a", "p"), id="exported-wins-after-a-rename"),
        pytest.param({"namespace": "a", "pod": "p", "exported_pod": ""}, ("a", "p"), id="empty-spelling-ignored"),
        pytest.param({"namespace": "a"}, None, id="no-pod-no-history"),
    ],
)
def test_pod_of(metric: dict[str, str], key: tuple[str, str] | None) -> None:
    assert idle_history.pod_of(metric, labels=settings.PrometheusLabels()) == key


class Reader:
    """ReplicaSets and Jobs as an API server lists them (`idle_history.ControllerReader`); `fail`: it errs."""

    def __init__(self, *, fail: bool = False) -> None:
        self.asked: list[frozenset[str]] = []
        self.fail = fail

    async def __call__(self, namespaces: Any) -> dict[tuple[str, str, str], Any]:
        self.asked.append(frozenset(namespaces))
        if self.fail:
            raise TimeoutError("the API server did not answer within 5s")
        return {}


@pytest.mark.parametrize(
    ("fail", "asked"),
    [
        pytest.param(True, 5, id="a-failed-list-is-retried-at-each-read"),
        pytest.param(False, 2, id="a-list-holds-for-refresh-seconds"),
    ],
)
async def test_replicasets_and_jobs_are_listed_in_the_learning_namespaces_once_per_refresh(
    fail: bool, asked: int, caplog: pytest.LogCaptureFixture
) -> None:
    reader = Reader(fail=fail)
    learner = idle_history.Learner(config=CONFIG, prometheus=Fake(), at_once=True, controllers=reader)
    await screen(learner, T0)  # the whole look-back: 4 chunks, the first lists the controllers (or each tries)
    await learner.read(threshold=5.0, now=T0 + 1500)  # no refresh due: nothing listed
    await learner.read(threshold=5.0, now=T0 + 2100)  # a refresh, refresh_seconds after the list: listed again
    assert reader.asked == [frozenset({"a"})] * asked
    assert ("ReplicaSets and Jobs not read" in caplog.text) is fail
