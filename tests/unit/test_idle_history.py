"""When the history reader queries (descheduler/reclaim/idle_history.py): bounded chunks, rare refreshes, no guess."""

from __future__ import annotations

from typing import Any

import pytest

from common import prometheus, settings, settings_loader, snapshot
from descheduler import cooldowns, policy, reclaim
from descheduler.reclaim import idle_history
from tests import builders

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
    assert (len(before.ended), before.censored) == (16 - 6, ())  # 16 stretches in 4 h, the first 6 not pooled
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

    return snapshot.build(nodes=[builders.gpu_node("n1", gpus=1)],
                          pods=[builders.pod("p", namespace="a", gpus=1, node="n1", phase="Running", mutate=learning,
                                             created="2020-01-01T00:00:00Z")],
                          priority_classes=[builders.priority_class("learning", 1000, annotations=tier)],
                          names=CONFIG.names, taken_at=T0)


@pytest.mark.parametrize(
    ("at_once", "fail_from", "asked", "reason"),
    [
        pytest.param(False, None, 1, "history not read (yet): tier window", id="a-cycle-reads-one-chunk"),
        pytest.param(True, None, 4, "0 idle stretch(es)", id="once-reads-the-whole-look-back-in-one-cycle"),
        pytest.param(True, 2, 2, "history not read (yet): tier window", id="once-stops-at-the-first-failed-read"),
        pytest.param(True, 4, 4, "history not read (yet): tier window", id="boundary-once-last-chunk-fails"),
    ],
)
async def test_at_once_reads_the_look_back_in_the_first_cycle(at_once: bool, fail_from: int | None, asked: int,
                                                              reason: str) -> None:
    """`gpu-steward descheduler --once` has one cycle: it reads the whole look-back then, else no learned window."""
    cluster, fake = learning_cluster(), Fake(fail_from=fail_from)
    learner = idle_history.Learner(config=CONFIG, prometheus=fake, at_once=at_once)
    policies = policy.parse_all(cluster.priority_classes, default_threshold_percent=5.0)
    screened = reclaim.screen_all(cluster, policies=policies, state=cooldowns.State(), config=CONFIG, now=T0)
    _, reasons = await learner.screen(cluster, screened, policies=policies, state=cooldowns.State(), now=T0)
    assert len(fake.asked) == asked
    assert reasons["a/p"].startswith(reason)


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
