"""The pure scoring of the reclaim-quality benchmark: reclaimable idle time, regret, missing data, baselines.

Slots are 60 s apart here (the real trace's are 57 s) so that the arithmetic reads easily.
"""

from __future__ import annotations

import pytest

from benchmarks import reclaim_trace as rt
from common import settings

STEP = 60.0
YARDSTICK = rt.Yardstick(step=STEP, max_silence_seconds=180.0, min_coverage=0.9)
IDLE, BUSY = 0.0, 30.0


def pod(samples: dict[int, float], name: str = "p") -> rt.PodTrace:
    return rt.pod_trace(name, samples)


def run(first: int, last: int, value: float = IDLE) -> dict[int, float]:
    return dict.fromkeys(range(first, last + 1), value)


def rule(window: int, *, toleration: int = 0, kind: rt.Kind = "gpu-steward", threshold: float = 5.0) -> rt.Policy:
    return rt.Policy("test", kind, window, threshold, toleration)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param(run(0, 29), [(0, 29)], id="one-stretch"),
        pytest.param({**run(0, 29), 10: BUSY}, [(0, 9), (11, 29)], id="busy-sample-splits"),
        pytest.param({**run(0, 9), **run(14, 29)}, [(0, 9), (14, 29)], id="silence-over-180s-splits"),
        pytest.param({**run(0, 9), **run(12, 29)}, [(0, 29)], id="two-missing-samples-do-not-split"),
        pytest.param({**run(0, 4, BUSY), **run(5, 9), 10: 5.0}, [(5, 9)], id="five-percent-is-busy"),
        pytest.param(run(0, 9, BUSY), [], id="never-idle"),
    ],
)
def test_stretches(samples: dict[int, float], expected: list[tuple[int, int]]) -> None:
    found = rt.stretches(pod(samples), yardstick=YARDSTICK)
    assert [(s[0], s[-1]) for s in found] == expected


@pytest.mark.parametrize(
    ("samples", "policy", "expected"),
    [
        # earliest eviction at 600 s: the window then holds only idle samples; GPU time after it counts
        pytest.param(run(0, 29), rule(600), set(range(11, 30)), id="after-the-window"),
        pytest.param(run(0, 29), rule(600, toleration=900), set(range(16, 30)), id="toleration-longer"),
        pytest.param({**run(0, 29), 10: BUSY}, rule(300), set(range(6, 10)) | set(range(17, 30)),
                     id="each-stretch-waits-its-window"),
        pytest.param({**run(0, 5, BUSY), **run(6, 12)}, rule(600), set(), id="stretch-shorter-than-window"),
        pytest.param({**run(0, 9), **run(14, 29)}, rule(300), set(range(6, 10)) | set(range(20, 30)),
                     id="silence-restarts-the-window"),
        pytest.param(run(5, 20), rule(0), set(range(6, 21)), id="instant-pod-started-late"),
    ],
)
def test_reclaimable(samples: dict[int, float], policy: rt.Policy, expected: set[int]) -> None:
    assert rt.reclaimable(pod(samples), policy, yardstick=YARDSTICK) == expected


@pytest.mark.parametrize(
    ("samples", "slot", "window", "reason"),
    [
        pytest.param(run(0, 29), 20, 600, None, id="full-window"),
        pytest.param(run(0, 20), 20, 0, None, id="instant-fresh"),
        pytest.param(run(0, 18), 20, 600, None, id="ninety-percent-coverage-suffices"),
        pytest.param({**run(0, 9), **run(20, 29)}, 25, 600, "6 of 10.0 samples in 600s", id="too-few-samples"),
        pytest.param(run(0, 16), 20, 600, "newest sample 240s old", id="stale"),
        pytest.param(run(0, 16), 20, 0, "newest sample 240s old", id="instant-stale"),
        pytest.param(run(0, 17), 20, 0, None, id="three-minutes-old-is-fresh"),
        pytest.param(run(30, 40), 20, 600, "no sample yet", id="before-first-sample"),
    ],
)
def test_missing_data(samples: dict[int, float], slot: int, window: int, reason: str | None) -> None:
    assert rt.missing_data(pod(samples), slot, window_seconds=window, yardstick=YARDSTICK) == reason


def test_aftermath_counts_the_rest_of_the_pods_life() -> None:
    after = rt.aftermath(pod({**run(0, 29), 20: BUSY, 25: BUSY}), 12, step=STEP)
    assert after == rt.Aftermath(idle=frozenset(set(range(13, 30)) - {20, 25}), busy=2, busy_after_seconds=480.0)


@pytest.mark.parametrize(
    ("evictions", "regretted", "missing", "reclaimed_slots", "idle_slots", "busy_slots"),
    [
        pytest.param([], 0, 0, 0, 0, 0, id="no-eviction"),
        # reclaimable: 6..19 (first stretch after 300 s) and 27..29 (21 + 5 slots) = 17 slots
        pytest.param([rt.Eviction("p", 12, "why")], 1, 0, 7 + 3, 16, 1, id="busy-8-min-later-regretted"),
        pytest.param([rt.Eviction("p", 5, "why")], 0, 0, 14 + 3, 23, 1, id="busy-15-min-later-fine"),
        pytest.param([rt.Eviction("p", 2, "why")], 0, 1, 14 + 3, 26, 1, id="decided-on-missing-data"),
    ],
)
def test_score(
    evictions: list[rt.Eviction], regretted: int, missing: int, reclaimed_slots: int, idle_slots: int,
    busy_slots: int,
) -> None:
    trace = rt.Trace(step=STEP, slots=30, pods={"p": pod({**run(0, 29), 20: BUSY})})
    result = rt.score(trace, rule(300), evictions, yardstick=YARDSTICK)
    assert (result.evictions, result.regretted, result.missing_data) == (len(evictions), regretted, missing)
    assert result.reclaimable_hours == pytest.approx(17 / 60)
    assert result.reclaimed_hours == pytest.approx(reclaimed_slots / 60)
    assert result.idle_reclaimed_hours == pytest.approx(idle_slots / 60)
    assert result.busy_lost_hours == pytest.approx(busy_slots / 60)
    assert [d["regretted"] for d in result.details] == [bool(regretted)] * len(evictions)


def test_missing_data_reason_is_kept_per_eviction() -> None:
    trace = rt.Trace(step=STEP, slots=30, pods={"p": pod({**run(0, 9), **run(20, 29)})})
    result = rt.score(trace, rule(600), [rt.Eviction("p", 25, "plugin read no data as 0")], yardstick=YARDSTICK)
    assert result.details[0]["missing_data"] == "6 of 10.0 samples in 600s"
    assert result.details[0]["reason"] == "plugin read no data as 0"


@pytest.mark.parametrize(
    ("reclaimed", "regretted", "missing", "goals"),
    [
        pytest.param(0.8, 1, 0, {"reclaimed_share": True, "regretted_share": True, "missing_data": True},
                     id="all-met-at-the-bounds"),
        pytest.param(0.79, 1, 0, {"reclaimed_share": False, "regretted_share": True, "missing_data": True},
                     id="too-little-reclaimed"),
        pytest.param(0.9, 2, 0, {"reclaimed_share": True, "regretted_share": False, "missing_data": True},
                     id="too-much-regret"),
        pytest.param(0.9, 0, 1, {"reclaimed_share": True, "regretted_share": True, "missing_data": False},
                     id="missing-data"),
    ],
)
def test_goals(reclaimed: float, regretted: int, missing: int, goals: dict[str, bool]) -> None:
    result = rt.Score(evictions=20, regretted=regretted, missing_data=missing, reclaimable_hours=10.0,
                      reclaimed_hours=reclaimed * 10, idle_reclaimed_hours=0, busy_lost_hours=0, details=())
    assert result.goals() == goals


@pytest.mark.parametrize(
    ("average", "threshold", "idle"),
    [
        pytest.param(None, 5.0, True, id="no-data-read-as-zero"),
        pytest.param(float("nan"), 5.0, True, id="nan-read-as-zero"),
        pytest.param(5.0, 5.0, True, id="at-threshold-idle"),
        pytest.param(5.1, 5.0, False, id="above-threshold-busy"),
    ],
)
def test_plugin_semantics(average: float | None, threshold: float, idle: bool) -> None:
    assert rt.plugin_idle(average, threshold_percent=threshold) is idle


@pytest.mark.parametrize(
    ("value", "idle"),
    [
        pytest.param(None, False, id="no-sample-no-judgement"),
        pytest.param(float("nan"), False, id="nan-no-judgement"),
        pytest.param(4.9, True, id="below"),
        pytest.param(5.0, False, id="at-threshold-busy"),
    ],
)
def test_instant_threshold(value: float | None, idle: bool) -> None:
    assert rt.instant_idle(value, threshold_percent=5.0) is idle


@pytest.mark.parametrize(
    ("policy", "age", "judged"),
    [
        pytest.param(rule(600, toleration=300), 599, False, id="inside-window"),
        pytest.param(rule(600, toleration=300), 600, True, id="window-passed"),
        pytest.param(rule(600, toleration=900), 899, False, id="inside-toleration"),
        pytest.param(rule(0, toleration=0, kind="instant"), 0, True, id="instant-no-toleration"),
    ],
)
def test_judged(policy: rt.Policy, age: float, judged: bool) -> None:
    assert rt.judged(scheduled=1000.0, now=1000.0 + age, policy=policy) is judged


def test_chart_tiers_skip_classes_without_a_window() -> None:
    values = {"priorityClasses": {
        "critical": {"reclaim": {}},
        "normal": {"reclaim": {"resource-idle-seconds": 3600, "resource-idle-usage-threshold": 5,
                               "toleration-seconds": 1800}},
        "scavenger": {"reclaim": {"resource-idle-seconds": 600}},
        "prefix": "not-a-tier",
    }}
    assert rt.chart_tiers(values) == [
        rt.Policy("normal (chart default)", "gpu-steward", 3600, 5.0, 1800, tier="normal"),
        rt.Policy("scavenger (chart default)", "gpu-steward", 600, rt.IDLE_PERCENT, 0, tier="scavenger"),
    ]


def test_distinct_keeps_the_chart_name_over_an_equal_sweep_point() -> None:
    tier = rt.Policy("normal (chart default)", "gpu-steward", 3600, 5.0, 1800, tier="normal")
    kept = rt.distinct([tier, *rt.sweep([600, 3600], [5.0]), *rt.baselines([tier])])
    assert [p.name for p in kept] == [
        "normal (chart default)", "window 600s, <5%", "plugin semantics, normal tier", "instant <5%, normal tier",
        "no reclaim",
    ]


def test_parse_trace_grid_selection_and_names() -> None:
    start, step = 1_662_858_720.0, 57.0
    rows = [(start + k * step, 1.0, "bbbbbbbbbbbb-second") for k in (0, 1, 2, 5)]
    rows += [(start + k * step, 9.0, "aaaaaaaaaaaa-first") for k in range(0, 100)]
    whole = rt.parse_trace(rows, pods=None, hours=None)
    assert (whole.step, whole.slots, sorted(whole.pods)) == (step, 100, ["sd-aaaaaaaaaa", "sd-bbbbbbbbbb"])
    assert whole.pods["sd-bbbbbbbbbb"].slots == (0, 1, 2, 5)
    cut = rt.parse_trace(rows, pods=1, hours=step * 10 / 3600)
    assert (cut.slots, list(cut.pods)) == (10, ["sd-aaaaaaaaaa"])


def test_replayed_cluster_gives_an_evicted_pods_gpu_to_the_preemptor() -> None:
    trace = rt.Trace(step=STEP, slots=30, pods={"a": pod(run(0, 29), "a"), "b": pod(run(0, 10), "b"),
                                                "c": pod(run(0, 29), "c")})
    replay = rt.Replay(trace, wall=1_800_000_000.0)
    replay.evicted["c"] = 5
    config = settings.Settings()
    cluster = replay.cluster(20, rule=rule(600), pending=2, config=config)
    assert sorted(cluster.pods) == ["genai/a", "genai/took-c", "genai/want-0", "genai/want-1"]  # b has ended
    assert cluster.pods["genai/took-c"].node_name == "gpu-c"
    assert cluster.priority_classes[rt.VICTIM_CLASS].annotations == {
        "reclaim-idle-resource.scheduling.x-k8s.io/resource-idle-seconds": "600",
        "reclaim-idle-resource.scheduling.x-k8s.io/resource-idle-usage-threshold": "5",
        "reclaim-idle-resource.scheduling.x-k8s.io/toleration-seconds": "0",
    }


@pytest.mark.parametrize(
    ("samples", "idle_slots"),
    [
        pytest.param({**run(0, 3, BUSY), **run(4, 9)}, 6, id="idle-after-the-last-busy-sample"),
        pytest.param({**run(0, 2), **run(3, 3, BUSY), **run(4, 5), **run(6, 6, BUSY), **run(7, 8)}, 2,
                     id="idle-between-bursts-is-not-regret-free"),
        pytest.param(run(0, 4), 5, id="never-busy-from-its-first-sample"),
        pytest.param(run(0, 4, BUSY), 0, id="busy-to-the-end"),
    ],
)
def test_clairvoyant_regret_free_reclaim(samples: dict[int, float], idle_slots: int) -> None:
    trace = rt.Trace(step=STEP, slots=max(samples) + 1, pods={"p": pod(samples)})
    assert rt.clairvoyant_hours(trace) == pytest.approx(idle_slots * STEP / 3600)


@pytest.mark.parametrize(
    ("samples", "since", "idle_slots"),
    [
        pytest.param({**run(0, 3, BUSY), **run(4, 9)}, 6, 4, id="split-after-the-last-busy-sample"),
        pytest.param({**run(0, 3, BUSY), **run(4, 9)}, 4, 6, id="split-at-the-first-idle-sample"),
        pytest.param({**run(0, 3, BUSY), **run(4, 9)}, 3, 6, id="split-before-the-last-busy-sample"),
        pytest.param(run(0, 4), 5, 0, id="pod-ended-before-the-split"),
    ],
)
def test_clairvoyant_judged_from_a_split(samples: dict[int, float], since: int, idle_slots: int) -> None:
    trace = rt.Trace(step=STEP, slots=max(samples) + 1, pods={"p": pod(samples)})
    assert rt.clairvoyant_hours(trace, since=since) == pytest.approx(idle_slots * STEP / 3600)


def test_score_from_a_split_and_at_a_learned_window() -> None:
    trace = rt.Trace(step=STEP, slots=30, pods={"p": pod({**run(0, 29), 20: BUSY})})
    # reclaimable with a 300 s window: 6..19 and 27..29; from slot 10 on: 10..19 and 27..29
    split = rt.score(trace, rule(300), [rt.Eviction("p", 12, "why")], yardstick=YARDSTICK, since=10)
    assert split.reclaimable_hours == pytest.approx(13 / 60)
    assert split.reclaimed_hours == pytest.approx(10 / 60)
    # judged over a learned 300 s window, not the tier's 1800 s: no missing data at slot 12
    learned = rt.score(trace, rule(1800), [rt.Eviction("p", 12, "why", 300)], yardstick=YARDSTICK)
    tier = rt.score(trace, rule(1800), [rt.Eviction("p", 12, "why")], yardstick=YARDSTICK)
    assert (learned.missing_data, tier.missing_data) == (0, 1)


def test_learned_arms_and_their_class() -> None:
    tiers = [rt.Policy("normal (chart default)", "gpu-steward", 10800, 5.0, 1800, tier="normal"),
             rt.Policy("scavenger (chart default)", "gpu-steward", 600, 5.0, 300, tier="scavenger")]
    [arm] = rt.learned_arms(tiers, floor_seconds=1800)  # scavenger's 600 s is below the floor: nothing to learn
    assert (arm.name, arm.window_seconds, arm.learned) == ("normal tier, learned window", 10800, True)
    assert rt.learned_arms(tiers, floor_seconds=10800) == []  # boundary: a window at the floor learns nothing
    assert rt.class_annotations(arm)["gpu-steward.io/learned-idle-window"] == "true"
    assert "gpu-steward.io/learned-idle-window" not in rt.class_annotations(tiers[0])
    assert [p.name for p in rt.distinct([tiers[0], arm])] == ["normal (chart default)", "normal tier, learned window"]
    assert rt.judged_as(arm, floor_seconds=1800).window_seconds == 1800  # reclaimable from the floor on
    assert rt.judged_as(tiers[0], floor_seconds=1800) == tiers[0]


@pytest.mark.parametrize(
    ("phase", "phases", "offset"),
    [
        pytest.param(0, 1, 0.0, id="default-on-a-step"),
        pytest.param(1, 5, 60.0, id="a-fifth-of-a-step"),
        pytest.param(4, 5, 240.0, id="boundary-last-phase"),
        pytest.param(1, 2, 150.0, id="half-a-step"),
    ],
)
def test_wall_of_fixes_the_offset_against_the_history_steps(phase: int, phases: int, offset: float) -> None:
    span = 22.8 * 3600
    for now in (1_800_000_000.0, 1_800_000_123.4):  # whatever the clock reads
        wall = rt.wall_of(now, span=span, step=300.0, phase=phase, phases=phases)
        assert wall % 300.0 == pytest.approx(offset)
        assert now - 600.0 < wall + span < now  # the trace ends within two steps before now, never after


@pytest.mark.parametrize(("phase", "phases"), [pytest.param(5, 5, id="boundary-phase-n"),
                                               pytest.param(-1, 5, id="negative")])
def test_wall_of_refuses_a_phase_outside_0_to_n(phase: int, phases: int) -> None:
    with pytest.raises(ValueError, match=f"phase {phase} is not one of 0..4"):
        rt.wall_of(1_800_000_000.0, span=3600.0, step=300.0, phase=phase, phases=phases)


def test_totals_sum_counts_and_average_shares_over_phases() -> None:
    def result(evictions: int, regretted: int, missing: int, hours: float, share: float | None) -> dict[str, object]:
        return {"policies": [{"policy": {"name": "a"}, "evictions": evictions, "regretted": regretted,
                              "missing_data_evictions": missing, "reclaimed_gpu_hours": hours,
                              "of_clairvoyant": share}]}

    [row] = rt.totals([result(40, 1, 0, 60.0, 0.4), result(50, 4, 1, 90.0, 0.6)])
    assert (row["evictions"], row["regretted"], row["regretted_share"], row["missing_data_evictions"]) == (
        90, 5, round(5 / 90, 4), 1)
    assert (row["reclaimed_gpu_hours"], row["of_clairvoyant"], row["of_clairvoyant_range"]) == (75.0, 0.5, [0.4, 0.6])
    assert [p["regretted"] for p in row["per_phase"]] == [1, 4]
    [none] = rt.totals([result(0, 0, 0, 0.0, None)])
    assert (none["regretted_share"], none["of_clairvoyant"], none["of_clairvoyant_range"]) == (0.0, None, None)
