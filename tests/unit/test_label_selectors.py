"""common/label_selectors.py: Kubernetes' LabelSelector semantics, one row per stated rule (a match, a miss, the
boundary), malformed selectors first. Rows marked `was-split` are the probe cases on which the two matchers this
module replaced (`fit.selector_matches`, `snapshot.selector_matches`) answered differently."""

from __future__ import annotations

from typing import Any

import pytest

from common import label_selectors, snapshot
from tests import builders

LABELS = {"app": "web", "tier": "", "n": "5"}


def expr(key: Any, operator: str, values: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values is not None:
        out["values"] = values
    return out


def sel(*expressions: Any, labels: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"matchExpressions": list(expressions)}
    if labels is not None:
        out["matchLabels"] = labels
    return out


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        # Malformed (the API server rejects it, NewRequirement refuses it): the whole selector selects, whatever
        # the order of its requirements — the safe answer for every caller (protect a pod, rule a node out).
        pytest.param(sel(expr("app", "In", [])), LABELS, True, id="was-split-in-without-values-is-malformed"),
        pytest.param(sel(expr("app", "In")), LABELS, True, id="was-split-in-no-values-key-is-malformed"),
        pytest.param(sel(expr("app", "NotIn", []), expr("x", "Exists")), LABELS, True,
                     id="notin-without-values-is-malformed"),
        pytest.param(sel(expr("x", "Exists", ["a"])), LABELS, True, id="was-split-exists-with-values-is-malformed"),
        pytest.param(sel(expr("app", "DoesNotExist", ["a"])), LABELS, True,
                     id="was-split-does-not-exist-with-values-is-malformed"),
        pytest.param(sel(expr("app", "Near")), {}, True, id="unknown-operator-is-malformed"),
        pytest.param(sel(expr("n", "Gt", ["9"])), LABELS, True, id="gt-is-for-node-selectors-only"),
        pytest.param(sel(expr("app", "Near"), expr("x", "Exists")), LABELS, True,
                     id="was-split-malformed-first-then-a-miss-selects"),
        pytest.param(sel(expr("x", "Exists"), expr("app", "Near")), LABELS, True,
                     id="was-split-a-miss-then-malformed-selects-the-same"),
        pytest.param(sel(expr("app", "In", "xyz")), LABELS, True, id="was-split-values-a-string-is-malformed"),
        pytest.param(sel(expr("n", "In", [5])), LABELS, True, id="was-split-a-value-not-a-string-is-malformed"),
        pytest.param(sel(expr(5, "Exists"), expr("x", "Exists")), LABELS, True,
                     id="was-split-key-not-a-string-is-malformed"),
        pytest.param(sel("junk"), LABELS, True, id="requirement-not-an-object-is-malformed"),
        pytest.param({"matchExpressions": "junk"}, LABELS, True, id="expressions-not-a-list-is-malformed"),
        pytest.param({"matchLabels": ["a"]}, LABELS, True, id="match-labels-not-a-map-is-malformed"),
        pytest.param({"matchLabels": {"n": 5}}, LABELS, True, id="match-labels-value-not-a-string-is-malformed"),
        pytest.param("junk", LABELS, True, id="was-split-selector-not-an-object-is-malformed"),
        # nil and empty
        pytest.param(None, LABELS, False, id="was-split-nil-selects-nothing"),
        pytest.param(None, {}, False, id="nil-selects-nothing-even-no-labels"),
        pytest.param({}, {}, True, id="empty-selects-everything"),
        pytest.param({"matchLabels": {}, "matchExpressions": []}, LABELS, True, id="empty-parts-select-everything"),
        # matchLabels
        pytest.param({"matchLabels": {"app": "web"}}, LABELS, True, id="match-labels"),
        pytest.param({"matchLabels": {"app": "db"}}, LABELS, False, id="match-labels-other-value"),
        pytest.param({"matchLabels": {"x": "y"}}, LABELS, False, id="match-labels-absent"),
        pytest.param({"matchLabels": {"tier": ""}}, LABELS, True, id="boundary-match-labels-empty-value-present"),
        pytest.param({"matchLabels": {"x": ""}}, LABELS, False, id="boundary-match-labels-empty-value-absent"),
        # In
        pytest.param(sel(expr("app", "In", ["db", "web"])), LABELS, True, id="in"),
        pytest.param(sel(expr("app", "In", ["db"])), LABELS, False, id="in-other-value"),
        pytest.param(sel(expr("x", "In", ["db"])), LABELS, False, id="in-absent"),
        pytest.param(sel(expr("tier", "In", [""])), LABELS, True, id="boundary-in-the-empty-value"),
        # NotIn
        pytest.param(sel(expr("app", "NotIn", ["db"])), LABELS, True, id="notin"),
        pytest.param(sel(expr("app", "NotIn", ["web"])), LABELS, False, id="notin-listed-value"),
        pytest.param(sel(expr("x", "NotIn", ["web"])), LABELS, True, id="boundary-notin-absent-label"),
        # Exists / DoesNotExist
        pytest.param(sel(expr("app", "Exists")), LABELS, True, id="exists"),
        pytest.param(sel(expr("x", "Exists")), LABELS, False, id="exists-absent"),
        pytest.param(sel(expr("tier", "Exists")), LABELS, True, id="boundary-exists-an-empty-value"),
        pytest.param(sel(expr("x", "DoesNotExist")), LABELS, True, id="does-not-exist"),
        pytest.param(sel(expr("app", "DoesNotExist")), LABELS, False, id="does-not-exist-present"),
        pytest.param(sel(expr("tier", "DoesNotExist")), LABELS, False, id="boundary-does-not-exist-an-empty-value"),
        # ANDed
        pytest.param(sel(expr("tier", "Exists"), labels={"app": "web"}), LABELS, True, id="labels-and-expressions"),
        pytest.param(sel(expr("x", "Exists"), labels={"app": "web"}), LABELS, False, id="anded-an-expression-misses"),
        pytest.param(sel(expr("app", "Exists"), labels={"app": "db"}), LABELS, False, id="anded-a-label-misses"),
        pytest.param(sel(expr("app", "Exists"), expr("x", "Exists")), LABELS, False, id="anded-expressions"),
    ],
)
def test_label_selector(selector: Any, labels: dict[str, str], expected: bool) -> None:
    assert label_selectors.matches(selector, labels) is expected


@pytest.mark.parametrize(
    ("requirement", "node", "expected"),
    [
        pytest.param(expr("n", "Gt", ["4"]), True, True, id="gt"),
        pytest.param(expr("n", "Gt", ["5"]), True, False, id="boundary-gt-equal"),
        pytest.param(expr("n", "Lt", ["6"]), True, True, id="lt"),
        pytest.param(expr("n", "Lt", ["5"]), True, False, id="boundary-lt-equal"),
        pytest.param(expr("x", "Gt", ["1"]), True, False, id="gt-absent-label"),
        pytest.param(expr("app", "Gt", ["1"]), True, False, id="gt-label-not-an-integer"),
        pytest.param(expr("n", "Gt", ["one"]), True, False, id="gt-value-not-an-integer-matches-nothing"),
        pytest.param(expr("n", "Gt", [" 1"]), True, False, id="gt-value-with-a-space-is-no-integer"),
        pytest.param(expr("n", "Lt", [str(2**63)]), True, False, id="boundary-lt-beyond-int64"),
        pytest.param(expr("n", "Lt", [str(2**63 - 1)]), True, True, id="boundary-lt-int64-max"),
        pytest.param(expr("n", "Gt", ["1", "2"]), True, None, id="gt-two-values-is-malformed"),
        pytest.param(expr("n", "Gt", []), True, None, id="gt-no-value-is-malformed"),
        pytest.param(expr("n", "Gt", ["4"]), False, None, id="gt-outside-a-node-selector-is-malformed"),
        pytest.param(expr("app", "In", ["web"]), True, True, id="node-in"),
        pytest.param("junk", True, None, id="not-an-object-is-malformed"),
        pytest.param(expr("app", "NotIn", []), False, None, id="notin-without-values-is-malformed"),
        pytest.param(expr("app", "In"), False, None, id="in-without-values-is-malformed"),
    ],
)
def test_requirement(requirement: Any, node: bool, expected: bool | None) -> None:
    assert label_selectors.requirement(requirement, LABELS, node=node) is expected


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        pytest.param({}, True, id="nothing-wanted"),
        pytest.param({"app": "web", "tier": ""}, True, id="all-wanted-labels"),
        pytest.param({"app": "web", "x": "y"}, False, id="one-missing"),
        pytest.param({"x": ""}, False, id="boundary-an-empty-value-needs-the-label"),
    ],
)
def test_has_labels(wanted: dict[str, str], expected: bool) -> None:
    assert label_selectors.has_labels(wanted, LABELS) is expected


@pytest.mark.parametrize(
    ("selector", "namespace", "expected"),
    [
        pytest.param({"matchLabels": {"app": "web"}}, "team-a", True, id="selects-in-its-namespace"),
        pytest.param({"matchLabels": {"app": "web"}}, "team-b", False, id="never-another-namespace"),
        pytest.param({}, "team-a", True, id="policy-v1-empty-selects-every-pod-of-the-namespace"),
        pytest.param(None, "team-a", False, id="null-selects-no-pod"),
        pytest.param(sel(expr("app", "Near")), "team-a", True, id="unreadable-selects-so-it-protects"),
    ],
)
def test_disruption_budget_uses_it(selector: Any, namespace: str, expected: bool) -> None:
    budget = snapshot.disruption_budget({"metadata": {"namespace": namespace, "name": "b"},
                                         "spec": {"selector": selector}, "status": {"disruptionsAllowed": 0}})
    pod = snapshot.parse_pod(builders.pod("p", namespace="team-a", labels={"app": "web"}))
    assert budget.selects(pod) is expected
