"""common.fit: readiness, taints, nodeSelector, required node affinity — could this pod run on this node?"""

from __future__ import annotations

from typing import Any

import pytest

from common import fit, settings, snapshot, snapshot_build
from tests import builders

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("tolerations", "taint", "tolerated"),
    [
        pytest.param([], GPU_TAINT, False, id="no-tolerations"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Exists"}], GPU_TAINT, True, id="exists-any-effect"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], GPU_TAINT, True,
                     id="exists-same-effect"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], GPU_TAINT, False,
                     id="exists-effect-mismatch"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}], GPU_TAINT, True,
                     id="equal-value"),
        pytest.param([{"key": "nvidia.com/gpu", "value": "present"}], GPU_TAINT, True, id="operator-defaults-equal"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}], GPU_TAINT, False,
                     id="equal-other-value"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Equal"}], GPU_TAINT, False, id="equal-missing-value"),
        pytest.param([{"key": "dedicated", "operator": "Equal"}], {"key": "dedicated", "effect": "NoSchedule"}, True,
                     id="equal-both-values-empty"),
        pytest.param([{"key": "other", "operator": "Exists"}], GPU_TAINT, False, id="other-key"),
        pytest.param([{"operator": "Exists"}], GPU_TAINT, True, id="empty-key-exists-tolerates-all"),
        pytest.param([{"key": "", "operator": "Exists", "effect": "NoExecute"}], GPU_TAINT, False,
                     id="empty-key-exists-effect-mismatch"),
        pytest.param([{"operator": "Equal", "value": "present"}], GPU_TAINT, False, id="empty-key-equal"),
        pytest.param([{"key": "other", "operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists"}],
                     GPU_TAINT, True, id="second-toleration-matches"),
    ],
)
def test_tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any], tolerated: bool) -> None:
    assert fit.tolerates(tolerations, taint) is tolerated


def _node(*, taints: list[dict[str, Any]] | None = None, ready: bool = True, cordoned: bool = False,
          labels: dict[str, str] | None = None) -> snapshot.Node:
    def mutate(node: dict[str, Any]) -> None:
        if taints:
            node["spec"]["taints"] = taints
        if cordoned:
            node["spec"]["unschedulable"] = True

    raw = builders.gpu_node("n", gpus=4, labels=labels, ready=ready, mutate=mutate)
    return snapshot_build.build(nodes=[raw], pods=[], names=settings.Names(), taken_at=None).nodes["n"]


PRODUCT = "nvidia.com/gpu.product"


@pytest.mark.parametrize(
    ("pod_spec", "node", "reason"),
    [
        pytest.param({}, _node(), None, id="plain-node"),
        pytest.param({}, _node(ready=False), "node not ready or cordoned", id="not-ready"),
        pytest.param({}, _node(cordoned=True), "node not ready or cordoned", id="cordoned"),
        pytest.param({"tolerations": [{"operator": "Exists"}]}, _node(ready=False), "node not ready or cordoned",
                     id="tolerating-everything-does-not-help-not-ready"),
        pytest.param({}, _node(taints=[GPU_TAINT]), "taint nvidia.com/gpu=present:NoSchedule not tolerated",
                     id="untolerated-noschedule"),
        pytest.param({}, _node(taints=[{"key": "maintenance", "effect": "NoExecute"}]),
                     "taint maintenance=:NoExecute not tolerated", id="untolerated-noexecute-no-value"),
        pytest.param({}, _node(taints=[{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}]), None,
                     id="prefer-no-schedule-ignored"),
        pytest.param({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
                     _node(taints=[GPU_TAINT]), None, id="tolerated"),
        pytest.param({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
                     _node(taints=[GPU_TAINT, {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
                     "taint dedicated=ml:NoSchedule not tolerated", id="second-taint-untolerated"),
        pytest.param({"nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}},
                     _node(labels={PRODUCT: "NVIDIA-H100-80GB-HBM3"}), None, id="node-selector-match"),
        pytest.param({"nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}},
                     _node(labels={PRODUCT: "Tesla-T4"}),
                     f"nodeSelector {PRODUCT}=NVIDIA-H100-80GB-HBM3 does not match", id="node-selector-other-value"),
        pytest.param({"nodeSelector": {"pool": "a100"}}, _node(), "nodeSelector pool=a100 does not match",
                     id="node-selector-label-missing"),
        pytest.param({"nodeSelector": {"pool": "a100"}}, _node(taints=[GPU_TAINT]),
                     "taint nvidia.com/gpu=present:NoSchedule not tolerated", id="taint-reported-before-selector"),
    ],
)
def test_why_not(pod_spec: dict[str, Any], node: snapshot.Node, reason: str | None) -> None:
    assert fit.why_not(pod_spec, node) == reason


# --- required node affinity -----------------------------------------------------------------------

SIZE = "gpu-steward.io/nvlink-domain-size"  # the builder labels this 4-GPU node's single domain "4"
AFFINITY_NODE = _node(labels={PRODUCT: "H100", "pool": "a", "rank": "x12", "padded": "08", "under": "1_0",
                              "huge": "9223372036854775808", "negative": "-3"})
NO_MATCH = "required node affinity does not match"


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement


def name_is(operator: str, *values: str) -> dict[str, Any]:
    return expr("metadata.name", operator, *values)


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    """A pod spec requiring `terms` (each a nodeSelectorTerm)."""
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def labels(*requirements: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(requirements)}


def fields(*requirements: dict[str, Any]) -> dict[str, Any]:
    return {"matchFields": list(requirements)}


@pytest.mark.parametrize(
    ("pod_spec", "reason"),
    [
        # nothing required
        pytest.param({}, None, id="no-affinity"),
        pytest.param({"affinity": {"podAntiAffinity": {}}}, None, id="no-node-affinity"),
        pytest.param({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": labels(expr(PRODUCT, "In", "A100"))}]}}}, None, id="only-preferred"),
        pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}}}, None,
                     id="required-null"),
        # In / NotIn
        pytest.param(required(labels(expr(PRODUCT, "In", "A100", "H100"))), None, id="in"),
        pytest.param(required(labels(expr(PRODUCT, "In", "A100"))), f"{NO_MATCH} (term 1: {PRODUCT} In [A100])",
                     id="in-other-value"),
        pytest.param(required(labels(expr("zone", "In", "a"))), f"{NO_MATCH} (term 1: zone In [a])",
                     id="in-label-missing"),
        pytest.param(required(labels(expr(PRODUCT, "NotIn", "A100", "V100"))), None, id="not-in"),
        pytest.param(required(labels(expr(PRODUCT, "NotIn", "H100"))), f"{NO_MATCH} (term 1: {PRODUCT} NotIn [H100])",
                     id="not-in-value-listed"),
        pytest.param(required(labels(expr("zone", "NotIn", "a"))), None, id="not-in-label-missing"),
        # Exists / DoesNotExist
        pytest.param(required(labels(expr("pool", "Exists"))), None, id="exists"),
        pytest.param(required(labels(expr("zone", "Exists"))), f"{NO_MATCH} (term 1: zone Exists)",
                     id="exists-label-missing"),
        pytest.param(required(labels(expr("zone", "DoesNotExist"))), None, id="does-not-exist"),
        pytest.param(required(labels(expr("pool", "DoesNotExist"))), f"{NO_MATCH} (term 1: pool DoesNotExist)",
                     id="does-not-exist-label-present"),
        # Gt / Lt: 64-bit decimal integers as Go's strconv.ParseInt reads them
        pytest.param(required(labels(expr(SIZE, "Gt", "3"))), None, id="gt"),
        pytest.param(required(labels(expr(SIZE, "Gt", "4"))), f"{NO_MATCH} (term 1: {SIZE} Gt [4])", id="gt-equal"),
        pytest.param(required(labels(expr(SIZE, "Lt", "5"))), None, id="lt"),
        pytest.param(required(labels(expr(SIZE, "Lt", "4"))), f"{NO_MATCH} (term 1: {SIZE} Lt [4])", id="lt-equal"),
        pytest.param(required(labels(expr("negative", "Lt", "-2"))), None, id="lt-negative"),
        pytest.param(required(labels(expr("padded", "Gt", "7"))), None, id="gt-leading-zero-label"),
        pytest.param(required(labels(expr("zone", "Gt", "1"))), f"{NO_MATCH} (term 1: zone Gt [1])",
                     id="gt-label-missing"),
        pytest.param(required(labels(expr("rank", "Gt", "1"))), f"{NO_MATCH} (term 1: rank Gt [1])",
                     id="gt-non-integer-label"),
        pytest.param(required(labels(expr("rank", "Lt", "100"))), f"{NO_MATCH} (term 1: rank Lt [100])",
                     id="lt-non-integer-label"),
        pytest.param(required(labels(expr("under", "Gt", "1"))), f"{NO_MATCH} (term 1: under Gt [1])",
                     id="gt-underscored-label-is-no-go-integer"),
        pytest.param(required(labels(expr("huge", "Gt", "1"))), f"{NO_MATCH} (term 1: huge Gt [1])",
                     id="gt-label-beyond-int64"),
        # The API server admits a non-integer Gt/Lt value (it only counts values); the scheduler's parser
        # then fails the term, which matches no node.
        pytest.param(required(labels(expr(SIZE, "Gt", "three"))),
                     f"{NO_MATCH} (term 1: {SIZE} Gt [three] (not an integer))", id="gt-non-integer-value"),
        pytest.param(required(labels(expr(SIZE, "Lt", "4.5"))),
                     f"{NO_MATCH} (term 1: {SIZE} Lt [4.5] (not an integer))", id="lt-fractional-value"),
        pytest.param(required(labels(expr(SIZE, "Gt", "three")), labels(expr("pool", "In", "a"))), None,
                     id="non-integer-value-term-ored-with-a-match"),
        # matchFields: metadata.name only, In / NotIn with one value
        pytest.param(required(fields(name_is("In", "n"))), None, id="fields-name-in"),
        pytest.param(required(fields(name_is("In", "other"))), f"{NO_MATCH} (term 1: metadata.name In [other])",
                     id="fields-name-in-other"),
        pytest.param(required(fields(name_is("NotIn", "other"))), None, id="fields-name-not-in"),
        pytest.param(required(fields(name_is("NotIn", "n"))), f"{NO_MATCH} (term 1: metadata.name NotIn [n])",
                     id="fields-name-not-in-this-node"),
        # terms are ORed, requirements within a term ANDed
        pytest.param(required(labels(expr(PRODUCT, "In", "A100")), labels(expr("pool", "In", "a"))), None,
                     id="ored-second-term-matches"),
        pytest.param(required(labels(expr(PRODUCT, "In", "A100")), fields(name_is("In", "other"))),
                     f"{NO_MATCH} (term 1: {PRODUCT} In [A100]; term 2: metadata.name In [other])",
                     id="ored-no-term-matches"),
        pytest.param(required(labels(expr(PRODUCT, "In", "H100"), expr("pool", "In", "a"))), None, id="anded-all-met"),
        pytest.param(required(labels(expr(PRODUCT, "In", "H100"), expr("pool", "In", "b"), expr("zone", "Exists"))),
                     f"{NO_MATCH} (term 1: pool In [b])", id="anded-first-unmet-reported"),
        pytest.param(required({**labels(expr(PRODUCT, "In", "H100")), **fields(name_is("In", "other"))}),
                     f"{NO_MATCH} (term 1: metadata.name In [other])", id="anded-expressions-and-fields"),
        pytest.param(required({**labels(expr(PRODUCT, "In", "H100")), **fields(name_is("In", "n"))}), None,
                     id="anded-expressions-and-fields-met"),
        # empty terms match no node (component-helpers: "nil or empty term selects no objects")
        pytest.param(required({}), f"{NO_MATCH} (term 1: no requirements)", id="empty-term"),
        pytest.param(required({"matchExpressions": [], "matchFields": []}), f"{NO_MATCH} (term 1: no requirements)",
                     id="term-with-empty-lists"),
        pytest.param(required({}, labels(expr("pool", "In", "a"))), None, id="empty-term-ored-with-a-match"),
        pytest.param(required(), "required node affinity has no nodeSelectorTerms", id="no-terms"),
        pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
                     "required node affinity has no nodeSelectorTerms", id="required-without-term-list"),
        # malformed as the API server rejects it: the pod is never created, we exclude no node on a guess
        pytest.param(required(labels(expr(PRODUCT, "Matches", "A100"))), None, id="unknown-operator-not-excluded"),
        pytest.param(required(labels(expr(PRODUCT, "In", "A100")), labels(expr(PRODUCT, "Matches", "A100"))), None,
                     id="unknown-operator-in-another-term-not-excluded"),
        pytest.param(required(labels(expr(PRODUCT, "In", "A100"), expr(PRODUCT, "Matches", "A100"))), None,
                     id="unknown-operator-after-an-unmet-requirement-not-excluded"),
        pytest.param(required(labels(expr(PRODUCT, "In"))), None, id="in-without-values-not-excluded"),
        pytest.param(required(labels(expr("zone", "Exists", "a"))), None, id="exists-with-values-not-excluded"),
        pytest.param(required(labels(expr(SIZE, "Gt", "1", "2"))), None, id="gt-with-two-values-not-excluded"),
        pytest.param(required(fields(expr("spec.unschedulable", "In", "x"))), None,
                     id="fields-other-key-not-excluded"),
        pytest.param(required(fields(name_is("Exists"))), None, id="fields-exists-not-excluded"),
        pytest.param(required(fields(name_is("In", "a", "b"))), None, id="fields-two-values-not-excluded"),
        # a user's term with a label selector and a Gt on our domain-size label, ANDed
        pytest.param(required(labels(expr(PRODUCT, "In", "H100"), expr(SIZE, "Gt", "3"))), None,
                     id="selector-and-domain-size-met"),
        pytest.param(required(labels(expr(PRODUCT, "In", "H100"), expr(SIZE, "Gt", "7"))),
                     f"{NO_MATCH} (term 1: {SIZE} Gt [7])", id="selector-and-domain-size-unmet"),
        pytest.param(required(labels(expr(PRODUCT, "In", "A100"), expr(SIZE, "Gt", "3")),
                              {**fields(name_is("In", "n")), **labels(expr(SIZE, "Gt", "3"))}), None,
                     id="merged-nvlink-expression-in-every-term"),
        # checks before the affinity are reported first
        pytest.param({"nodeSelector": {"pool": "b"}, **required(labels(expr("zone", "Exists")))},
                     "nodeSelector pool=b does not match", id="node-selector-reported-before-affinity"),
    ],
)
def test_why_not_required_node_affinity(pod_spec: dict[str, Any], reason: str | None) -> None:
    assert fit.why_not(pod_spec, AFFINITY_NODE) == reason


def test_a_node_without_our_labels_fails_our_nvlink_expression() -> None:
    raw = builders.gpu_node("bare", gpus=8, topology="none")
    node = snapshot_build.build(nodes=[raw], pods=[], names=settings.Names(), taken_at=None).nodes["bare"]
    assert fit.why_not(required(labels(expr(SIZE, "Gt", "0"))), node) == f"{NO_MATCH} (term 1: {SIZE} Gt [0])"
