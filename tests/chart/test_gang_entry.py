"""The webhook's two entries: gang members the webhook gates fail closed, every other pod fails open, and no pod
is sent to both (the real API server's verdicts: tests/e2e/test_chart_e2e.py)."""

from __future__ import annotations

from typing import Any

import pytest

from common import gangs, settings
from tests.chart import helm

NAMESPACE = "gpu-steward"
GANG_ENTRY = "gang-members-wait-for-the-gpu-steward-webhook-retry-when-up.gpu-steward.io"


def _entries(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    objects = helm.template(values, namespace=NAMESPACE)
    (configuration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    entries: list[dict[str, Any]] = configuration["webhooks"]
    return entries


def _conditions(entry: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: " ".join(c["expression"].split()) for c in entry.get("matchConditions") or []}


def test_gang_members_fail_closed_and_every_other_pod_fails_open() -> None:
    pods, members = _entries()
    assert (pods["name"], pods["failurePolicy"]) == ("pods.gpu-steward.io", "Ignore")
    assert (members["name"], members["failurePolicy"]) == (GANG_ENTRY, "Fail")
    gang = _conditions(members)["gated-gang-member"]
    # The first entry takes exactly the pods the second does not: never both, never neither (for GPU/gang pods).
    first = _conditions(pods)
    assert list(first) == ["gpu-or-gang", "not-a-gated-gang-member"]
    assert first["not-a-gated-gang-member"].replace(" ", "") == f"!({gang})".replace(" ", "")
    # The same server, scope and exclusions: the webhook's own namespace and kube-system never reach either.
    for key in ("clientConfig", "rules", "namespaceSelector", "objectSelector", "timeoutSeconds",
                "reinvocationPolicy", "sideEffects", "admissionReviewVersions", "matchPolicy"):
        assert pods[key] == members[key], key
    assert members["namespaceSelector"]["matchExpressions"][0] == {
        "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}


def test_the_gang_condition_names_the_conventions_admission_gates_and_only_those() -> None:
    """admission/gating.py gates a gang whose size it knows at admission: ours (gang-name + gang-size) and
    Kueue's (pod-group-name + total-count). Coscheduling and Volcano keep their size in a PodGroup (never
    gated by us), a native PodGroup is kube-scheduler's, another schedulerName holds its own gang, and a pod
    created with spec.nodeName may not carry gates: refusing those while the webhook is down would gain nothing."""
    prefix = "gpu.example.com/"
    _, members = _entries({"settings": {"names": {"prefix": prefix}}})
    gang = _conditions(members)["gated-gang-member"]
    names = settings.Names(prefix=prefix)
    for key in (names.gang_name, names.skip, gangs.KUEUE_GROUP_LABEL, gangs.KUEUE_COUNT_ANNOTATION,
                "schedulingGroup", "nodeName", f"'{gangs.DEFAULT_SCHEDULER}'"):
        assert key in gang, key
    for key in (gangs.COSCHEDULING_LABEL, gangs.VOLCANO_ANNOTATION, "gpu-steward.io/"):
        assert key not in gang, key
    assert members["name"] == "gang-members-wait-for-the-gpu-steward-webhook-retry-when-up.gpu.example.com"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"webhook": {"gangs": {"enabled": False}}}, [("pods.gpu-steward.io", "Ignore", ["gpu-or-gang"])],
                     id="gang-entry-off-one-entry-as-before"),
        pytest.param({"webhook": {"filterPods": False}},
                     [("pods.gpu-steward.io", "Ignore", ["not-a-gated-gang-member"]),
                      (GANG_ENTRY, "Fail", ["gated-gang-member"])], id="unfiltered-still-never-both"),
        pytest.param({"webhook": {"gangs": {"failurePolicy": "Ignore", "name": "gangs"}, "failurePolicy": "Fail"}},
                     [("pods.gpu-steward.io", "Fail", ["gpu-or-gang", "not-a-gated-gang-member"]),
                      ("gangs.gpu-steward.io", "Ignore", ["gated-gang-member"])], id="policies-are-values"),
    ],
)
def test_entries_follow_the_values(values: dict[str, Any], expected: list[tuple[str, str, list[str]]]) -> None:
    assert [(e["name"], e["failurePolicy"], list(_conditions(e))) for e in _entries(values)] == expected


def test_the_opt_out_values_reach_the_gang_condition() -> None:
    _, members = _entries({"webhook": {"skipLabelValues": ["true", "on"]}})
    assert "in ['true','on']" in _conditions(members)["gated-gang-member"]
