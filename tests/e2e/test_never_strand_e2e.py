"""Never strand a pod, judged by the real kube-scheduler instead of our own `fit.why_not`.

The pods are of the never-strand property's kinds (tests/unit/test_never_strand.py: random node selectors,
required node affinity, tolerations, gangs, placement labels; drawn from its tables with a seeded generator), on
kwok nodes named as that property's nodes and labelled and tainted with its values. For each pod and each node,
a copy of the pod as the user wrote it is pinned to that node (`matchFields metadata.name`, ANDed into each of
its own terms) and created: when kube-scheduler binds it, the pod as our webhook admitted it (`mutation.decide`,
gates lifted, pinned the same way) must bind there too. So whatever admission adds, no node the stock scheduler
accepted for the pod is lost. (Seen to fail when admission writes a required term for its best node.)
"""

from __future__ import annotations

import copy
import random
import secrets
from typing import Any

import jsonpatch
import pytest

from admission import mutation
from common import settings, snapshot_build
from gpu_steward_lab import localcluster
from tests import builders
from tests.e2e import conftest
from tests.support import kube
from tests.unit import test_never_strand as strand

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
CONFIG = settings.Settings()
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PODS = 20
SEED = 20261125
# The property's node names, shapes, labels and taints (its LABEL_KEYS / LABEL_VALUES / TAINTS): name, GPUs,
# NVLink domains, labels, taints, cordoned.
NODES = [
    ("n0", 8, 2, {strand.PRODUCT: "A100", "zone": "a"}, [], False),
    ("n1", 2, 1, {strand.PRODUCT: "NVIDIA-L4", "zone": "b"}, [strand.TAINTS[0]], False),
    ("n2", 4, 1, {"zone": "a", NAMES.nvlink_domain_size: "x"}, [], True),
    ("n3", 8, 2, {"zone": "b"}, [strand.TAINTS[2]], False),
    ("n4", 2, 2, {strand.PRODUCT: "x", "nvidia.com/gpu.count": "8"}, [strand.TAINTS[1]], False),
    ("n5", 4, 1, {"zone": "x"}, [strand.TAINTS[3]], False),
]


def _nodes() -> list[dict[str, Any]]:
    out = []
    for name, gpus, domains, labels, taints, cordoned in NODES:
        node = localcluster.gpu_node(name, gpus=gpus, domains=domains, product="NVIDIA-H100-80GB-HBM3", names=NAMES,
                                     cpu="64", memory="512Gi")
        node["metadata"]["labels"].update(labels)
        node["spec"] = {"taints": copy.deepcopy(taints), **({"unschedulable": True} if cordoned else {})}
        out.append(node)
    return out


def _pinned_copy(pod: dict[str, Any], *, node: str, namespace: str) -> dict[str, Any]:
    """The pod to judge on one node: gates lifted (judged as the scheduler would once they are), no priority
    fields (filters do not read them; the classes need not exist), no `schedulingGroup` (our gang's own PodGroup,
    which every path lifting our gate makes first: tests/e2e/test_native_gang_release_e2e.py; for one judged pod a
    gang of one, and filters do not read it), pinned to the node (the judge's way to ask one node)."""
    body = copy.deepcopy(pod)
    body["metadata"] = {**body["metadata"], "name": f"judge-{secrets.token_hex(4)}", "namespace": namespace}
    spec = body["spec"]
    for field in ("schedulingGates", "priority", "priorityClassName", "preemptionPolicy", "schedulingGroup"):
        spec.pop(field, None)
    spec["terminationGracePeriodSeconds"] = 0
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.get(REQUIRED) or {}
    terms = required.get("nodeSelectorTerms") or [{}]
    node_affinity[REQUIRED] = {**required, "nodeSelectorTerms": [
        {**t, "matchFields": [*(t.get("matchFields") or []), pin]} for t in terms]}
    return body


def _binds(cluster: localcluster.LocalCluster, body: dict[str, Any]) -> bool | None:
    """Whether kube-scheduler binds the pod (None: the API server refused it); the pod is deleted after."""
    verdict = kube.scheduler_verdicts(cluster, [body])[body["metadata"]["name"]]
    return None if verdict is None else bool(verdict)


@pytest.fixture(scope="module")
def strand_cluster(gpu_cluster: conftest.GpuCluster) -> Any:
    cluster = gpu_cluster.cluster
    cluster.add_nodes(_nodes())
    try:
        yield cluster
    finally:
        cluster.kubectl("delete", "node", *(n[0] for n in NODES), "--wait=false", check=False)


def _requirement(rng: random.Random) -> dict[str, Any]:
    key, operator = rng.choice(strand.LABEL_KEYS), rng.choice(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"))
    values = {"In": 2, "NotIn": 2, "Gt": 1, "Lt": 1}.get(operator, 0)
    return {"key": key, "operator": operator,
            **({"values": rng.sample(strand.LABEL_VALUES, values)} if values else {})}


def _random_pod(rng: random.Random) -> dict[str, Any]:
    """A pod of the property's kinds (tests/unit/test_never_strand.py), drawn from the same tables: node
    selector, required node affinity, tolerations, placement, gang labels; none with nodeName or another
    scheduler (kube-scheduler does not place those)."""
    spec: dict[str, Any] = {}
    if rng.random() < 0.4:
        terms = []
        for _ in range(rng.randint(1, 2)):
            term: dict[str, Any] = {"matchExpressions": [_requirement(rng) for _ in range(rng.randint(1, 2))]}
            if rng.random() < 0.2:
                term["matchFields"] = [{"key": "metadata.name", "operator": rng.choice(("In", "NotIn")),
                                        "values": [rng.choice(strand.NODE_NAMES)]}]
            terms.append(term)
        spec["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
    if rng.random() < 0.3:
        spec["nodeSelector"] = {rng.choice((strand.PRODUCT, "zone")): rng.choice(strand.LABEL_VALUES)}
    if rng.random() < 0.6:
        spec["tolerations"] = rng.sample([
            {"key": "team", "operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists"},
            {"key": "maintenance", "operator": "Exists"}, {"operator": "Exists"},
            {"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}], rng.randint(1, 2))
    labels = {"gpu-steward.io/placement": rng.choice(("strict", "prefer", "prefer", "off"))}
    if rng.random() < 0.2:
        labels |= {"gpu-steward.io/gang-name": "g", "gpu-steward.io/gang-size": rng.choice(("1", "2"))}
    return builders.pod("p", gpus=rng.choice((0, 1, 2, 4, 8)), labels=labels,
                        mutate=lambda p: p["spec"].update(copy.deepcopy(spec)))


def test_admission_keeps_every_node_the_real_scheduler_accepts(
    strand_cluster: localcluster.LocalCluster, plain_namespace: str
) -> None:
    state = strand_cluster.kubectl_json("get", "nodes")
    cluster = snapshot_build.build(nodes=[n for n in state["items"] if n["metadata"]["name"] in {x[0] for x in NODES}],
                                   pods=[], names=NAMES, taken_at=strand.NOW)
    rng = random.Random(SEED)
    accepted = gated = 0
    for _ in range(PODS):
        pod = _random_pod(rng)
        outcome = mutation.decide(operation="CREATE", namespace=plain_namespace, pod=pod, cluster=cluster,
                                  config=CONFIG, now=strand.NOW, controller_seen_at=strand.ALIVE)
        admitted = jsonpatch.apply_patch(pod, outcome.patch)
        gated += outcome.gated
        for name, *_ in NODES:
            if _binds(strand_cluster, _pinned_copy(pod, node=name, namespace=plain_namespace)):
                accepted += 1
                after = _binds(strand_cluster, _pinned_copy(admitted, node=name, namespace=plain_namespace))
                assert after, f"admission lost node {name} for {pod['spec']}: the scheduler bound the original there"
    assert accepted >= 5 and gated >= 2, f"the stream must exercise the property: {accepted} accepted, {gated} gated"
