"""Which DRA devices inside a node a multi-GPU pod gets, and what a claim can do about it: facts from the real
control plane, on every Kubernetes version the project builds (issue 30 item 2).

Each test makes its own kwok node(s) with one ResourceSlice of 8 GPU devices `gpu-0`..`gpu-7` (NVIDIA's `index`
attribute 0-7, in that order in the slice), as two NVLink domains of 4: indices 0-3 and 4-7. No `nvidia.com/gpu`
in the node's allocatable: a DeviceClass `gpu.nvidia.com` with `extendedResourceName: nvidia.com/gpu` serves it.

Read first in `k8s.io/dynamic-resource-allocation/structured/internal/stable/allocator_stable.go` (v0.37.2):
`allocateOne` walks the pools, slices and devices in order and takes the first device not in use that the
request's selectors and the claim's constraints accept, backtracking only when a later device of the claim
finds none (a `matchAttribute` constraint therefore finds a set sharing the attribute if there is one); a
`firstAvailable` request tries its sub-requests in order and keeps the first that allocates; a constraint's
`requests` may name a sub-request as `<request>/<sub-request>`; a result's `request` names the sub-request so.
Feature gates (`pkg/features/kube_features.go`): `DRAPrioritizedList` is GA and on by default in 1.36 and locked
on in 1.37; `DRAExtendedResource` is beta and on by default in 1.36, GA and locked on in 1.37. The tests set no
feature gate.

The facts:
1. Without any constraint the allocator is first-fit in device order: after a 1-GPU pod took device 0 and a
   2-GPU pod devices 1-2, a 4-GPU pod gets devices 3,4,5,6 (both domains) while 4-7 was free — through the
   extended resource (`nvidia.com/gpu: 4`, the scheduler's own claim) and through a claim template alike. The
   order is the slice's, not the `index`: on an empty node whose slice lists 5,0,4,1,... a 4-GPU pod gets 0,1,4,5.
2. A claim whose request is `firstAvailable: [one domain, any 4 devices of the class]` gets the free domain
   (sub-request `domain`), whether the domain is said by a CEL selector on the planned domain's `index`
   values or by a `matchAttribute` constraint on that sub-request (where the driver publishes a domain
   attribute; NVIDIA's does not, for a node's own NVLink domains).
3. With no domain free but 4 devices free, the same claim falls back (sub-request `any`) and the pod runs on the
   same devices as a pod without the list; a claim with the one-domain request alone leaves the pod Pending.
4. A gated pod may name by `resourceClaimName` a claim that does not exist yet (the API server accepts it);
   created before the gate is removed, owned by the pod, the claim is allocated and reserved for the pod, and
   deleted with it (garbage collection). Un-gated before the claim exists, the pod waits until the claim is
   created (kube-scheduler's DynamicResources PreEnqueue keeps it out of the queue) and its PodScheduled
   condition still says `SchedulingGated` with no gate left: a path that lifts a gate without creating the
   claim strands the pod, and it looks held by someone else.
   A template that does not exist yet at the pod's creation is turned into the pod's claim once it appears.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from common import settings
from gpu_steward_lab import dra_devices, localcluster
from tests import builders
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
GATE = "e2e.gpu-steward.io/hold"
GROUP_LABEL = "e2e.gpu-steward.io/dra-facts-group"
CLASS = "gpu.nvidia.com"
INDEX = f"device.attributes['{CLASS}'].index"
DOMAIN_ATTRIBUTE = f"{CLASS}/nvlinkDomain"  # published by these tests' devices only (NVIDIA's driver has none)
DOMAINS = ((0, 1, 2, 3), (4, 5, 6, 7))
WAIT_SECONDS = 60  # generous: kube-scheduler decides in well under a second on an idle machine


def _start(version: str, pytestconfig: pytest.Config) -> localcluster.LocalCluster:
    say = conftest._progress(pytestconfig)
    problem: str | None = None
    try:
        bin_dir = localcluster.ensure_binaries(version=version, progress=say)
        cluster = localcluster.LocalCluster(bin_dir, progress=say).start()
    except localcluster.HarnessError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(f"the local Kubernetes {version} control plane is not available: {problem}", pytrace=False)
    try:
        assert cluster.server_version() == f"v{version}"
        cluster.apply([builders.device_class()])
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module", params=localcluster.KUBERNETES_VERSIONS, ids=lambda v: f"k8s-{v}")
def versioned_cluster(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config
) -> Iterator[localcluster.LocalCluster]:
    """One version's plain control plane (default feature gates) with the DeviceClass, shared by the module."""
    with localcluster.sigterm_as_interrupt():
        cluster = _start(request.param, pytestconfig)
        try:
            yield cluster
        finally:
            cluster.stop()


def _devices(*, domain_attribute: bool) -> list[dict[str, Any]]:
    def add_domain(index: int) -> Any:
        return lambda device: device["attributes"].update({"nvlinkDomain": {"int": index // 4}})

    return [builders.gpu_device(i, mutate=add_domain(i) if domain_attribute else None) for i in range(8)]


@dataclasses.dataclass
class Lab:
    """One test's namespace and DRA nodes; its pods select only its nodes (by a label and a node name)."""

    cluster: localcluster.LocalCluster
    namespace: str
    group: str
    node_names: list[str] = dataclasses.field(default_factory=list)

    def add_node(self, *, domain_attribute: bool = False, order: Sequence[int] = range(8)) -> str:
        """An 8-GPU DRA node (no `nvidia.com/gpu` in allocatable) with its ResourceSlice listing the GPUs in
        `order`; its name."""
        node = dra_devices.without_device_plugin(localcluster.gpu_node(
            f"dra-facts-{self.group}-{len(self.node_names)}", gpus=8, domains=2, product="NVIDIA-H100-80GB-HBM3",
            names=NAMES, cpu="64", memory="512Gi"))
        node["metadata"]["labels"][GROUP_LABEL] = self.group
        (name,) = self.cluster.add_nodes([node])
        devices = {d["attributes"]["index"]["int"]: d for d in _devices(domain_attribute=domain_attribute)}
        self.cluster.apply([builders.resource_slice(name, [devices[i] for i in order])])
        self.node_names.append(name)
        return name

    def pod(self, name: str, *, node: str, gpus: int = 0, template: str | None = None, claim: str | None = None,
            gated: bool = False) -> dict[str, Any]:
        body = kube.pod(name, namespace=self.namespace, gpus=gpus, gates=[GATE] if gated else (),
                        node_selector={GROUP_LABEL: self.group})
        # kwok nodes made by hand carry no hostname label: the node by its name.
        body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
        entry: dict[str, Any] = {"name": "gpus"}
        if template:
            entry["resourceClaimTemplateName"] = template
        if claim:
            entry["resourceClaimName"] = claim
        if template or claim:
            body["spec"]["resourceClaims"] = [entry]
            body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
        return body

    def create(self, *bodies: Mapping[str, Any]) -> None:
        for body in bodies:
            self.cluster.kubectl("create", "-n", self.namespace, "-f", "-", input=json.dumps(body))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        got = self.cluster.kubectl("get", kind, name, "-n", self.namespace, "-o", "json", "--ignore-not-found")
        return json.loads(got.stdout) if got.stdout.strip() else None

    def ungate(self, name: str) -> None:
        self.cluster.kubectl("patch", "pod", name, "-n", self.namespace, "--type=json",
                             "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]))

    def running(self, name: str) -> dict[str, Any]:
        """The pod as first seen Running with its claim allocated."""
        return kube.poll(f"{name} running with its claim", lambda: (
            pod if (pod := self.get("pod", name)) and (pod.get("status") or {}).get("phase") == "Running"
            and claim_of(pod) else None), timeout_seconds=WAIT_SECONDS)

    def unschedulable(self, name: str) -> dict[str, Any]:
        return kube.poll(f"{name} Unschedulable", lambda: (
            pod if (pod := self.get("pod", name)) and kube.scheduled_reason(pod) == "Unschedulable" else None),
            timeout_seconds=WAIT_SECONDS)

    def allocation(self, pod: Mapping[str, Any]) -> Allocation:
        claim = self.get("resourceclaim", claim_of(pod))
        assert claim is not None
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        return Allocation(
            indices=tuple(sorted(int(r["device"].removeprefix("gpu-")) for r in results)),
            requests=tuple(sorted({str(r["request"]) for r in results})),
            users=tuple(str(r["name"]) for r in status.get("reservedFor") or ()))

    def fill(self, node: str, *indices: int) -> None:
        """Take devices `indices` of `node` with one running 1-GPU pod each (a claim selecting that index)."""
        for index in indices:
            name = f"fill-{node.rsplit('-', 1)[-1]}-{index}"
            self.create(claim(name, requests=[exactly(1, f"{INDEX} == {index}")]),
                        self.pod(name, node=node, claim=name))
            assert self.allocation(self.running(name)).indices == (index,)


@dataclasses.dataclass(frozen=True)
class Allocation:
    indices: tuple[int, ...]  # GPU indices of the allocated devices
    requests: tuple[str, ...]  # the (sub-)requests they were allocated for
    users: tuple[str, ...]  # names of the pods the claim is reserved for


def claim_of(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    made = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or () if s.get("resourceClaimName")]
    named = [e["resourceClaimName"] for e in (pod.get("spec") or {}).get("resourceClaims") or ()
             if e.get("resourceClaimName")]
    return str(extended or (made or named or [""])[0])


def exactly(count: int, *selectors: str) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": CLASS, "allocationMode": "ExactCount", "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return body


def one_domain_first(count: int, *, domain: Sequence[int] | None) -> dict[str, Any]:
    """A claim spec: `count` devices of one domain (`domain`: its indices, by a selector; None: any domain, by a
    `matchAttribute` constraint on the domain attribute), else any `count` devices of the class."""
    selectors = [f"{INDEX} in {list(domain)}"] if domain is not None else []
    spec: dict[str, Any] = {"requests": [{"name": "gpus", "firstAvailable": [
        {"name": "domain", **exactly(count, *selectors)}, {"name": "any", **exactly(count)}]}]}
    if domain is None:
        spec["constraints"] = [{"requests": ["gpus/domain"], "matchAttribute": DOMAIN_ATTRIBUTE}]
    return spec


def claim(name: str, *, requests: Sequence[Mapping[str, Any]] = (),
          devices: Mapping[str, Any] | None = None, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    spec = dict(devices) if devices else {"requests": [{"name": "gpus", "exactly": dict(r)} for r in requests]}
    body: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": name}, "spec": {"devices": spec}}
    if owner:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner["metadata"]["name"],
                                                "uid": owner["metadata"]["uid"]}]
    return body


def template(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly(count)}]}}}}


@pytest.fixture
def lab(versioned_cluster: localcluster.LocalCluster) -> Iterator[Lab]:
    with lab_in(versioned_cluster) as lab:
        yield lab


@contextlib.contextmanager
def lab_in(cluster: localcluster.LocalCluster) -> Iterator[Lab]:
    namespace = f"dra-facts-{secrets.token_hex(4)}"
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=30s")
    lab = Lab(cluster, namespace, secrets.token_hex(3))
    try:
        yield lab
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        for name in lab.node_names:
            cluster.kubectl("delete", "resourceslice", f"{name}-{CLASS}-1", "--ignore-not-found", check=False)
        if lab.node_names:
            cluster.kubectl("delete", "node", *lab.node_names, "--wait=false", check=False)


# --- fact 1: without a constraint, first fit in device order -----------------------------------------------


@pytest.mark.parametrize("four", ["extended", "template"])
def test_without_a_constraint_a_4_gpu_pod_spans_both_domains_while_one_is_free(lab: Lab, four: str) -> None:
    node = lab.add_node()
    lab.create(template("two", 2), template("four", 4))
    lab.create(lab.pod("one", node=node, gpus=1))
    assert lab.allocation(lab.running("one")).indices == (0,)
    lab.create(lab.pod("two", node=node, template="two"))
    assert lab.allocation(lab.running("two")).indices == (1, 2)

    lab.create(lab.pod("four", node=node, **({"gpus": 4} if four == "extended" else {"template": "four"})))
    got = lab.allocation(lab.running("four"))
    # The scheduler names its extended-resource claim's request after the container's resource (seen:
    # `container-0-request-2`); the template's request is `gpus`.
    assert (got.indices, got.users, len(got.requests)) == ((3, 4, 5, 6), ("four",), 1)
    assert "/" not in got.requests[0]
    if four == "template":
        assert got.requests == ("gpus",)


@pytest.mark.parametrize(("order", "expected"), [
    pytest.param((7, 6, 5, 4, 3, 2, 1, 0), (4, 5, 6, 7), id="listed-backwards"),
    pytest.param((5, 0, 4, 1, 6, 2, 7, 3), (0, 1, 4, 5), id="listed-across-domains"),
])
def test_first_fit_follows_the_slices_order_not_the_index(lab: Lab, order: tuple[int, ...],
                                                          expected: tuple[int, ...]) -> None:
    """NVIDIA's driver fills its slice from a Go map: the order the allocator walks is the slice's."""
    node = lab.add_node(order=order)
    lab.create(lab.pod("four", node=node, gpus=4))
    assert lab.allocation(lab.running("four")).indices == expected


# --- fact 2: a prioritized list keeps the pod in a free domain ------------------------------------------------


@pytest.mark.parametrize("how", ["index-selector", "match-attribute"])
def test_a_one_domain_first_claim_gets_the_free_domain(lab: Lab, how: str) -> None:
    node = lab.add_node(domain_attribute=how == "match-attribute")
    lab.create(template("two", 2))
    lab.create(lab.pod("one", node=node, gpus=1))
    lab.running("one")
    lab.create(lab.pod("two", node=node, template="two"))
    assert lab.allocation(lab.running("two")).indices == (1, 2)

    spec = one_domain_first(4, domain=DOMAINS[1] if how == "index-selector" else None)
    lab.create(claim("four", devices=spec), lab.pod("four", node=node, claim="four"))
    got = lab.allocation(lab.running("four"))
    assert got == Allocation(indices=(4, 5, 6, 7), requests=("gpus/domain",), users=("four",))


# --- fact 3: no domain free: the fallback is what the stock allocator does; without it the pod waits -----------


@pytest.mark.parametrize("how", ["index-selector", "match-attribute"])
def test_with_no_domain_free_the_list_falls_back_to_what_the_pod_gets_without_it(lab: Lab, how: str) -> None:
    with_list, without = lab.add_node(domain_attribute=True), lab.add_node(domain_attribute=True)
    for node in (with_list, without):
        lab.fill(node, 0, 4)  # one device taken in each domain: no domain free, 6 devices free

    domain = DOMAINS[1] if how == "index-selector" else None
    only_domain = one_domain_first(4, domain=domain)
    only_domain["requests"][0]["firstAvailable"].pop()  # the one-domain sub-request alone
    lab.create(claim("strict", devices=only_domain), lab.pod("strict", node=with_list, claim="strict"))
    assert not lab.unschedulable("strict")["spec"].get("nodeName")
    lab.cluster.kubectl("delete", "pod", "strict", "-n", lab.namespace, "--wait=true")

    lab.create(claim("listed", devices=one_domain_first(4, domain=domain)),
               lab.pod("listed", node=with_list, claim="listed"))
    lab.create(claim("plain", requests=[exactly(4)]), lab.pod("plain", node=without, claim="plain"))
    listed, plain = lab.allocation(lab.running("listed")), lab.allocation(lab.running("plain"))
    assert listed == Allocation(indices=(1, 2, 3, 5), requests=("gpus/any",), users=("listed",))
    assert plain == Allocation(indices=(1, 2, 3, 5), requests=("gpus",), users=("plain",))


# --- fact 4: a gated pod may name a claim made later ---------------------------------------------------------


def test_a_gated_pod_may_name_a_claim_made_before_its_gate_is_removed(lab: Lab) -> None:
    node = lab.add_node()
    lab.create(lab.pod("one", node=node, gpus=1))
    lab.running("one")

    lab.create(lab.pod("four", node=node, claim="four-gpus", gated=True))  # accepted: the claim does not exist
    pod = lab.get("pod", "four")
    assert pod is not None and kube.scheduled_reason(pod) == "SchedulingGated"
    lab.create(claim("four-gpus", devices=one_domain_first(4, domain=DOMAINS[1]),
                     owner=pod))
    lab.ungate("four")
    got = lab.allocation(lab.running("four"))
    assert got == Allocation(indices=(4, 5, 6, 7), requests=("gpus/domain",), users=("four",))

    lab.cluster.kubectl("delete", "pod", "four", "-n", lab.namespace, "--wait=true")
    kube.poll("the owned claim deleted with its pod", lambda: lab.get("resourceclaim", "four-gpus") is None,
              timeout_seconds=WAIT_SECONDS)


def test_a_pod_ungated_before_its_named_claim_exists_waits_until_it_is_made(lab: Lab) -> None:
    node = lab.add_node()
    lab.create(lab.pod("four", node=node, claim="four-gpus", gated=True))
    lab.ungate("four")
    # kube-scheduler's DynamicResources PreEnqueue keeps a pod whose claim is missing out of the queue: a pod
    # created after it is scheduled (on the same node, with room for both) while it still waits.
    lab.create(lab.pod("witness", node=node, gpus=1))
    lab.running("witness")
    waiting = lab.get("pod", "four")
    assert waiting is not None and not waiting["spec"].get("nodeName") and not kube.gates(waiting)
    # ... and still says it is gated (seen on 1.37.2): to an operator it looks like a pod someone else holds.
    assert kube.scheduled_reason(waiting) == "SchedulingGated", waiting["status"]

    lab.create(claim("four-gpus", requests=[exactly(4)], owner=waiting))
    assert lab.allocation(lab.running("four")).indices == (1, 2, 3, 4)


def test_a_template_made_after_its_gated_pod_becomes_the_pods_claim(lab: Lab) -> None:
    node = lab.add_node()
    lab.create(lab.pod("four", node=node, template="later", gated=True))
    pod = lab.get("pod", "four")
    assert pod is not None and not claim_of(pod)
    lab.create({**template("later", 4), "spec": {"spec": {"devices": one_domain_first(4, domain=DOMAINS[1])}}})
    made = kube.poll("the claim made from the template", lambda: claim_of(lab.get("pod", "four") or {}),
                     timeout_seconds=WAIT_SECONDS)
    lab.ungate("four")
    got = lab.allocation(lab.running("four"))
    assert made and got == Allocation(indices=(4, 5, 6, 7), requests=("gpus/domain",), users=("four",))
