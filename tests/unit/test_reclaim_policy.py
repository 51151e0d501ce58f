"""PriorityClass reclaim annotations -> ReclaimPolicy, with the reason for every verdict."""

from __future__ import annotations

import pytest

from common import snapshot
from descheduler import policy

P = policy.PREFIX


def parse(value: int, annotations: dict[str, str]) -> policy.ReclaimPolicy:
    pc = snapshot.PriorityClass("batch", value, "PreemptLowerPriority", annotations)
    return policy.parse(pc, default_threshold_percent=5.0)


@pytest.mark.parametrize(
    ("annotations", "reclaimable", "minimum", "toleration", "window", "threshold", "reason"),
    [
        pytest.param(
            {f"{P}resource-idle-seconds": "3600", f"{P}resource-idle-usage-threshold": "10"},
            True, 1001, 0, 3600, 10.0, "idle below 10% for 3600s, after 0s, for priority above the pod's own",
            id="resource-names-defaults",
        ),
        pytest.param(
            {f"{P}gpu-idle-seconds": "600", f"{P}gpu-idle-usage-threshold": "2.5"},
            True, 1001, 0, 600, 2.5, "idle below 2.5% for 600s", id="gpu-alias-names",
        ),
        pytest.param(
            {f"{P}gpu-idle-seconds": "600"}, True, 1001, 0, 600, 5.0, "idle below 5% for 600s",
            id="threshold-from-settings-default",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}minimum-preemptable-priority": "500",
             f"{P}toleration-seconds": "120"},
            True, 500, 120, 60, 5.0, "after 120s, for priority >= 500", id="minimum-lower-than-class-value",
        ),
        pytest.param({}, False, 1001, 0, None, 5.0, "sets no idle window", id="no-window-not-reclaimable"),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}toleration-seconds": "-1"},
            False, 1001, -1, 60, 5.0, "tolerates reclaim forever", id="negative-toleration-never",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "an hour"}, False, 1001, 0, None, 5.0,
            "resource-idle-seconds='an hour' is not an integer", id="bad-window",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}minimum-preemptable-priority": "high"},
            False, 1001, 0, None, 5.0, "minimum-preemptable-priority='high' is not an integer", id="bad-minimum",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}resource-idle-usage-threshold": "150"},
            False, 1001, 0, None, 5.0, "'150' is not a percentage in 0..100", id="threshold-out-of-range",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}gpu-idle-usage-threshold": "nan"},
            False, 1001, 0, None, 5.0, "'nan' is not a percentage", id="threshold-nan",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "0"}, False, 1001, 0, None, 5.0,
            "must be a positive number of seconds", id="zero-window",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}gpu-idle-seconds": "120"}, False, 1001, 0, None, 5.0,
            "disagree", id="both-name-sets-disagree",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}gpu-idle-seconds": "60"}, True, 1001, 0, 60, 5.0,
            "for 60s", id="both-name-sets-agree",
        ),
        pytest.param(
            {f"{P}resource-idle-seconds": "60", f"{P}resource-type": "cpu"}, False, 1001, 0, None, 5.0,
            "only 'gpu' is reclaimed", id="other-resource-type",
        ),
    ],
)
def test_parse(
    annotations: dict[str, str],
    reclaimable: bool,
    minimum: int,
    toleration: int,
    window: int | None,
    threshold: float,
    reason: str,
) -> None:
    result = parse(1000, annotations)
    assert (result.reclaimable, result.minimum_for(1000), result.toleration_seconds) == (
        reclaimable, minimum, toleration,
    )
    assert (result.idle_seconds, result.threshold_percent) == (window, threshold)
    assert reason in result.reason


@pytest.mark.parametrize(
    ("annotations", "pod_priority", "minimum"),
    [
        pytest.param({}, 10, 11, id="default-from-the-pod-equal-to-the-class"),
        # The class was re-created with value 10 after the pod was admitted at 1000: the pod's own value counts.
        pytest.param({}, 1000, 1001, id="class-re-created-lower-pod-keeps-its-own"),
        pytest.param({}, 5, 6, id="class-re-created-higher-pod-keeps-its-own"),
        pytest.param({f"{P}minimum-preemptable-priority": "500"}, 1000, 500, id="explicit-minimum-wins"),
        pytest.param({f"{P}minimum-preemptable-priority": "1001"}, 1000, 1001, id="explicit-minimum-at-the-default"),
    ],
)
def test_default_minimum_preemptable_comes_from_the_victims_own_priority(
    annotations: dict[str, str], pod_priority: int, minimum: int
) -> None:
    found = parse(10, {f"{P}resource-idle-seconds": "60", **annotations})
    assert found.minimum_for(pod_priority) == minimum
    assert ("for priority above the pod's own" in found.reason) == (not annotations)


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        pytest.param({f"{P}toleration-seconds": "soon"}, "toleration-seconds='soon' is not an integer", id="bad"),
        pytest.param({f"{P}resource-idle-seconds": "60"}, None, id="good"),
        pytest.param({}, None, id="no-policy-is-no-problem"),
    ],
)
def test_problem_is_reported_only_for_bad_values(annotations: dict[str, str], problem: str | None) -> None:
    assert parse(1000, annotations).problem == (problem and f"{P}{problem}")


@pytest.mark.parametrize(
    ("class_name", "expected"),
    [
        pytest.param(None, "no priorityClassName, so no reclaim policy", id="no-class"),
        pytest.param("missing", "PriorityClass missing not found", id="unknown-class"),
        pytest.param("batch", "batch", id="known-class"),
    ],
)
def test_for_pod(class_name: str | None, expected: str) -> None:
    pod = snapshot.Pod(
        "ns", "p", "u", "n1", "Running", snapshot.gpu.GpuRequest(full=1), 0, class_name, "PreemptLowerPriority",
        {}, {}, None, None, "", (), False, "default-scheduler", {},
    )
    found = policy.for_pod(pod, {"batch": parse(1000, {})})
    assert (found if isinstance(found, str) else found.class_name) == expected
