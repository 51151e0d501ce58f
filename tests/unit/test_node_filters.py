"""kube-scheduler's filters that read the pods already holding a node, as the one capacity model answers them:
NodePorts (common/hostports.py) and the existing pods' half of InterPodAffinity (common/antiaffinity.py),
through what common/snapshot.py attaches to each node and common/capacity.py's `refuses` / `Room.place_pod`.
Each documented rule has a row that matches, one that does not and one on its boundary; rows assert the
answer and its reason."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from common import capacity, hostports, placement, resources, settings, snapshot, snapshot_build
from descheduler.release import layout
from tests import builders

NAMES = settings.Names()
both = builders.both
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def build(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
          namespaces: Sequence[Mapping[str, Any]] = ()) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, namespaces=namespaces, names=NAMES, taken_at=0.0)


def ports(*entries: Any, init: bool = False, sidecar: bool = False) -> builders.Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        if init or sidecar:
            extra: dict[str, Any] = {"name": "init", "image": "x", "ports": list(entries)}
            if sidecar:
                extra["restartPolicy"] = "Always"
            pod["spec"]["initContainers"] = [extra]
        else:
            pod["spec"]["containers"][0]["ports"] = list(entries)

    return mutate


def anti(*terms: Mapping[str, Any]) -> builders.Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}

    return mutate


WEB = {"matchLabels": {"app": "web"}}


def term(selector: Any = WEB, key: str = HOST, **extra: Any) -> dict[str, Any]:
    """`selector=None`: a term without a labelSelector."""
    out = {"topologyKey": key, **extra}
    if selector is not None:
        out["labelSelector"] = selector
    return out


def pinned_released(node: str) -> builders.Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}

    return mutate


def unschedulable(pod: dict[str, Any]) -> None:
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


# --- host ports: which a pod uses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(ports({"containerPort": 80, "hostPort": 8080}), {("0.0.0.0", "TCP", 8080)},
                     id="container-host-port-empty-ip-and-protocol-sanitised"),
        pytest.param(ports({"containerPort": 80}), set(), id="container-port-without-host-port"),
        pytest.param(ports({"containerPort": 80, "hostPort": 0}), set(), id="host-port-zero-boundary"),
        pytest.param(ports({"containerPort": 80, "hostPort": 1}), {("0.0.0.0", "TCP", 1)}, id="host-port-one-boundary"),
        pytest.param(ports("junk", {"containerPort": 80, "hostPort": 8080}), {("0.0.0.0", "TCP", 8080)},
                     id="an-entry-that-is-no-port-is-skipped"),
        pytest.param(ports({"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"}),
                     {("10.0.0.1", "UDP", 53)}, id="explicit-ip-and-protocol"),
        pytest.param(ports({"containerPort": 80, "hostPort": 9000}, init=True), set(),
                     id="plain-init-container-not-counted"),
        pytest.param(ports({"containerPort": 80, "hostPort": 9000}, sidecar=True), {("0.0.0.0", "TCP", 9000)},
                     id="sidecar-init-container-counted"),
    ],
)
def test_host_ports_of_a_pod(mutate: builders.Mutator, expected: set[hostports.HostPort]) -> None:
    assert hostports.of_pod(builders.pod("p", mutate=mutate)) == expected


ANY_8080 = ("0.0.0.0", "TCP", 8080)


@pytest.mark.parametrize(
    ("wanted", "used", "expected"),
    [
        pytest.param(ANY_8080, {ANY_8080}, [ANY_8080], id="same-port-every-address"),
        pytest.param(ANY_8080, {("0.0.0.0", "UDP", 8080)}, [], id="other-protocol"),
        pytest.param(ANY_8080, {("0.0.0.0", "TCP", 8081)}, [], id="next-port-boundary"),
        pytest.param(("10.0.0.1", "TCP", 8080), {("10.0.0.2", "TCP", 8080)}, [], id="two-addresses-never-clash"),
        pytest.param(("10.0.0.1", "TCP", 8080), {("10.0.0.1", "TCP", 8080)}, [("10.0.0.1", "TCP", 8080)],
                     id="same-address"),
        pytest.param(("10.0.0.1", "TCP", 8080), {ANY_8080}, [("10.0.0.1", "TCP", 8080)],
                     id="address-against-every-address"),
        pytest.param(ANY_8080, {("10.0.0.2", "TCP", 8080)}, [ANY_8080], id="every-address-against-one-address"),
    ],
)
def test_host_port_conflicts(wanted: hostports.HostPort, used: set[hostports.HostPort],
                             expected: list[hostports.HostPort]) -> None:
    assert hostports.conflicts([wanted], frozenset(used)) == expected


@pytest.mark.parametrize(
    ("port", "expected"),
    [
        pytest.param(ANY_8080, "8080/TCP", id="every-address"),
        pytest.param(("10.0.0.1", "UDP", 53), "10.0.0.1:53/UDP", id="one-address"),
    ],
)
def test_a_host_port_as_a_reason_says(port: hostports.HostPort, expected: str) -> None:
    assert hostports.describe(port) == expected


# --- NodePorts on the model: which pods hold a node's ports ------------------------------------------

NODE = builders.gpu_node("n", gpus=8)
WANTS_8080 = ports({"containerPort": 80, "hostPort": 8080})


def candidate(*, gpus: int = 2, labels: dict[str, str] | None = None, namespace: str = "default",
              mutate: builders.Mutator | None = None) -> snapshot.Pod:
    raw = builders.pod("cand", namespace=namespace, gpus=gpus, labels=labels, mutate=mutate)
    return build([], [raw]).pods[f"{namespace}/cand"]


@pytest.mark.parametrize(
    ("holders", "expected"),
    [
        pytest.param([builders.pod("web", node="n", phase="Running", mutate=WANTS_8080)],
                     "host port 8080/TCP in use", id="bound-pod-without-gpus-holds-its-port"),
        pytest.param([builders.pod("web", gpus=1, node="n", phase="Running",
                                   mutate=ports({"containerPort": 80, "hostPort": 8081}))],
                     None, id="other-port-free"),
        pytest.param([builders.pod("pin", gpus=1, mutate=both(WANTS_8080, pinned_released("n")))],
                     "host port 8080/TCP in use", id="pinned-released-unbound-pod-holds-it"),
        pytest.param([builders.pod("pin", gpus=1, mutate=both(WANTS_8080, pinned_released("n"), unschedulable))],
                     None, id="pinned-pod-the-scheduler-refused-holds-nothing"),
        pytest.param([builders.pod("pre", mutate=both(WANTS_8080,
                                                      lambda p: p["status"].update(nominatedNodeName="n")))],
                     "host port 8080/TCP in use", id="nominated-pod-holds-it"),
        pytest.param([builders.pod("done", node="n", phase="Succeeded", mutate=WANTS_8080)], None,
                     id="finished-pod-holds-nothing"),
    ],
)
def test_ports_held_on_a_node(holders: list[dict[str, Any]], expected: str | None) -> None:
    node = build([NODE], holders).nodes["n"]
    assert capacity.refuses(candidate(mutate=WANTS_8080), node) == expected
    assert capacity.refuses(candidate(), node) is None, "a pod without host ports is never refused for them"


def test_a_slim_pod_keeps_what_rules_newcomers_out() -> None:
    """The feeder keeps non-GPU pods as `resources.slim_pod`: their host ports, required anti-affinity and labels
    (which a newcomer's own anti-affinity selects) survive."""
    raw = builders.pod("web", node="n", phase="Running", labels={"app": "web"}, mutate=both(WANTS_8080, anti(term())))
    cluster = build([NODE], [resources.slim_pod(raw)])
    node = cluster.nodes["n"]
    assert node.host_ports == {ANY_8080}
    assert capacity.refuses(candidate(labels={"app": "web"}), node) == (
        "pod default/web has required anti-affinity against it (topologyKey kubernetes.io/hostname=n)")
    assert [(r.key, r.labels) for r in cluster.residents] == [("default/web", {"app": "web"})]


def test_a_plan_counts_ports_taken_earlier_in_it() -> None:
    room = capacity.Room.of(build([NODE], []).nodes["n"])
    first = candidate(mutate=WANTS_8080)
    got = room.place_pod(first)
    assert isinstance(got, placement.Allocation)
    room.take_pod(first, got)
    assert room.place_pod(first) == "host port 8080/TCP in use"
    assert isinstance(room.place_pod(candidate()), placement.Allocation), "only the port is taken"
    assert capacity.place_pod(first, room) == "host port 8080/TCP in use"


# --- existing pods' required anti-affinity --------------------------------------------------------------

HOST_N = "topologyKey kubernetes.io/hostname=n"
GUARD_NS = builders.namespace("default", {"team": "a"})
OTHER_NS = builders.namespace("other", {"team": "b"})


def guard(*terms: Mapping[str, Any], node: str = "n", namespace: str = "default",
          more: builders.Mutator | None = None) -> dict[str, Any]:
    return builders.pod("guard", namespace=namespace, node=node, phase="Running",
                        mutate=both(anti(*terms), more or (lambda p: None)))


@pytest.mark.parametrize(
    ("guards", "labels", "namespace", "expected"),
    [
        pytest.param([guard(term())], {"app": "web"}, "default", HOST_N, id="hostname-term-selects-it"),
        pytest.param([guard(term())], {"app": "db"}, "default", None, id="labels-not-selected"),
        pytest.param([guard(term())], {"app": "web"}, "other", None, id="own-namespace-only-by-default"),
        pytest.param([guard(term(namespaces=["other"]))], {"app": "web"}, "other", HOST_N, id="named-namespace"),
        pytest.param([guard(term(namespaces=["other"]))], {"app": "web"}, "default", None,
                     id="named-namespaces-replace-its-own"),
        pytest.param([guard(term(namespaceSelector={}))], {"app": "web"}, "other", HOST_N,
                     id="empty-namespace-selector-every-namespace"),
        pytest.param([guard(term(namespaceSelector={"matchLabels": {"team": "b"}}))], {"app": "web"}, "other",
                     HOST_N, id="namespace-selector-selects"),
        pytest.param([guard(term(namespaceSelector={"matchLabels": {"team": "b"}}))], {"app": "web"}, "default",
                     None, id="namespace-selector-replaces-its-own"),
        pytest.param([guard(term(namespaces=["default"], namespaceSelector={"matchLabels": {"team": "b"}}))],
                     {"app": "web"}, "default", HOST_N, id="named-and-selected-namespaces-add-up"),
        pytest.param([guard(term(selector=None))], {"app": "web"}, "default", None, id="no-label-selector-no-pod"),
        pytest.param([guard(term(selector={}))], {}, "default", HOST_N, id="empty-label-selector-every-pod"),
        pytest.param([guard(term(selector={"matchExpressions": [
                         {"key": "app", "operator": "NotIn", "values": ["db"]}]}))], {}, "default",
                     HOST_N, id="not-in-selects-missing-label"),
        pytest.param([guard(term(), node="m")], {"app": "web"}, "default", None, id="hostname-term-on-another-node"),
        pytest.param([guard(term(), more=lambda p: p["status"].update(phase="Succeeded"))], {"app": "web"},
                     "default", None, id="finished-guard-rules-nothing"),
        pytest.param([guard(term(), more=lambda p: p["metadata"].update(
                         deletionTimestamp="2026-11-21T10:05:00Z"))],
                     {"app": "web"}, "default", HOST_N,
                     id="terminating-guard-still-counts"),
    ],
)
def test_existing_pods_anti_affinity(guards: list[dict[str, Any]], labels: dict[str, str], namespace: str,
                                     expected: str | None) -> None:
    nodes = [NODE, builders.gpu_node("m", gpus=8)]
    node = build(nodes, guards, [GUARD_NS, OTHER_NS]).nodes["n"]
    got = capacity.refuses(candidate(labels=labels, namespace=namespace), node)
    assert got == (None if expected is None else
                   f"pod default/guard has required anti-affinity against it ({expected})")


def zone_node(name: str, zone: str | None, *, gpus: int = 8) -> dict[str, Any]:
    labels = {ZONE: zone} if zone else {}
    if gpus:
        return builders.gpu_node(name, gpus=gpus, labels=labels)
    return {"metadata": {"name": name, "labels": {HOST: name, **labels}}, "status": {"allocatable": {"cpu": "8"}}}


@pytest.mark.parametrize(
    ("guard_node", "expected"),
    [
        pytest.param("cpu-a", {"gpu-a1": True, "gpu-a2": True, "gpu-b": False, "gpu-none": False},
                     id="guard-on-a-cpu-node-covers-its-zone"),
        pytest.param("gpu-b", {"gpu-a1": False, "gpu-a2": False, "gpu-b": True, "gpu-none": False},
                     id="guard-on-a-gpu-node"),
        pytest.param("cpu-none", {"gpu-a1": False, "gpu-a2": False, "gpu-b": False, "gpu-none": False},
                     id="guard-node-without-the-label-rules-nothing"),
    ],
)
def test_anti_affinity_covers_the_topology_domain(guard_node: str, expected: dict[str, bool]) -> None:
    nodes = [zone_node("gpu-a1", "a"), zone_node("gpu-a2", "a"), zone_node("gpu-b", "b"), zone_node("gpu-none", None),
             zone_node("cpu-a", "a", gpus=0), zone_node("cpu-none", None, gpus=0)]
    snap = build(nodes, [guard(term(key=ZONE), node=guard_node)], [GUARD_NS])
    pod = candidate(labels={"app": "web"})
    assert {name: capacity.refuses(pod, node) is not None for name, node in snap.nodes.items()} == expected


# --- release never places where these filters say no ---------------------------------------------------


def test_explain_places_around_ports_and_anti_affinity() -> None:
    nodes = [builders.gpu_node(n, gpus=8) for n in ("a-port", "b-anti", "c-free")]
    holders = [builders.pod("web", node="a-port", phase="Running", mutate=WANTS_8080),
               guard(term(), node="b-anti")]
    snap = build(nodes, holders, [GUARD_NS])
    pod = candidate(labels={"app": "web"}, mutate=WANTS_8080)
    rows = layout.explain(pod, snap, scoring=settings.Scoring())
    assert [(name, ok) for name, ok, _ in rows] == [("c-free", True), ("a-port", False), ("b-anti", False)]
    assert rows[1][2] == "host port 8080/TCP in use"
    assert rows[2][2] == "pod default/guard has required anti-affinity against it (topologyKey " \
                         "kubernetes.io/hostname=b-anti)"
    assert layout.candidates(pod, snap) == {"c-free"}
    assert layout.candidates(candidate(labels={"app": "db"}), snap) == {"a-port", "b-anti", "c-free"}


def test_a_gang_whose_members_share_a_host_port_goes_on_two_nodes() -> None:
    snap = build([builders.gpu_node(n, gpus=8) for n in ("x", "y")],
                 [builders.pod(f"m{i}", gpus=2, mutate=WANTS_8080) for i in range(2)])
    members = [snap.pods["default/m0"], snap.pods["default/m1"]]
    cands = {p.key: layout.candidates(p, snap) for p in members}
    found = layout.place(members, cands, layout.rooms(snap), frozenset(snap.nodes),
                                scoring=settings.Scoring())
    assert found is not None
    assert sorted(found[0].nodes.values()) == ["x", "y"], "one node would refuse the second member's port"


@pytest.mark.parametrize(
    ("holders", "same"),
    [
        pytest.param([], True, id="no-anti-affinity-anywhere-labels-do-not-split-the-cache"),
        pytest.param([guard(term())], False, id="anti-affinity-somewhere-labels-count"),
    ],
)
def test_cache_key_reads_labels_only_where_they_can_matter(holders: list[dict[str, Any]], same: bool) -> None:
    snap = build([NODE], holders)
    web, db = candidate(labels={"app": "web"}), candidate(labels={"app": "db"})
    assert (capacity.key(web, snap) == capacity.key(db, snap)) is same
    assert capacity.key(candidate(mutate=WANTS_8080), snap) != capacity.key(candidate(), snap), "ports always count"


def test_never_pod_reads_the_pods_own_filters_first_and_every_clashing_port() -> None:
    snap = build([NODE], [builders.pod("web", node="n", phase="Running", mutate=ports(
        {"containerPort": 80, "hostPort": 8080}, {"containerPort": 81, "hostPort": 8081}))])
    both_ports = ports({"containerPort": 80, "hostPort": 8080}, {"containerPort": 81, "hostPort": 8081})
    assert capacity.never_pod(candidate(mutate=both_ports), snap.nodes["n"]) == "host port 8080/TCP, 8081/TCP in use"
    elsewhere = both(both_ports, lambda p: p["spec"].update(nodeSelector={"pool": "x"}))
    assert capacity.never_pod(candidate(mutate=elsewhere), snap.nodes["n"]) == "nodeSelector pool=x does not match"
    assert capacity.key(candidate(mutate=elsewhere), snap) != capacity.key(candidate(mutate=both_ports), snap)
