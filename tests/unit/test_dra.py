"""The DRA GPU model (common/dra.py) and its place in the one capacity model: a node's GPUs are a device plugin's or
its DRA devices, taken devices come from claims' allocations, a pod's GPUs from its extended resources and claims."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

from admission import gating, mutation
from common import capacity, dra, placement, settings, snapshot, snapshot_build
from descheduler import protections
from tests import builders as b

GPU_CLASSES = ("gpu.nvidia.com",)
NAMES = settings.Names()
TWO_DOMAINS = [range(4), range(4, 8)]


def inventory(*, classes: Sequence[dict[str, Any]] = (), slices: Sequence[dict[str, Any]] = (),
              claims: Sequence[dict[str, Any]] = (), templates: Sequence[dict[str, Any]] = (),
              rules: Sequence[dict[str, Any]] = (), served: bool = True) -> dra.Inventory:
    return dra.build(device_classes=classes or [b.device_class()], slices=slices, claims=claims, templates=templates,
                     taint_rules=rules, gpu_classes=GPU_CLASSES, served=served)


def cluster(*, nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]] = (),
            inv: dra.Inventory) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, names=NAMES, taken_at=0.0, inventory=inv)


def free(cluster_: snapshot.Snapshot, node: str) -> tuple[int, tuple[tuple[int, ...], ...]]:
    n = cluster_.nodes[node]
    return n.free_gpus, n.free_by_domain()


def _taint(effect: str) -> b.Mutator:
    def mutate(device: dict[str, Any]) -> None:
        device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": effect}]
    return mutate


def _rule(**selector: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "drain"},
            "spec": {"deviceSelector": selector, "taint": {"key": "maintenance", "effect": "NoSchedule"}}}


# --- which devices are a node's GPUs, and which are free --------------------------------------------------------


@pytest.mark.parametrize(("nodes", "objects", "node", "expected", "problem"), [
    pytest.param([b.gpu_node("n", gpus=8, domains=TWO_DOMAINS)], dict(slices=[b.resource_slice("n", 8)]), "n",
                 (8, ((0, 1, 2, 3), (4, 5, 6, 7))), "8 DRA GPU devices beside a device plugin's GPUs",
                 id="node-with-device-plugin-gpus-and-dra-devices-counts-the-device-plugin-only"),
    pytest.param([b.dra_node("n")], dict(slices=[b.resource_slice("n", 8, driver="gpu.example.com")]), "n",
                 None, None, id="slice-of-another-driver-is-no-gpu"),
    pytest.param([b.dra_node("n")], dict(slices=[b.resource_slice(
                     "n", [b.gpu_device(i, kind="mig") for i in range(8)])]), "n",
                 None, None, id="devices-the-class-does-not-select-mig-are-no-gpus"),
    pytest.param([b.dra_node("n", domains=TWO_DOMAINS)], dict(slices=[
                     b.resource_slice("n", 8, generation=1), b.resource_slice("n", 4, generation=2)]), "n",
                 (4, ((0, 1, 2, 3), ())), None, id="only-the-newest-generation-of-a-pool-counts"),
    pytest.param([b.dra_node("n")], dict(slices=[b.resource_slice("n", 4, count=2)]), "n",
                 None, "pool gpu.nvidia.com/n generation 1: 1 of 2 slices seen",
                 id="incomplete-generation-is-not-counted"),
    pytest.param([b.dra_node("n", domains=TWO_DOMAINS)], dict(slices=[
                     b.resource_slice("n", [b.gpu_device(i) for i in range(4)], count=2, name="a"),
                     b.resource_slice("n", [b.gpu_device(i) for i in range(4, 8)], count=2, name="b")]), "n",
                 (8, ((0, 1, 2, 3), (4, 5, 6, 7))), None, id="pool-of-two-complete-slices"),
    pytest.param([b.dra_node("n", domains=TWO_DOMAINS)], dict(
                     slices=[b.resource_slice("n", 8)], claims=[b.resource_claim("c", devices=[("n", 5)])]), "n",
                 (7, ((0, 1, 2, 3), (4, 6, 7))), None, id="claim-allocated-but-reserved-for-nobody-takes-its-device"),
    pytest.param([b.dra_node("n", domains=TWO_DOMAINS)], dict(slices=[b.resource_slice(
                     "n", [b.gpu_device(i, mutate=_taint("NoSchedule") if i == 0 else None) for i in range(8)])]),
                 "n", (7, ((1, 2, 3), (4, 5, 6, 7))), None, id="device-tainted-noschedule-is-not-free"),
    pytest.param([b.dra_node("n", domains=TWO_DOMAINS)], dict(slices=[b.resource_slice(
                     "n", [b.gpu_device(i, mutate=_taint("None") if i == 0 else None) for i in range(8)])]),
                 "n", (8, ((0, 1, 2, 3), (4, 5, 6, 7))), None, id="device-taint-effect-none-is-informational"),
    pytest.param([b.dra_node("n", domains=TWO_DOMAINS)], dict(
                     slices=[b.resource_slice("n", 8)], rules=[_rule(driver="gpu.nvidia.com", device="gpu-7")]),
                 "n", (7, ((0, 1, 2, 3), (4, 5, 6))), None, id="device-tainted-by-a-devicetaintrule-is-not-free"),
    pytest.param([b.dra_node("n")], dict(classes=[b.device_class(expression="device.attributes['gpu.nvidia.com']"
                                                                                ".productName.startsWith('H')")],
                                              slices=[b.resource_slice("n", 8)]), "n",
                 None, "not understood", id="class-selector-the-model-cannot-read-counts-nothing"),
    pytest.param([b.dra_node("n", domains=TWO_DOMAINS)], dict(slices=[b.resource_slice("n", 8)]), "n",
                 (8, ((0, 1, 2, 3), (4, 5, 6, 7))), None, id="dra-node-offers-its-devices"),
])
def test_node_gpus(nodes: list[dict[str, Any]], objects: dict[str, Any], node: str,
                   expected: tuple[int, tuple[tuple[int, ...], ...]] | None, problem: str | None) -> None:
    built = cluster(nodes=nodes, inv=inventory(**objects))  # built here, not at collection (mutation runs)
    if expected is None:
        assert node not in built.nodes  # no GPUs: not a GPU node
    else:
        assert free(built, node) == expected
    if problem:
        assert any(problem in p for p in built.problems), built.problems
    else:
        assert not built.problems


def test_claims_say_which_devices_each_pod_holds() -> None:
    """The allocation is read, not estimated: a 4-GPU pod the allocator spread over both domains (first fit after
    a 1- and a 2-GPU pod, seen on 1.37.2) holds 3, 4, 5, 6."""
    pods = [
        b.pod("one", gpus=1, node="n", phase="Running", mutate=b.with_extended_claim("one-x")),
        b.pod("two", node="n", phase="Running", mutate=b.with_claim_template("t2", generated="two-gpus")),
        b.pod("four", gpus=4, node="n", phase="Running", mutate=b.with_extended_claim("four-x")),
    ]
    inv = inventory(slices=[b.resource_slice("n", 8)], templates=[b.claim_template("t2", spec=b.claim_spec(2))],
                    claims=[b.resource_claim("one-x", devices=[("n", 0)], reserved_for=["one"], extended=True),
                            b.resource_claim("two-gpus", spec=b.claim_spec(2), devices=[("n", 1), ("n", 2)],
                                             reserved_for=["two"]),
                            b.resource_claim("four-x", spec=b.claim_spec(4), devices=[("n", i) for i in (3, 4, 5, 6)],
                                             reserved_for=["four"], extended=True)])
    built = cluster(nodes=[b.dra_node("n", domains=TWO_DOMAINS)], pods=pods, inv=inv)
    # `measured` (what a measurement of the pod expects to see) counts the claims' GPUs too: its containers hold them.
    got = {k: (p.gpu_indices, p.indices_observed, p.request.full, p.measured.full) for k, p in built.pods.items()}
    assert got == {"default/one": ((0,), True, 1, 1), "default/two": ((1, 2), True, 2, 2),
                   "default/four": ((3, 4, 5, 6), True, 4, 4)}
    assert free(built, "n") == (1, ((), (7,)))


def test_a_finished_pods_claim_still_holds_its_device() -> None:
    pods = [b.pod("done", node="n", phase="Succeeded", mutate=b.with_claim_template("t", generated="done-gpus"))]
    inv = inventory(slices=[b.resource_slice("n", 8)], templates=[b.claim_template("t")],
                    claims=[b.resource_claim("done-gpus", devices=[("n", 2)], reserved_for=["done"])])
    assert free(cluster(nodes=[b.dra_node("n", domains=TWO_DOMAINS)], pods=pods, inv=inv), "n") == (
        7, ((0, 1, 3), (4, 5, 6, 7)))


# --- what a pod asks --------------------------------------------------------------------------------------------

TEMPLATES = [b.claim_template("four", spec=b.claim_spec(4)), b.claim_template("other", spec=b.claim_spec(
    2, device_class_name="nic.example.com")), b.claim_template("all", spec=b.claim_spec(mode="All")),
    b.claim_template("admin", spec=b.claim_spec(1, admin=True)),
    b.claim_template("choice", spec={"devices": {"requests": [{"name": "gpus", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}]}]}})]
CLAIMS = [b.resource_claim("shared", spec=b.claim_spec(1))]


@pytest.mark.parametrize(("mutate", "served", "count", "left"), [
    pytest.param(b.with_claim("shared"), True, 0, "claim default/shared is a ResourceClaim of its own (it may be "
                 "shared)", id="shared-claim-left-to-kube-scheduler"),
    pytest.param(b.with_claim_template("choice"), True, 0, "claim template default/choice request gpus: "
                 "firstAvailable (the scheduler picks the alternative)", id="first-available-left-to-kube-scheduler"),
    pytest.param(b.with_claim_template("all"), True, 0, "claim template default/all request gpus: allocationMode "
                 "All", id="all-mode-left-to-kube-scheduler"),
    pytest.param(b.with_claim_template("admin"), True, 0, "claim template default/admin request gpus: adminAccess",
                 id="admin-access-left-to-kube-scheduler"),
    pytest.param(b.with_claim_template("missing"), True, 0, "claim template default/missing not found",
                 id="missing-template-left-to-kube-scheduler"),
    pytest.param(b.with_claim_template("four"), False, 0, "spec.resourceClaims, and resource.k8s.io/v1 not read "
                 "(not served, or not granted)", id="dra-not-served-left-to-kube-scheduler"),
    pytest.param(b.with_claim_template("other"), True, 0, None, id="claim-of-a-class-that-is-no-gpu-counts-none"),
    pytest.param(b.with_claim_template("four"), True, 4, None, id="template-claim-of-four-gpus"),
    pytest.param(None, True, 0, None, id="no-claims"),
])
def test_pod_gpus(mutate: b.Mutator | None, served: bool, count: int, left: str | None) -> None:
    got = dra.pod_gpus(b.pod("p", mutate=mutate), inventory(templates=TEMPLATES, claims=CLAIMS, served=served),
                       annotation=NAMES.domain_claim)
    assert (got.count, got.left) == (count, left)


def _gpu(count: int | None = None, *, name: str = "gpus", device_class: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **({"count": count} if count else {})}}


TEAM_TEMPLATES = [
    b.claim_template("four", namespace="team", spec=b.claim_spec(4)),
    b.claim_template("two", namespace="team", spec=b.claim_spec(2)),
    b.claim_template("shape", namespace="team", spec={"devices": {"requests": [
        _gpu(3, name="nic", device_class="nic.example.com"), _gpu(name="a"), _gpu(2, name="b")]}}),
    b.claim_template("odd", namespace="team", spec={"devices": {"requests": ["gpus"]}}),
    b.claim_template("nic-choice", namespace="team", spec={"devices": {"requests": [
        {"name": "nic", "firstAvailable": [{"name": "x", "deviceClassName": "nic.example.com", "count": 1}]},
        _gpu(2)]}}),
]
TEAM_CLAIMS = [
    b.resource_claim("gen-four", namespace="team", spec=b.claim_spec(4), devices=[("node-a", i) for i in range(4, 8)]),
    b.resource_claim("gone-gen", namespace="team", spec=b.claim_spec(2), devices=[("node-a", 0), ("node-a", 1)]),
    b.resource_claim("own", namespace="team", spec=b.claim_spec(1), devices=[("node-b", 0)]),
    b.resource_claim("ext", namespace="team", extended=True, devices=[("node-c", 2)]),
    b.resource_claim("own-choice", namespace="team", spec={"devices": {"requests": [{"name": "gpus", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2}]}]}}),
    b.resource_claim("own-pending", namespace="team", spec=b.claim_spec(2)),
    {**b.resource_claim("p-a-mine", namespace="team", devices=[("node-a", 0), ("node-a", 1)], spec={"devices": {
        "requests": [{"name": "gpus", "firstAvailable": [{"name": "domain", "deviceClassName": "gpu.nvidia.com",
                                                          "count": 2},
                                                         {"name": "any", "deviceClassName": "gpu.nvidia.com",
                                                          "count": 2}]}]}})} | {"metadata": {
        "name": "p-a-mine", "namespace": "team", "ownerReferences": [{"kind": "Pod", "name": "p", "uid": "uid-p"}]}},
    b.resource_claim("p-a-job", namespace="team", spec=b.claim_spec(2)) | {"metadata": {
        "name": "p-a-job", "namespace": "team", "ownerReferences": [{"kind": "Job", "name": "p", "uid": "uid-p"}]}},
]
TEAM_TEMPLATES.append(b.claim_template("admin2", namespace="team", spec=b.claim_spec(2, admin=True)))


def _own(claim: str, template: str, *more: tuple[str, str], key: str = NAMES.domain_claim) -> b.Mutator:
    """A pod mutator: entry "a" points at `claim`, its claim of its own made from `template` (a record says so, in
    the annotation `key`: ours by default)."""
    def mutate(body: dict[str, Any]) -> None:
        _entries(("a", f"claim:{claim}"), *more)(body)
        body["metadata"].setdefault("annotations", {})[key] = dra.Record("a", claim, template).text()
    return mutate


def _on(pool: str, *indices: int) -> tuple[dra.DeviceId, ...]:
    return tuple(dra.DeviceId("gpu.nvidia.com", pool, f"gpu-{i}") for i in indices)


def _entries(*entries: tuple[str, str], generated: dict[str, str] | None = None,
             extended: str | None = None) -> b.Mutator:
    """A pod mutator: claim entries (entry name, "template:<name>" or "claim:<name>"), the claims made of them."""
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["resourceClaims"] = [
            {"name": entry, ("resourceClaimTemplateName" if ref.startswith("template:") else "resourceClaimName"):
             ref.split(":", 1)[1]} for entry, ref in entries]
        if generated:
            body["status"]["resourceClaimStatuses"] = [{"name": e, "resourceClaimName": c}
                                                        for e, c in generated.items()]
        if extended:
            body["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": extended, "requestMappings": []}
    return mutate


@pytest.mark.parametrize(("namespace", "mutate", "expected"), [
    pytest.param("team", _entries(("a", "template:four"), ("b", "template:two"), generated={"a": "gen-four"}),
                 dra.PodGpus(count=6, devices=_on("node-a", 4, 5, 6, 7), claims=("team/gen-four",), asks_gpus=True),
                 id="two-templates-add-up-and-the-made-claim-holds-its-devices"),
    pytest.param("team", _entries(("a", "claim:absent"), ("b", "template:four")),
                 dra.PodGpus(count=4, left="claim team/absent not found", asks_gpus=True),
                 id="a-missing-claim-is-said-and-the-next-entry-still-read"),
    pytest.param("team", _entries(("a", "template:deleted"), generated={"a": "gone-gen"}),
                 dra.PodGpus(count=2, devices=_on("node-a", 0, 1), claims=("team/gone-gen",), asks_gpus=True),
                 id="template-deleted-after-its-claim-was-made-read-from-the-claim"),
    pytest.param("team", _entries(("a", "template:shape")), dra.PodGpus(count=3, asks_gpus=True),
                 id="a-count-left-out-is-one-and-requests-of-other-classes-count-none"),
    pytest.param("team", _entries(("a", "template:odd"), ("b", "template:four")),
                 dra.PodGpus(count=4, left="claim template team/odd: a request that is no object", asks_gpus=True),
                 id="an-unreadable-request-is-said-and-the-rest-still-counted"),
    pytest.param("team", _entries(("a", "template:nic-choice")), dra.PodGpus(count=2, asks_gpus=True),
                 id="a-first-available-of-other-classes-is-skipped-not-the-end"),
    pytest.param("team", _entries(("a", "claim:own"), ("b", "template:two")),
                 dra.PodGpus(count=2, devices=_on("node-b", 0), claims=("team/own",), asks_gpus=True,
                             left="claim team/own is a ResourceClaim of its own (it may be shared)"),
                 id="a-claim-of-its-own-is-left-to-kube-scheduler-and-its-devices-held"),
    pytest.param("team", _entries(("a", "claim:own-choice")),
                 dra.PodGpus(left="claim team/own-choice request gpus: firstAvailable (the scheduler picks the "
                             "alternative)", asks_gpus=True),
                 id="a-claim-of-its-own-says-what-in-it-cannot-be-counted"),
    pytest.param("team", _entries(("a", "claim:own-pending")),
                 dra.PodGpus(left="claim team/own-pending is a ResourceClaim of its own (it may be shared)",
                             asks_gpus=True),
                 id="a-claim-of-its-own-not-yet-allocated-still-asks-gpus"),
    pytest.param("team", _entries(("a", "template:deleted"), ("b", "template:two")),
                 dra.PodGpus(count=2, left="claim template team/deleted not found", asks_gpus=True),
                 id="a-missing-template-is-said-and-the-next-entry-still-read"),
    pytest.param("team", _own("p-a-new", "shape", ("b", "template:two")),
                 dra.PodGpus(count=5, asks_gpus=True, domain_claim=True),
                 id="own-claim-not-made-yet-counted-from-its-template-and-the-next-entry-read"),
    pytest.param("team", _own("p-a-mine", "two"),
                 dra.PodGpus(count=2, devices=_on("node-a", 0, 1), claims=("team/p-a-mine",), asks_gpus=True,
                             domain_claim=True),
                 id="own-claim-made-asks-its-domain-first-and-holds-its-devices"),
    pytest.param("team", _own("p-a-job", "two"),
                 dra.PodGpus(left="claim team/p-a-job is a ResourceClaim of its own (it may be shared)",
                             asks_gpus=True),
                 id="a-claim-of-that-name-owned-by-no-pod-is-not-ours"),
    pytest.param("team", _own("p-a-new", "admin2"),
                 dra.PodGpus(left="claim template team/admin2 (of claim team/p-a-new) request gpus: adminAccess",
                             asks_gpus=True, domain_claim=True),
                 id="own-claim-whose-template-cannot-be-counted-says-which"),
    pytest.param("team", _entries(extended="ext"),
                 dra.PodGpus(devices=_on("node-c", 2), claims=("team/ext",), asks_gpus=True),
                 id="the-schedulers-extended-resource-claim-holds-devices"),
    pytest.param("other", _entries(("a", "template:four")),
                 dra.PodGpus(left="claim template other/four not found"),
                 id="templates-are-read-in-the-pods-namespace"),
])
def test_pod_gpus_reads_every_claim_entry(namespace: str, mutate: b.Mutator, expected: dra.PodGpus) -> None:
    inv = inventory(templates=TEAM_TEMPLATES, claims=TEAM_CLAIMS,
                    slices=[b.resource_slice(node, 8) for node in ("node-a", "node-b", "node-c")])
    assert dra.pod_gpus(b.pod("p", namespace=namespace, mutate=mutate), inv, annotation=NAMES.domain_claim) == expected


EXAMPLE = settings.Names(prefix="example.com/")
OTHERS = "other.example/domain-claim"  # another product's annotation, of our suffix


def _beside(key: str, value: str, mutate: b.Mutator) -> b.Mutator:
    """`mutate`, with the annotation `key` set to `value` first (earlier in the pod's annotations)."""
    def both(body: dict[str, Any]) -> None:
        body["metadata"]["annotations"] = {key: value}
        mutate(body)
    return both


# Only our configured annotation (`settings.Names.domain_claim`) says a claim entry is a claim of the pod's own: read
# by another key, the entry is a claim the pod names (not made yet: not found; made: left to kube-scheduler).
@pytest.mark.parametrize(("names", "mutate", "expected"), [
    pytest.param(NAMES, _own("p-a-new", "two"), dra.PodGpus(count=2, asks_gpus=True, domain_claim=True),
                 id="ours-under-the-default-prefix-read"),
    pytest.param(EXAMPLE, _own("p-a-new", "two", key=EXAMPLE.domain_claim),
                 dra.PodGpus(count=2, asks_gpus=True, domain_claim=True), id="ours-under-a-configured-prefix-read"),
    pytest.param(NAMES, _own("p-a-new", "two", key=OTHERS), dra.PodGpus(left="claim team/p-a-new not found"),
                 id="another-products-domain-claim-not-ours"),
    pytest.param(NAMES, _own("p-a-mine", "two", key=OTHERS),
                 dra.PodGpus(devices=_on("node-a", 0, 1), claims=("team/p-a-mine",), asks_gpus=True,
                             left="claim team/p-a-mine request gpus: firstAvailable (the scheduler picks the "
                             "alternative)"),
                 id="another-products-record-of-a-made-claim-not-ours"),
    pytest.param(EXAMPLE, _own("p-a-new", "two"), dra.PodGpus(left="claim team/p-a-new not found"),
                 id="the-default-prefix-not-ours-when-another-is-configured"),
    pytest.param(NAMES, _beside(OTHERS, dra.Record("a", "p-a-mine", "four").text(), _own("p-a-new", "two")),
                 dra.PodGpus(count=2, asks_gpus=True, domain_claim=True),
                 id="ours-read-beside-another-products-record-of-the-same-entry"),
    pytest.param(NAMES, _beside(OTHERS, "{not json", _own("p-a-new", "two")),
                 dra.PodGpus(count=2, asks_gpus=True, domain_claim=True),
                 id="ours-read-beside-another-products-unreadable-one"),
])
def test_only_our_configured_annotation_is_read(names: settings.Names, mutate: b.Mutator,
                                                expected: dra.PodGpus) -> None:
    inv = inventory(templates=TEAM_TEMPLATES, claims=TEAM_CLAIMS, slices=[b.resource_slice("node-a", 8)])
    pod = b.pod("p", namespace="team", mutate=mutate)
    assert dra.pod_gpus(pod, inv, annotation=names.domain_claim) == expected
    assert snapshot.gpu_requests(pod, inv, names=names)[2] == expected, "the snapshot reads it by its names too"


def test_implicit_extended_resource_name_is_a_gpu() -> None:
    pod = b.pod("p", mutate=lambda p: p["spec"]["containers"][0].__setitem__(
        "resources", {"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2", "cpu": "1"}}))
    request, requests, _ = snapshot.gpu_requests(pod, inventory(classes=[b.device_class(extended=None)]), names=NAMES)
    assert (request.full, requests) == (2, {"nvidia.com/gpu": 2, "cpu": 1000})


# --- where a pod may go -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pod", "classes", "node", "why"), [
    pytest.param(b.pod("p", gpus=4), [b.device_class(extended=None)], b.dra_node("n"),
                 "asks nvidia.com/gpu; the node's GPUs are DRA devices and no GPU DeviceClass of "
                 "dra.gpu_device_classes serves that name",
                 id="extended-request-no-deviceclass-maps-it"),
    pytest.param(b.pod("p", mutate=b.with_claim_template("four")), [b.device_class()], b.gpu_node("n", gpus=8),
                 "asks 4 GPU of DRA device classes; the node's GPUs are a device plugin's",
                 id="claim-pod-on-a-device-plugin-node"),
    pytest.param(b.pod("p", gpus=4), [b.device_class()], b.dra_node("n"), None,
                 id="extended-request-served-by-the-gpu-class"),
    pytest.param(b.pod("p", mutate=b.with_claim_template("four")), [b.device_class()], b.dra_node("n"), None,
                 id="claim-pod-on-a-dra-node"),
    pytest.param(b.pod("p", gpus=4), [b.device_class()], b.gpu_node("n", gpus=8), None,
                 id="extended-request-on-a-device-plugin-node"),
])
def test_never(pod: dict[str, Any], classes: list[dict[str, Any]], node: dict[str, Any], why: str | None) -> None:
    inv = inventory(classes=classes, slices=[b.resource_slice("n", 8)], templates=TEMPLATES)
    built = cluster(nodes=[node], pods=[pod], inv=inv)
    assert capacity.never_pod(built.pods["default/p"], built.nodes["n"]) == why


# --- admission and reclaim --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mutate", "add", "reason"), [
    pytest.param(b.with_claim_template("choice"), False, "claim template default/choice request gpus: firstAvailable "
                 "(the scheduler picks the alternative): DRA claims left to kube-scheduler, not placed at release",
                 id="unevaluable-claims-never-gated"),
    pytest.param(b.with_claim("shared"), False, "claim default/shared is a ResourceClaim of its own (it may be "
                 "shared): DRA claims left to kube-scheduler, not placed at release", id="shared-claim-never-gated"),
    pytest.param(b.with_claim_template("four"), True, "placed at release (Lease ns/lease renewed 0s ago)",
                 id="template-claim-pod-gated-for-release"),
])
def test_gating(mutate: b.Mutator, add: bool, reason: str) -> None:
    pod = b.pod("p", annotations={NAMES.placement: "strict"}, mutate=mutate)
    inv = inventory(templates=TEMPLATES, claims=CLAIMS)
    request, _, claims = snapshot.gpu_requests(pod, inv, names=NAMES)
    decision = gating.decide(pod=pod, request=request, placement=settings.Placement.STRICT,
                             controller=gating.Controller(seen_at=0.0, lease="ns/lease"), config=settings.Settings(),
                             now=0.0, pod_groups={}, claims=claims)
    assert (decision.add, decision.reason) == (add, reason)


@pytest.mark.parametrize(("mutate", "gpus", "claims", "why"), [
    pytest.param(b.with_claim("shared"), 0, [b.resource_claim("shared", devices=[("n", 0)], reserved_for=["p"])],
                 "its DRA GPUs cannot be counted (claim default/shared is a ResourceClaim of its own (it may be "
                 "shared))", id="shared-claim-never-a-victim"),
    pytest.param(b.with_extended_claim("p-x"), 1,
                 [b.resource_claim("p-x", devices=[("n", 0), ("n", 1)], reserved_for=["p"], extended=True)],
                 "holds 2 DRA GPU devices (gpu.nvidia.com/n/gpu-0, gpu.nvidia.com/n/gpu-1) but is counted for 1 GPU",
                 id="more-devices-than-counted-never-a-victim"),
    pytest.param(b.with_claim_template("four", generated="p-gpus"), 0,
                 [b.resource_claim("p-gpus", spec=b.claim_spec(4), devices=[("n", i) for i in range(4)],
                                   reserved_for=["p"])], None, id="template-claim-pod-may-be-a-victim"),
])
def test_reclaim_protection(mutate: b.Mutator, gpus: int, claims: list[dict[str, Any]], why: str | None) -> None:
    pod = b.pod("p", gpus=gpus, node="n", phase="Running", mutate=mutate)
    built = cluster(nodes=[b.dra_node("n")], pods=[pod],
                    inv=inventory(slices=[b.resource_slice("n", 8)], templates=TEMPLATES, claims=claims))
    assert protections.dra_uncounted(built.pods["default/p"], built.nodes["n"], NAMES) == why



# --- the cluster: two DRA nodes of 8 GPUs, a DeviceClass serving nvidia.com/gpu ---------------------------


def _dra_cluster(*pods: dict[str, Any]) -> snapshot.Snapshot:
    items = [b.device_class(), *(b.dra_node(f"dra-{i}", domains=TWO_DOMAINS) for i in range(2)),
             *(b.resource_slice(f"dra-{i}", 8) for i in range(2)), *b.tier_classes(), *pods,
             b.claim_template("four", spec=b.claim_spec(4)),
             b.claim_template("choice", spec=TEMPLATES[-1]["spec"]["spec"])]
    return snapshot_build.from_list({"kind": "List", "items": items}, names=NAMES, taken_at=0.0)


@pytest.mark.parametrize(("mutate", "gpus", "gated", "record"), [
    pytest.param(b.with_claim_template("choice"), 0, False, "resource claims left to kube-scheduler: claim template "
                 "default/choice request gpus: firstAvailable",
                 id="unevaluable-claims-get-a-tier-no-gate-and-a-reason"),
    pytest.param(None, 4, True, "placed at release", id="extended-resource-pod-is-gated-for-release"),
    pytest.param(b.with_claim_template("four"), 0, True, "4 of them through resource claims",
                 id="template-claim-pod-is-gated-for-release"),
])
def test_webhook_treats_dra_gpu_pods_as_gpu_pods(mutate: b.Mutator | None, gpus: int, gated: bool,
                                                  record: str) -> None:
    pod = b.pod("p", gpus=gpus, annotations={NAMES.placement: "strict"}, mutate=mutate)
    outcome = mutation.decide(operation="CREATE", namespace="default", pod=pod, cluster=_dra_cluster(),
                              config=settings.Settings(), now=0.0, controller_seen_at=0.0)
    assert (outcome.gated, outcome.tier, record in outcome.record) == (gated, "normal", True), outcome.record


@pytest.mark.parametrize("mutate", [pytest.param(None, id="extended-resource"),
                                    pytest.param(b.with_claim_template("four"), id="template-claim")])
def test_a_four_gpu_pod_fits_one_domain_of_a_dra_node(mutate: b.Mutator | None) -> None:
    """What the issue saw `explain` refuse ("no node can take it"): the capacity model now places it."""
    pod = b.pod("p", gpus=0 if mutate else 4, mutate=mutate)
    built = _dra_cluster(pod)
    placed = capacity.place_pod(built.pods["default/p"], capacity.Room.of(built.nodes["dra-0"]))
    assert isinstance(placed, placement.Allocation) and (placed.indices, placed.spanned) == ((0, 1, 2, 3), 1)


def test_a_rebuild_reads_a_claim_allocated_since_the_last_build() -> None:
    """The pod object is the same; its claim is allocated in between: the rebuild must not reuse the old parse."""
    pod = b.pod("p", node="n", phase="Running", mutate=b.with_claim_template("four", generated="p-gpus"))
    objects: dict[str, Any] = {"slices": [b.resource_slice("n", 8)], "templates": TEMPLATES}
    builder = snapshot_build.Builder(names=NAMES)
    stores = {"nodes": {"n": b.dra_node("n", domains=TWO_DOMAINS)}, "pods": {"default/p": pod}}
    first = builder.build(**stores, taken_at=0.0,
                          inventory=inventory(**objects, claims=[b.resource_claim("p-gpus", spec=b.claim_spec(4))]))
    second = builder.build(**stores, taken_at=0.0, inventory=inventory(**objects, claims=[b.resource_claim(
        "p-gpus", spec=b.claim_spec(4), devices=[("n", i) for i in (4, 5, 6, 7)], reserved_for=["p"])]))
    got = [(s.pods["default/p"].gpu_indices, s.pods["default/p"].indices_observed, len(s.pods["default/p"].dra.devices))
           for s in (first, second)]
    assert got == [((0, 1, 2, 3), False, 0), ((4, 5, 6, 7), True, 4)]


# --- DeviceClass selectors the model reads ------------------------------------------------------------------------

H100 = {"gpu.nvidia.com/type": "gpu", "gpu.nvidia.com/index": 3, "gpu.nvidia.com/virtual": False}


@pytest.mark.parametrize(("selectors", "driver", "attributes", "selects", "problem"), [
    pytest.param([{"cel": {"expression": "device.driver == 'a' || device.driver == 'b'"}}], "a", H100, False,
                 "DeviceClass c: selector \"device.driver == 'a' || device.driver == 'b'\" not understood (only "
                 "`device.driver ==` and `device.attributes[..].x ==` joined by &&); its devices are not counted",
                 id="a-disjunction-is-not-understood"),
    pytest.param([{"opaque": {}}], "gpu.nvidia.com", H100, False, "DeviceClass c: a selector that is no CEL expression",
                 id="a-selector-without-cel"),
    pytest.param(["device.driver == 'gpu.nvidia.com'"], "gpu.nvidia.com", H100, False,
                 "DeviceClass c: a selector that is no CEL expression", id="a-selector-that-is-no-object"),
    pytest.param([{"cel": {"expression": "device.attributes['gpu.nvidia.com'].index == 3"}}], "gpu.nvidia.com",
                 {**H100, "gpu.nvidia.com/index": "3"}, False, None, id="an-int-never-equals-a-string"),
    pytest.param([{"cel": {"expression": "device.attributes['gpu.nvidia.com'].virtual == false"}}], "gpu.nvidia.com",
                 {**H100, "gpu.nvidia.com/virtual": 0}, False, None, id="false-never-equals-zero"),
    pytest.param([{"cel": {"expression": "device.attributes['gpu.nvidia.com'].virtual == true"}}], "gpu.nvidia.com",
                 H100, False, None, id="bool-literal-true-against-false"),
    pytest.param([{"cel": {"expression": "device.attributes['gpu.nvidia.com'].virtual == false"}}], "gpu.nvidia.com",
                 H100, True, None, id="bool-literal-false"),
    pytest.param([{"cel": {"expression": "device.attributes['gpu.nvidia.com'].index == 3"}}], "gpu.nvidia.com",
                 H100, True, None, id="int-literal"),
    pytest.param([{"cel": {"expression": "device.attributes['gpu.nvidia.com'].index == -3"}}], "gpu.nvidia.com",
                 H100, False, None, id="negative-int-literal"),
    pytest.param([{"cel": {"expression": '(device.driver == "gpu.nvidia.com")'}}], "gpu.nvidia.com", H100, True, None,
                 id="double-quotes-in-parentheses"),
    pytest.param([{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}},
                  {"cel": {"expression": "device.attributes[\"gpu.nvidia.com\"].type == 'gpu'"}}], "other", H100,
                 False, None, id="every-selector-must-hold"),
    pytest.param([], "anything", {}, True, None, id="no-selector-selects-every-device"),
])
def test_class_selectors(selectors: list[Any], driver: str, attributes: dict[str, Any], selects: bool,
                         problem: str | None) -> None:
    got = dra.gpu_class({"metadata": {"name": "c"}, "spec": {"selectors": selectors}})
    assert (got.selects(driver, attributes), got.problem) == (selects, problem)


@pytest.mark.parametrize(("spec", "extended"), [
    pytest.param({}, "deviceclass.resource.kubernetes.io/c", id="implicit-name"),
    pytest.param({"extendedResourceName": "example.com/gpu"}, "example.com/gpu", id="explicit-name"),
])
def test_class_extended_resource_name(spec: dict[str, Any], extended: str) -> None:
    got = dra.gpu_class({"metadata": {"name": "c"}, "spec": spec})
    assert (got.name, got.extended_resource) == ("c", extended)


# --- the inventory itself: devices, their attributes, why one is not free, what is reported -------------------------


def _device(index: int, **attributes: dict[str, Any]) -> dict[str, Any]:
    return b.gpu_device(index, mutate=lambda d: d["attributes"].update(attributes))


@pytest.mark.parametrize(("objects", "devices", "problems"), [
    pytest.param(dict(slices=[b.resource_slice("n", [
        {"name": "odd"}, "not-a-device", b.gpu_device(0, kind="mig"), b.gpu_device(1),
        _device(2, **{"example.com/rack": {"string": "r1"}, "driverVersion": {"version": "1.2.3"},
                      "virtual": {"bool": False}, "broken": "no-type"})])]),
                 {"n": [("gpu-1", 1, None), ("gpu-2", 2, None)]}, [],
                 id="devices-the-class-skips-do-not-stop-the-slice"),
    pytest.param(dict(slices=[b.resource_slice("n", [b.gpu_device(0, mutate=_taint("NoExecute"))])],
                      rules=[_rule(pool="n", device="gpu-0")]),
                 {"n": [("gpu-0", 0, "tainted gpu.nvidia.com/xid=79:NoExecute")]}, [], id="slice-taint-reason-first"),
    pytest.param(dict(slices=[b.resource_slice("n", 2)], rules=[
        _rule(pool="n", device="gpu-1"), {"metadata": {"name": "no-selector"}, "spec": {"taint": {
            "key": "k", "effect": "NoSchedule"}}}, {"metadata": {"name": "informational"}, "spec": {
            "deviceSelector": {}, "taint": {"key": "k", "effect": "None"}}}]),
                 {"n": [("gpu-0", 0, None), ("gpu-1", 1, "tainted maintenance=:NoSchedule (DeviceTaintRule drain)")]},
                 [], id="rules-without-selector-or-blocking-effect-taint-nothing"),
    pytest.param(dict(slices=[b.resource_slice("a", 4, count=2), b.resource_slice("b", 2)]),
                 {"b": [("gpu-0", 0, None), ("gpu-1", 1, None)]},
                 ["pool gpu.nvidia.com/a generation 1: 1 of 2 slices seen; its devices are not counted until all are"],
                 id="an-incomplete-pool-does-not-hide-the-next"),
    pytest.param(dict(slices=[b.resource_slice("n", 1), {**b.resource_slice("n", 1, driver="gpu.nvidia.com"),
                                                         "metadata": {"name": "same-pool-other-driver"}} | {
        "spec": {**b.resource_slice("n", 1)["spec"], "driver": "other.example.com", "pool": {
            "name": "n", "generation": 5, "resourceSliceCount": 1}}}]),
                 {"n": [("gpu-0", 0, None)]}, [], id="pools-are-per-driver"),
    pytest.param(dict(slices=[{**b.resource_slice("n", 1), "spec": {**b.resource_slice("n", 1)["spec"],
                                                                      "nodeName": None, "allNodes": True}}]),
                 {}, ["device gpu.nvidia.com/n/gpu-0: no spec.nodeName; not counted"], id="a-device-of-no-node"),
    pytest.param(dict(slices=[{**b.resource_slice("n", 2), "spec": {**b.resource_slice("n", 2)["spec"],
                                                                      "nodeName": None, "allNodes": True}}]),
                 {}, [f"device gpu.nvidia.com/n/gpu-{i}: no spec.nodeName; not counted" for i in (0, 1)],
                 id="each-device-of-no-node-is-said"),
    pytest.param(dict(slices=[b.resource_slice("n", list(reversed([b.gpu_device(i) for i in range(12)])))]),
                 {"n": [(f"gpu-{i}", i, None) for i in range(12)]}, [], id="devices-in-index-order-past-ten"),
    pytest.param(dict(classes=[{**b.device_class(), "spec": {"selectors": [{"expression": "no cel key"}]}}],
                      slices=[b.resource_slice("n", 1)]),
                 {}, ["DeviceClass gpu.nvidia.com: a selector that is no CEL expression"],
                 id="a-class-selector-without-cel-is-said"),
    pytest.param(dict(classes=[b.device_class(expression="device.driver.startsWith('gpu')")],
                      slices=[b.resource_slice("a", 4, count=2)]), {},
                 ["DeviceClass gpu.nvidia.com: selector \"device.driver.startsWith('gpu')\" not understood (only "
                  "`device.driver ==` and `device.attributes[..].x ==` joined by &&); its devices are not counted",
                  "pool gpu.nvidia.com/a generation 1: 1 of 2 slices seen; its devices are not counted until all are"],
                 id="every-problem-is-reported"),
])
def test_inventory(objects: dict[str, Any], devices: dict[str, list[tuple[str, int, str | None]]],
                   problems: list[str]) -> None:
    got = inventory(**objects)
    assert ({n: [(d.id.device, d.index, d.blocked) for d in found] for n, found in got.devices.items()},
            list(got.problems), got.served) == (devices, problems, True)


def _admin_result(claim: dict[str, Any]) -> dict[str, Any]:
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    claim["status"]["reservedFor"].append({"resource": "jobs", "name": "j", "uid": "uid-job"})
    return claim


@pytest.mark.parametrize(("claim", "expected"), [
    pytest.param(b.resource_claim("c", namespace="team", devices=[("n", 0), ("n", 1)], reserved_for=["p"]),
                 dra.Claim("team", "c", _on("n", 0, 1), ("uid-p",), False), id="allocated-and-reserved"),
    pytest.param(_admin_result(b.resource_claim("c", devices=[("n", 0), ("n", 1)], reserved_for=["p"])),
                 dra.Claim("default", "c", _on("n", 1), ("uid-p",), False),
                 id="an-admin-access-result-holds-nothing-and-only-pods-are-users"),
    pytest.param(b.resource_claim("c", devices=[("n", 3), ("gone", 0)], extended=True),
                 dra.Claim("default", "c", _on("n", 3), (), True),
                 id="the-schedulers-claim-and-a-device-no-slice-lists"),
])
def test_claims(claim: dict[str, Any], expected: dra.Claim) -> None:
    assert inventory(slices=[b.resource_slice("n", 8)], claims=[claim]).claims[expected.key] == expected


def test_devices_are_in_index_order_and_an_index_that_is_no_number_is_none() -> None:
    got = inventory(slices=[b.resource_slice("n", [
        _device(1), b.gpu_device(9, mutate=lambda d: d["attributes"].update(index={"bool": True})),
        b.gpu_device(8, mutate=lambda d: d["attributes"].pop("index")), _device(0)])])
    assert [(d.id.device, d.index) for d in got.devices["n"]] == [
        ("gpu-0", 0), ("gpu-1", 1), ("gpu-8", None), ("gpu-9", None)]


@pytest.mark.parametrize(("expression", "counted"), [
    pytest.param("device.attributes['example.com'].rack == 'r1'", ["gpu-0"], id="another-domain-by-its-own-name"),
    pytest.param("device.attributes['gpu.nvidia.com'].virtual == false", ["gpu-1"],
                 id="an-unqualified-name-is-the-drivers"),
    pytest.param("device.attributes['gpu.nvidia.com'].driverVersion == '1.2.3'", ["gpu-0", "gpu-1"],
                 id="a-version-reads-as-its-text"),
    pytest.param("device.attributes['gpu.nvidia.com'].broken == 'no-type'", [], id="a-value-without-a-type-is-none"),
])
def test_a_class_selects_devices_by_their_attributes_qualified_names(expression: str, counted: list[str]) -> None:
    """An attribute is read by its qualified name: `<domain>/<name>` as given, an unqualified name in the driver's
    domain (Kubernetes' rule); its value is the one typed field it holds."""
    gpu = b.device_class(expression=f"device.driver == 'gpu.nvidia.com' && {expression}")
    common = {"driverVersion": {"version": "1.2.3"}, "broken": "no-type"}
    got = inventory(classes=[gpu], slices=[b.resource_slice("n", [
        _device(0, **common, **{"example.com/rack": {"string": "r1"}, "virtual": {"bool": True}}),
        _device(1, **common, **{"example.com/rack": {"string": "r2"}, "virtual": {"bool": False}})])])
    assert [d.id.device for d in got.devices.get("n", ())] == counted


def test_a_memo_reuses_what_did_not_change_and_builds_what_a_fresh_build_gives() -> None:
    """`dra.Memo`: the device half while the classes, slices and taint rules are the same objects; a claim's reading
    while its object and the device half are."""
    classes, slices = [b.device_class()], [b.resource_slice("d", 8)]
    kept, moved = b.resource_claim("kept", devices=[("d", 0)]), b.resource_claim("moved", devices=[("d", 1)])
    memo = dra.Memo()

    def built(claims: list[dict[str, Any]], slice_objects: list[dict[str, Any]] = slices) -> dra.Inventory:
        inventory = dra.build(device_classes=classes, slices=slice_objects, claims=claims,
                              gpu_classes=GPU_CLASSES, memo=memo)
        assert inventory == dra.build(device_classes=classes, slices=slice_objects, claims=claims,
                                      gpu_classes=GPU_CLASSES)
        return inventory

    built([kept, moved])
    devices, reading, old = memo.devices, memo.claims["default/kept"][1], memo.claims["default/moved"][1]
    moved = copy.deepcopy(moved)
    moved["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-5"
    assert built([kept, moved]).claims["default/moved"].devices[0].device == "gpu-5"
    assert memo.devices is devices and memo.claims["default/kept"][1] is reading
    assert memo.claims["default/moved"][1] is not old
    built([kept, moved], [copy.deepcopy(slices[0])])  # a new slice object, equal: read again, and its claims too
    assert memo.devices is not devices and memo.claims["default/kept"][1] is not reading
    assert list(memo.claims) == ["default/kept", "default/moved"]
    built([moved])
    assert list(memo.claims) == ["default/moved"]  # a claim gone is forgotten
