"""Never strand a pod: whatever admission adds, every node the stock scheduler's filters accepted for the pod
as the user wrote it still accepts it (`fit.why_not`: readiness, taints, nodeSelector, required node affinity),
and the mutated pod is one the API server accepts (no gate with spec.nodeName; gates only at creation).

First the issue's examples as regression rows (each failed with the admission-time required
`nvlink-domain-size Gt` term), then the same property over random clusters and pods (hypothesis). The same
property judged by the real kube-scheduler instead of `fit.why_not`: tests/e2e/test_never_strand_e2e.py.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from admission import mutation
from common import fit, settings, snapshot, snapshot_build
from tests import builders

CONFIG = settings.Settings()
NOW = 1_000.0
ALIVE = NOW - 1
GATE = "gpu-steward.io/gang"
PRODUCT = "nvidia.com/gpu.product"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def cluster_of(nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]] = ()) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, priority_classes=builders.tier_classes(),
                                namespaces=[builders.namespace("default")], names=CONFIG.names, taken_at=NOW)


def admit(pod: dict[str, Any], cluster: snapshot.Snapshot, controller: float | None,
          operation: str = "CREATE") -> tuple[mutation.Outcome, dict[str, Any]]:
    extra = {} if controller is None else {"controller_seen_at": controller}  # None: as without a live controller
    outcome = mutation.decide(operation=operation, namespace="default", pod=pod, cluster=cluster, config=CONFIG,
                              now=NOW, **extra)
    return outcome, jsonpatch.apply_patch(pod, outcome.patch)


def feasible(spec: dict[str, Any], cluster: snapshot.Snapshot) -> set[str]:
    return {name for name, node in cluster.nodes.items() if fit.why_not(spec, node) is None}


def with_room(names: set[str], cluster: snapshot.Snapshot, gpus: int) -> set[str]:
    return {name for name in names if cluster.nodes[name].free_gpus >= gpus}


def assert_never_stranded(original: dict[str, Any], mutated: dict[str, Any], cluster: snapshot.Snapshot) -> None:
    before = feasible(original["spec"], cluster)
    lost = {n: fit.why_not(mutated["spec"], cluster.nodes[n]) for n in before - feasible(mutated["spec"], cluster)}
    assert not lost, f"admission removed nodes the scheduler would accept: {lost}"
    spec, was = mutated["spec"], original["spec"]
    assert (spec.get("affinity") or {}).get("nodeAffinity", {}).get(REQUIRED) == (
        (was.get("affinity") or {}).get("nodeAffinity", {}).get(REQUIRED)), "required node affinity changed"
    for field in ("nodeSelector", "tolerations", "nodeName", "schedulerName"):
        assert spec.get(field) == was.get(field), f"{field} changed"


def assert_api_server_accepts(original: dict[str, Any], mutated: dict[str, Any]) -> None:
    gates = [g["name"] for g in mutated["spec"].get("schedulingGates") or []]
    before = [g["name"] for g in original["spec"].get("schedulingGates") or []]
    assert gates[: len(before)] == before and len(gates) - len(before) in (0, 1), "only our gate may be added"
    if mutated["spec"].get("nodeName"):
        assert gates == before, "the API server refuses scheduling gates on a pod with spec.nodeName"
    for term in (mutated["spec"].get("affinity") or {}).get("nodeAffinity", {}).get(
            "preferredDuringSchedulingIgnoredDuringExecution", [])[
            len((original["spec"].get("affinity") or {}).get("nodeAffinity", {}).get(
                "preferredDuringSchedulingIgnoredDuringExecution") or []):]:
        assert 1 <= term["weight"] <= 100
        assert term["preference"] == {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [term["preference"]["matchFields"][0]["values"][0]]}]}


# --- the issue's examples ---------------------------------------------------------------------------------


def hgx4(name: str) -> dict[str, Any]:
    return builders.gpu_node(name, gpus=4)  # one NVLink domain of 4


def pairs8(name: str, **kw: Any) -> dict[str, Any]:
    return builders.gpu_node(name, gpus=8, domains=[[0, 1], [2, 3], [4, 5], [6, 7]], **kw)


def l4(name: str) -> dict[str, Any]:
    return builders.gpu_node(name, gpus=2, domains=[[0], [1]], labels={PRODUCT: "NVIDIA-L4"})  # PCIe: domains of 1


def tainted_for_team_a(node: dict[str, Any]) -> None:
    node["spec"]["taints"] = [{"key": "team", "value": "a", "effect": "NoSchedule"}]


SCENARIOS = [
    pytest.param(
        cluster_of([hgx4("hgx-1"), hgx4("hgx-2"), pairs8("pairs-1"), pairs8("pairs-2")]),
        builders.pod("big", gpus=8), {"pairs-1", "pairs-2"},
        id="8-gpu-pod-with-only-4-gpu-domains-kept-its-8-gpu-nodes"),
    pytest.param(
        cluster_of([l4("l4-1"), l4("l4-2"), builders.gpu_node("a100-1", gpus=8, labels={PRODUCT: "A100"})]),
        builders.pod("inference", gpus=2, mutate=lambda p: p["spec"].update(nodeSelector={PRODUCT: "NVIDIA-L4"})),
        {"l4-1", "l4-2"}, id="l4-node-selector-kept-its-pcie-nodes"),
    pytest.param(
        cluster_of([builders.gpu_node("team-a-dgx", gpus=8, mutate=tainted_for_team_a),
                    builders.gpu_node("hgx-1", gpus=8, domains=[range(4), range(4, 8)]),
                    builders.gpu_node("hgx-2", gpus=8, domains=[range(4), range(4, 8)])]),
        builders.pod("big", gpus=8), {"hgx-1", "hgx-2"}, id="only-8-wide-domain-tainted-kept-the-other-nodes"),
    pytest.param(
        cluster_of([builders.gpu_node("pair-1", gpus=2), builders.gpu_node("new-1", gpus=8, topology="none")],
                   pods=[builders.pod("busy", gpus=2, node="pair-1", phase="Running")]),
        builders.pod("small", gpus=1), {"new-1"}, id="unlabelled-node-stays-usable-for-a-1-gpu-pod"),
    pytest.param(
        cluster_of([builders.gpu_node("pair-1", gpus=2), builders.gpu_node("new-1", gpus=8, topology="none")]),
        builders.pod("pinned", gpus=4, mutate=lambda p: p["spec"].update(nodeName="new-1")), {"new-1"},
        id="node-name-pod-gets-no-term-its-node-fails"),
]


@pytest.mark.parametrize("controller", [pytest.param(None, id="controller-down"),
                                        pytest.param(ALIVE, id="controller-alive")])
@pytest.mark.parametrize(("cluster", "pod", "usable"), SCENARIOS)
def test_issue_examples_keep_every_node_the_scheduler_would_use(cluster, pod, usable, controller):
    original = copy.deepcopy(pod)
    outcome, mutated = admit(pod, cluster, controller)
    gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert with_room(feasible(original["spec"], cluster), cluster, gpus) == usable
    assert with_room(feasible(mutated["spec"], cluster), cluster, gpus) == usable
    assert_never_stranded(original, mutated, cluster)
    assert_api_server_accepts(original, mutated)
    assert outcome.skipped is None


def test_gang_member_with_node_name_is_not_gated():
    """Gating it made the API server reject the create (not a webhook error: failurePolicy Ignore does not help)."""
    pod = builders.pod("w-0", gpus=1, labels={"gpu-steward.io/gang-name": "g", "gpu-steward.io/gang-size": "2"},
                       mutate=lambda p: p["spec"].update(nodeName="pair-1"))
    cluster = cluster_of([builders.gpu_node("pair-1", gpus=2)])
    outcome, mutated = admit(pod, cluster, None)
    assert "schedulingGates" not in mutated["spec"] and not outcome.gated
    assert "spec.nodeName pair-1: bound at creation, never gated" in outcome.record
    assert_api_server_accepts(pod, mutated)


# --- the property over random clusters and pods ------------------------------------------------------------

LABEL_KEYS = (PRODUCT, "zone", "gpu-steward.io/nvlink-domain-size", "gpu-steward.io/nvlink-domains",
              "nvidia.com/gpu.count")
LABEL_VALUES = ("A100", "NVIDIA-L4", "a", "b", "0", "1", "2", "4", "8", "x")
TAINTS = ({"key": "team", "value": "a", "effect": "NoSchedule"},
          {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
          {"key": "maintenance", "effect": "NoExecute"},
          {"key": "soft", "effect": "PreferNoSchedule"})
NODE_NAMES = ("n0", "n1", "n2", "n3", "n4", "n5")


@st.composite
def nodes(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for name in draw(st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=len(NODE_NAMES), unique=True)):
        gpus = draw(st.sampled_from((1, 2, 4, 8)))
        width = draw(st.sampled_from([w for w in (1, 2, 4, 8) if gpus % w == 0]))
        domains = [range(i, i + width) for i in range(0, gpus, width)]
        # our topology labels too, with odd values (a node without topology="labels" keeps them as drawn)
        labels = draw(st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=3))
        taints = draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique_by=lambda t: t["key"]))
        unschedulable = draw(st.booleans())

        def extra(node: dict[str, Any], taints: list[dict[str, str]] = taints, cordoned: bool = unschedulable) -> None:
            node["spec"] = {"taints": copy.deepcopy(taints), **({"unschedulable": True} if cordoned else {})}

        out.append(builders.gpu_node(name, gpus=gpus, domains=domains, labels=labels, ready=draw(st.booleans()),
                                     topology=draw(st.sampled_from(("labels", "annotation", "none"))), mutate=extra))
    return out


requirements = st.one_of(
    st.fixed_dictionaries({"key": st.sampled_from(LABEL_KEYS), "operator": st.sampled_from(("In", "NotIn")),
                           "values": st.lists(st.sampled_from(LABEL_VALUES), min_size=1, max_size=2)}),
    st.fixed_dictionaries({"key": st.sampled_from(LABEL_KEYS),
                           "operator": st.sampled_from(("Exists", "DoesNotExist"))}),
    st.fixed_dictionaries({"key": st.sampled_from(LABEL_KEYS), "operator": st.sampled_from(("Gt", "Lt")),
                           "values": st.lists(st.sampled_from(LABEL_VALUES), min_size=1, max_size=1)}),
)
field_requirements = st.fixed_dictionaries({"key": st.just("metadata.name"),
                                            "operator": st.sampled_from(("In", "NotIn")),
                                            "values": st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=1)})
terms = st.fixed_dictionaries({}, optional={"matchExpressions": st.lists(requirements, max_size=3),
                                            "matchFields": st.lists(field_requirements, max_size=1)})
required_affinities = st.one_of(
    st.none(),
    st.just({}),
    st.fixed_dictionaries({"nodeSelectorTerms": st.lists(terms, max_size=3)}),
)
tolerations = st.lists(st.one_of(
    st.fixed_dictionaries({"key": st.sampled_from(("team", "nvidia.com/gpu", "maintenance")),
                           "operator": st.just("Exists")}),
    st.fixed_dictionaries({"key": st.just("team"), "operator": st.just("Equal"), "value": st.sampled_from("ab"),
                           "effect": st.sampled_from(("NoSchedule", "NoExecute"))}),
    st.just({"operator": "Exists"}),
), max_size=2)
gangs = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"gpu-steward.io/gang-name": st.just("g"),
                           "gpu-steward.io/gang-size": st.sampled_from(("1", "2", "4", "x"))}),
    st.just({"kueue.x-k8s.io/pod-group-name": "kg"}),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    labels = {**draw(gangs), **draw(st.dictionaries(st.just("gpu-steward.io/placement"),
                                                    st.sampled_from(("strict", "prefer", "off", "bogus"))))}
    spec: dict[str, Any] = {}
    if (required := draw(required_affinities)) is not None:
        spec["affinity"] = {"nodeAffinity": {REQUIRED: required}}
    if selector := draw(st.dictionaries(st.sampled_from((PRODUCT, "zone")), st.sampled_from(LABEL_VALUES),
                                        max_size=1)):
        spec["nodeSelector"] = selector
    if toleration_list := draw(tolerations):
        spec["tolerations"] = toleration_list
    if draw(st.integers(0, 4)) == 0:
        spec["nodeName"] = draw(st.sampled_from(NODE_NAMES))
    if draw(st.integers(0, 4)) == 0:
        spec["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    if draw(st.integers(0, 6)) == 0:
        spec["schedulerName"] = "volcano"
    mig = {"1g.10gb": 1} if draw(st.integers(0, 5)) == 0 else None
    annotations = {"kueue.x-k8s.io/pod-group-total-count": "3"} if "kueue.x-k8s.io/pod-group-name" in labels else None
    return builders.pod("p", gpus=draw(st.sampled_from((0, 1, 2, 3, 4, 8, 9))), mig=mig, labels=labels,
                        annotations=annotations, mutate=lambda p: p["spec"].update(copy.deepcopy(spec)))


@hypothesis_settings(max_examples=300, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow])
@given(node_list=nodes(), pod=pods(), controller=st.sampled_from((None, ALIVE, NOW - 1_000)))
def test_admission_never_removes_a_node_the_scheduler_would_accept(node_list, pod, controller):
    cluster = cluster_of(node_list)
    original = copy.deepcopy(pod)
    outcome, mutated = admit(pod, cluster, controller)
    assert pod == original, "decide() must not mutate its input"
    assert_never_stranded(original, mutated, cluster)
    assert_api_server_accepts(original, mutated)
    # gates only at creation, and admitting the admitted pod again changes nothing
    assert admit(mutated, cluster, controller, operation="UPDATE")[0].patch == []
    assert admit(mutated, cluster, controller)[0].patch == []
    if outcome.gated and not original["spec"].get("nodeName"):
        assert [g["name"] for g in mutated["spec"]["schedulingGates"]][-1] == GATE
