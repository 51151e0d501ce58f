"""A pending pod's own required pod anti-affinity in reclaim (issue 29, item 8): evaluated on the snapshot's pods
holding nodes per topology value (`common.antiaffinity.occupied`, kube-scheduler's `satisfyPodAntiAffinity`), so a
demand is served where its rule is met and nowhere else. One replica per node serving Deployments first: the other
replica on node a, GPUs reclaimable elsewhere. Every row asserts the evictions and the demand's reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from common import antiaffinity, settings_loader, snapshot_build
from descheduler import policy, reclaim
from tests import builders
from tests.unit.test_reclaim_planner import CLASSES, NO_COOLDOWNS, NOW, Raw, busy, evicted, idle, pending, running

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
SERVE = {"app": "serve"}
NAMESPACES = [builders.namespace("team-a"), builders.namespace("team-b", {"env": "prod"}),
              builders.namespace("team-c", {"env": "prod"}), builders.namespace("team-d", {"env": "dev"})]


def node(name: str, *, gpus: int = 1, zone: str | None = None) -> Raw:
    return builders.gpu_node(name, gpus=gpus, labels={ZONE: zone} if zone else None)


def term(key: str = HOST, *, selector: Any = None, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": SERVE} if selector is None else selector, "topologyKey": key, **extra}


def replica(name: str = "serve-2", *terms: dict[str, Any], namespace: str = "team-b") -> Raw:
    """A pending serving replica (app=serve) that must not share its topology domain with another."""
    pod = pending(name, namespace=namespace)
    pod["metadata"]["labels"] = dict(SERVE)
    pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                   list(terms) or [term()]}}
    return pod


def serving(name: str = "serve-1", *, node: str = "a", namespace: str = "team-b", gpus: int = 1) -> Raw:
    """The replica already running (busy: no victim unless a row says it is idle)."""
    return running(name, node=node, namespace=namespace, labels=dict(SERVE), gpus=gpus, owner=("ReplicaSet", "serve"))


def plan(nodes: Sequence[Raw], pods: Sequence[Raw], assessments: dict[str, Any]) -> reclaim.Plan:
    config = settings_loader.load(overrides={})
    cluster = snapshot_build.build(nodes=nodes, pods=pods, priority_classes=CLASSES, namespaces=NAMESPACES,
                                   names=config.names, taken_at=NOW)
    policies = policy.parse_all(cluster.priority_classes, default_threshold_percent=5.0)
    return reclaim.plan(cluster=cluster, policies=policies, assessments=assessments,
                        demands=reclaim.demands_from_snapshot(cluster), state=NO_COOLDOWNS, config=config, now=NOW)


def reason(result: reclaim.Plan, demand: str = "team-b/serve-2") -> str:
    return {o.demand: o.reason for o in result.demands}[demand]


AB = [node("a", gpus=2), node("b")]
A_B = [node("a"), node("b")]
IDLE_A_B = [running("idle-a", node="a"), running("idle-b", node="b")]
BOTH_IDLE = idle("team-a/idle-a", "team-a/idle-b") | busy("team-b/serve-1")
ON_B = {("team-a/idle-b", "team-b/serve-2")}
ON_A = {("team-a/idle-a", "team-b/serve-2")}
Z1A, Z1B, Z2C, UNZONED = node("a", zone="z1"), node("b", zone="z1"), node("c", zone="z2"), node("d", gpus=2)


@pytest.mark.parametrize(
    ("nodes", "pods", "assessments", "expected", "why"),
    [
        # Adversarial first: the cheapest node holds the other replica; the evictee is the replica itself; a pod
        # without GPUs is what the rule selects; a node label the scheduler would not read.
        pytest.param(AB, [serving(), *IDLE_A_B, replica()], BOTH_IDLE, ON_B, "1 idle pod(s) evicted on b",
                     id="replica-on-a-cheapest-idle-on-a-served-on-b-only"),
        pytest.param([node("a", gpus=2)], [serving(), running("idle-a", node="a"), replica()],
                     idle("team-a/idle-a") | busy("team-b/serve-1"), set(),
                     "a: its required anti-affinity selects pod team-b/serve-1 (topologyKey kubernetes.io/hostname=a)",
                     id="only-idle-gpus-beside-the-replica-no-demand"),
        pytest.param([node("a")], [serving(), replica()], idle("team-b/serve-1"), set(),
                     "a: its required anti-affinity selects pod team-b/serve-1 (topologyKey kubernetes.io/hostname=a)",
                     id="the-evictee-itself-matching-the-rule-is-never-evicted-for-it"),
        pytest.param(A_B, [builders.pod("cpu-web", namespace="team-b", node="a", phase="Running", labels=SERVE),
                          *IDLE_A_B, replica()], idle("team-a/idle-a", "team-a/idle-b"), ON_B,
                     "1 idle pod(s) evicted on b", id="a-pod-without-gpus-counts-too"),
        pytest.param([node("a"), node("b", gpus=2)], [serving(node="b"), *IDLE_A_B, replica()],
                     idle("team-a/idle-a", "team-a/idle-b")
                     | busy("team-b/serve-1"), ON_A, "1 idle pod(s) evicted on a", id="other-replica-on-b-served-on-a"),
        # The rule is met nowhere else: the pod does not get a demand on a node its rule rules out.
        pytest.param(AB, [serving(), *IDLE_A_B, replica("serve-2", term(selector={"matchLabels": {"app": "x"}}))],
                     BOTH_IDLE, ON_A, "1 idle pod(s) evicted on a", id="boundary-rule-selecting-no-pod-met-anywhere"),
        pytest.param(A_B, [builders.pod("serve-0", namespace="team-b", labels=SERVE), *IDLE_A_B, replica()],
                     idle("team-a/idle-a", "team-a/idle-b"), ON_A, "1 idle pod(s) evicted on a",
                     id="boundary-a-pending-pod-holds-no-node"),
        # Other topology keys: the zone of the other replica is out; a node without the label never is.
        pytest.param([Z1A, Z1B, Z2C], [serving(), running("idle-b", node="b"), running("idle-c", node="c"),
                             replica("serve-2", term(ZONE))], idle("team-a/idle-b", "team-a/idle-c")
                     | busy("team-b/serve-1"), {("team-a/idle-c", "team-b/serve-2")}, "1 idle pod(s) evicted on c",
                     id="zone-of-the-replica-ruled-out"),
        pytest.param([Z1A, Z1B], [serving(), running("idle-b", node="b"), replica("serve-2", term(ZONE))],
                     idle("team-a/idle-b") | busy("team-b/serve-1"), set(),
                     "b: its required anti-affinity selects pod team-b/serve-1 (topologyKey "
                     "topology.kubernetes.io/zone=z1)", id="only-the-replicas-zone-has-idle-gpus"),
        pytest.param([Z1A, node("d")], [serving(), running("idle-d", node="d"), replica("serve-2", term(ZONE))],
                     idle("team-a/idle-d") | busy("team-b/serve-1"), {("team-a/idle-d", "team-b/serve-2")},
                     "1 idle pod(s) evicted on d", id="boundary-node-without-the-topology-label-is-never-ruled-out"),
        pytest.param([Z1B, UNZONED], [serving(node="d"), running("idle-d", node="d"), running("idle-b", node="b"),
                                      replica("serve-2", term(ZONE))], idle("team-a/idle-b")
                     | busy("team-b/serve-1"), {("team-a/idle-b", "team-b/serve-2")}, "1 idle pod(s) evicted on b",
                     id="boundary-a-replica-on-a-node-without-the-label-rules-out-nothing"),
        # Namespaces: the pod's own by default; those named; those the namespaceSelector selects ({}: every one).
        pytest.param(AB, [serving(namespace="team-c"), *IDLE_A_B, replica()], BOTH_IDLE | busy("team-c/serve-1"),
                     ON_A, "1 idle pod(s) evicted on a", id="another-namespace-not-concerned-by-default"),
        pytest.param(AB, [serving(namespace="team-c"), *IDLE_A_B, replica("serve-2", term(namespaces=["team-c"]))],
                     BOTH_IDLE | busy("team-c/serve-1"), ON_B, "1 idle pod(s) evicted on b", id="named-namespace"),
        pytest.param(AB, [serving(namespace="team-c"), *IDLE_A_B,
                          replica("serve-2", term(namespaceSelector={"matchLabels": {"env": "prod"}}))],
                     BOTH_IDLE | busy("team-c/serve-1"), ON_B, "1 idle pod(s) evicted on b",
                     id="namespace-selector-selects-it"),
        pytest.param(AB, [serving(namespace="team-d"), *IDLE_A_B,
                          replica("serve-2", term(namespaceSelector={"matchLabels": {"env": "prod"}}))],
                     BOTH_IDLE | busy("team-d/serve-1"), ON_A, "1 idle pod(s) evicted on a",
                     id="namespace-selector-selects-another"),
        pytest.param(AB, [serving(namespace="team-d"), *IDLE_A_B, replica("serve-2", term(namespaceSelector={}))],
                     BOTH_IDLE | busy("team-d/serve-1"), ON_B, "1 idle pod(s) evicted on b",
                     id="empty-namespace-selector-every-namespace"),
        pytest.param(AB, [serving(namespace="team-a"), *IDLE_A_B,
                          replica("serve-2", term(namespaces=["team-c"], namespaceSelector={"matchLabels": {
                              "env": "prod"}}))], BOTH_IDLE | busy("team-a/serve-1"), ON_A,
                     "1 idle pod(s) evicted on a", id="boundary-named-and-selected-not-its-own-namespace"),
    ],
)
def test_own_anti_affinity_is_served_where_it_is_met(nodes: list[Raw], pods: list[Raw], assessments: dict[str, Any],
                                                     expected: set[tuple[str, str]], why: str) -> None:
    result = plan(nodes, pods, assessments)
    assert evicted(result) == expected
    assert why in reason(result)


def test_replicas_pending_together_are_not_planned_into_one_domain() -> None:
    """Two pending replicas in one plan: the second does not take the node planned for the first (its GPUs are
    free there, but the first replica will hold it), and is served on the next node instead."""
    nodes = [node("a"), node("b", gpus=2), node("c")]
    pods = [serving(), running("idle-b1", node="b"), running("idle-b2", node="b"), running("idle-c", node="c"),
            replica("serve-2"), replica("serve-3")]
    result = plan(nodes, pods, idle("team-a/idle-b1", "team-a/idle-b2", "team-a/idle-c") | busy("team-b/serve-1"))
    assert evicted(result) == {("team-a/idle-b1", "team-b/serve-2"), ("team-a/idle-c", "team-b/serve-3")}
    assert reason(result) == "1 idle pod(s) evicted on b"
    assert reason(result, "team-b/serve-3") == "1 idle pod(s) evicted on c"


def test_the_schedulers_anti_affinity_reason_is_no_veto() -> None:
    """The usual message when the other replica's node still has free GPUs: kube-scheduler names the anti-affinity
    there and the GPU shortage elsewhere. Reclaim repeats the anti-affinity on every node, so it is served."""
    nodes = [node("a", gpus=2), node("b")]
    waiting = replica()
    waiting["status"]["conditions"][0]["message"] = (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match pod anti-affinity rules. "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.")
    result = plan(nodes, [serving(), running("idle-b", node="b"), waiting], idle("team-a/idle-b")
                  | busy("team-b/serve-1"))
    assert evicted(result) == ON_B
    assert reason(result) == "1 idle pod(s) evicted on b"


RESIDENTS = [antiaffinity.Resident("team-b/r1", "team-b", SERVE, {HOST: "a", ZONE: "z1"}),
             antiaffinity.Resident("team-b/r0", "team-b", SERVE, {HOST: "b", ZONE: "z1"}),
             antiaffinity.Resident("team-b/r2", "team-b", {"app": "db"}, {HOST: "c"})]


@pytest.mark.parametrize(
    ("terms", "node_labels", "expected"),
    [
        # Odd terms first: no topologyKey (the API server rejects it), a null or malformed labelSelector.
        pytest.param([{"labelSelector": {"matchLabels": SERVE}}], {HOST: "a"}, None, id="no-topology-key-no-rule"),
        pytest.param([term(selector={"matchLabels": SERVE}) | {"labelSelector": None}], {HOST: "a"}, None,
                     id="null-label-selector-selects-no-pod"),
        pytest.param([term(selector={"matchExpressions": [{"key": "app", "operator": "In"}]})], {HOST: "c"},
                     "its required anti-affinity selects pod team-b/r2 (topologyKey kubernetes.io/hostname=c)",
                     id="malformed-label-selector-selects-every-pod"),
        pytest.param([term()], {HOST: "a"},
                     "its required anti-affinity selects pod team-b/r1 (topologyKey kubernetes.io/hostname=a)",
                     id="selected-pod-on-the-node"),
        pytest.param([term()], {HOST: "c"}, None, id="unselected-pod-on-the-node"),
        pytest.param([term()], {}, None, id="boundary-node-without-the-label"),
        pytest.param([term(ZONE)], {ZONE: "z1"},
                     "its required anti-affinity selects pod team-b/r1 (topologyKey topology.kubernetes.io/zone=z1)",
                     id="first-selected-pod-in-the-residents-order-named"),
        pytest.param([term(selector={"matchLabels": {"app": "x"}}), term()], {HOST: "b"},
                     "its required anti-affinity selects pod team-b/r0 (topologyKey kubernetes.io/hostname=b)",
                     id="any-term-rules-out"),
    ],
)
def test_occupied(terms: list[dict[str, Any]], node_labels: dict[str, str], expected: str | None) -> None:
    pod = replica("serve-2", *terms)
    occupied = antiaffinity.occupied(pod, residents=RESIDENTS, namespaces={})
    assert antiaffinity.refused_by(occupied, node_labels) == expected


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param({"metadata": {"namespace": "team-b"}, "spec": {"affinity": ["junk"]}}, None,
                     id="affinity-not-an-object-no-rule"),
        pytest.param(replica("serve-2", {"labelSelector": {"matchLabels": SERVE}}, term()),
                     "its required anti-affinity selects pod team-b/r1 (topologyKey kubernetes.io/hostname=a)",
                     id="a-term-without-topology-key-skipped-the-next-counts"),
        pytest.param(replica("serve-2", term(namespaces="team-b")),
                     "its required anti-affinity selects pod team-b/r1 (topologyKey kubernetes.io/hostname=a)",
                     id="namespaces-not-a-list-read-as-none-its-own-namespace"),
        pytest.param(replica("serve-2", term(namespaces=["team-c"])), None, id="named-namespace-only"),
        pytest.param(replica("serve-2", term()) | {"metadata": {"labels": SERVE}},
                     "its required anti-affinity selects pod default/r9 (topologyKey kubernetes.io/hostname=a)",
                     id="a-pod-without-a-namespace-is-in-default"),
    ],
)
def test_occupied_odd_pods(pod: dict[str, Any], expected: str | None) -> None:
    residents = [antiaffinity.Resident("default/r9", "default", SERVE, {HOST: "a"}), *RESIDENTS]
    occupied = antiaffinity.occupied(pod, residents=residents, namespaces={})
    assert antiaffinity.refused_by(occupied, {HOST: "a"}) == expected
