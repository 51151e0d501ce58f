"""Device-plugin GPU nodes beside DRA GPU nodes in one cluster, on the real 1.37.2 control plane (issue 30, proof 1).

One pool, two 8-GPU kwok nodes in NVLink domains 0-3 and 4-7: `dp`, whose GPUs are the device plugin's
(`nvidia.com/gpu` in its allocatable), and `dra`, whose GPUs are devices of a ResourceSlice with no `nvidia.com/gpu`
in its allocatable; NVIDIA's DeviceClass maps `nvidia.com/gpu` to its devices. The facts the one capacity model
relies on: kube-scheduler serves `nvidia.com/gpu` from a node's allocatable where the node has it (no claim is
made) and from DRA devices where it has not (a claim it makes); a template-claim pod can run only where the
devices are. The model built from the live cluster counts both nodes' GPUs and each pod's, however it got them,
and gpu-steward's release places a template pod, a gang of extended-resource pods and a single pod on the two
kinds of node so that all run, the gang whole, and every DRA pod's devices are one domain (read from its claim).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common import settings, snapshot, snapshot_build
from gpu_steward_lab import dra_devices, localcluster
from tests import builders
from tests.e2e import conftest
from tests.e2e.test_dra_e2e import (
    _claim_of,
    renew,  # noqa: F401  (the fixture, used by name)
)
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
TAINT = {"key": "e2e.gpu-steward.io/dra-mixed", "value": "true", "effect": "NoSchedule"}
POOL = "e2e.gpu-steward.io/pool"
DRA_KINDS = "deviceclasses,resourceslices,resourceclaims,resourceclaimtemplates"
DOMAIN_SIZE = 4


@pytest.fixture
def mixed(control_plane: localcluster.LocalCluster) -> Iterator[tuple[str, str, str]]:
    """(pool, device-plugin node, DRA node), tainted so only this test's pods go there; deleted after."""
    pool = f"mixed-{secrets.token_hex(3)}"
    made = []
    for kind in ("dp", "dra"):
        node = localcluster.gpu_node(f"{pool}-{kind}", gpus=8, domains=2, product="NVIDIA-H100-80GB-HBM3",
                                     names=NAMES, cpu="64", memory="512Gi")
        node = dra_devices.without_device_plugin(node) if kind == "dra" else node
        node["metadata"]["labels"][POOL] = pool
        node["spec"]["taints"] = [TAINT]
        made.append(node)
    dp, dra = control_plane.add_nodes(made)
    control_plane.apply([builders.device_class(), builders.resource_slice(dra, 8)])
    try:
        yield pool, dp, dra
    finally:
        control_plane.kubectl("delete", "resourceslice", f"{dra}-gpu.nvidia.com-1", "--ignore-not-found", check=False)
        control_plane.kubectl("delete", "node", dp, dra, "--ignore-not-found", "--wait=false", check=False)
        control_plane.kubectl("delete", "deviceclass", "gpu.nvidia.com", "--ignore-not-found", check=False)


def _pod(name: str, *, namespace: str, pool: str, gpus: int = 0, template: str | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = kube.pod(name, namespace=namespace, gpus=gpus, node_selector={POOL: pool}, labels=labels)
    body["spec"]["tolerations"] = [{**TAINT, "operator": "Equal"}]
    if template:
        body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
        body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    return body


def _devices(cluster: localcluster.LocalCluster, namespace: str, pod: dict[str, Any]) -> tuple[int, ...]:
    """The device indices the pod's claim was allocated; () for a pod with no claim (device-plugin GPUs)."""
    claim = _claim_of(pod)
    if not claim:
        return ()
    got = cluster.kubectl_json("get", "resourceclaim", claim, "-n", namespace)
    results = ((got.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return tuple(sorted(int(r["device"].removeprefix("gpu-")) for r in results))


def _all_running(cluster: localcluster.LocalCluster, namespace: str, names: tuple[str, ...], *,
                 each: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """The namespace's pods once all of `names` run; `each` is called before every look."""
    def check() -> dict[str, Any] | None:
        each()
        pods = kube.pods(cluster, namespace)
        return pods if all((pods.get(n, {}).get("status") or {}).get("phase") == "Running" for n in names) else None
    return kube.poll(f"{', '.join(names)} running", check, timeout_seconds=120, interval_seconds=1)


def _state(cluster: localcluster.LocalCluster) -> snapshot.Snapshot:
    state = kube.cluster_state(cluster)
    state["items"] += cluster.kubectl_json("get", DRA_KINDS, "-A")["items"]
    return snapshot_build.from_list(state, names=NAMES, taken_at=time.time())


def test_the_scheduler_serves_the_extended_resource_from_either_kind_and_the_model_counts_both(
        control_plane: localcluster.LocalCluster, mixed: tuple[str, str, str], plain_namespace: str) -> None:
    pool, dp, dra = mixed
    control_plane.apply([builders.claim_template("two", namespace=plain_namespace, spec=builders.claim_spec(2))])
    for name in ("eight-a", "eight-b"):  # one whole node each: which one takes which is kube-scheduler's choice
        control_plane.kubectl("create", "-f", "-",
                              input=json.dumps(_pod(name, namespace=plain_namespace, pool=pool, gpus=8)))
    pods = _all_running(control_plane, plain_namespace, ("eight-a", "eight-b"))
    on = {pods[n]["spec"]["nodeName"]: n for n in ("eight-a", "eight-b")}
    assert sorted(on) == sorted([dp, dra]), on
    # The device plugin's node: no claim; the DRA node: the scheduler's claim, all eight devices.
    assert (_claim_of(pods[on[dp]]), _devices(control_plane, plain_namespace, pods[on[dra]])) == (
        "", tuple(range(8)))

    state = _state(control_plane)
    assert {n: (state.nodes[n].gpu_count, state.nodes[n].free_gpus) for n in (dp, dra)} == {dp: (8, 0), dra: (8, 0)}
    assert {state.pods[f"{plain_namespace}/{n}"].request.full for n in on.values()} == {8}

    # A template-claim pod can run only where the devices are: with both nodes full it waits, and once the DRA
    # node's pod is gone (not the device plugin's) it runs there.
    control_plane.apply([_pod("tpl-2", namespace=plain_namespace, pool=pool, template="two")])
    control_plane.kubectl("delete", "pod", on[dp], "-n", plain_namespace, "--wait=true")
    assert kube.scheduled_reason(kube.poll("tpl-2 unschedulable", lambda: (
        p if kube.scheduled_reason(p := kube.pods(control_plane, plain_namespace)["tpl-2"]) == "Unschedulable"
        else None), timeout_seconds=60)) == "Unschedulable"
    control_plane.kubectl("delete", "pod", on[dra], "-n", plain_namespace, "--wait=true")
    tpl = _all_running(control_plane, plain_namespace, ("tpl-2",))["tpl-2"]
    assert (tpl["spec"]["nodeName"], len(_devices(control_plane, plain_namespace, tpl))) == (dra, 2)


def test_release_places_template_gang_and_single_pods_across_both_kinds_all_run_each_dra_pod_in_one_domain(
        control_plane: localcluster.LocalCluster, mixed: tuple[str, str, str], namespace: str,
        renew: Callable[[], None], descheduler_factory: conftest.StartDescheduler) -> None:  # noqa: F811
    pool, dp, dra = mixed
    descheduler_factory({"descheduler": {"reclaim": {"enabled": False}}})
    control_plane.apply([builders.claim_template("four", namespace=namespace, spec=builders.claim_spec(4))])
    gang = {NAMES.gang_name: "g", NAMES.gang_size: "2"}
    # 16 GPUs asked of 16: the template pod can only go to the DRA node, so every pod runs only if release
    # leaves the DRA node a whole domain for whichever extended-resource pod goes there.
    sequence = (("tpl-4", {"template": "four"}), ("g-0", {"gpus": 4, "labels": gang}),
                ("g-1", {"gpus": 4, "labels": gang}), ("ext-4", {"gpus": 4}))
    first = _pod("tpl-4", namespace=namespace, pool=pool, template="four")

    def gated() -> str | None:  # the webhook reads the template and sees the controller alive through its feeder
        renew()
        probe = control_plane.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(first))
        record = str((json.loads(probe.stdout)["metadata"].get("annotations") or {}).get(NAMES.decision, ""))
        return record if f"gate {NAMES.gate} added" in record else None
    kube.poll("the webhook gates a DRA template pod", gated, timeout_seconds=60, interval_seconds=1)
    for name, kw in sequence:
        renew()
        control_plane.kubectl("create", "-f", "-",
                              input=json.dumps(_pod(name, namespace=namespace, pool=pool, **kw)))
    names = tuple(n for n, _ in sequence)
    pods = _all_running(control_plane, namespace, names, each=renew)
    placed = {n: (pods[n]["spec"]["nodeName"], _devices(control_plane, namespace, pods[n])) for n in names}
    records = {n: (pods[n]["metadata"].get("annotations") or {}).get(NAMES.decision, "") for n in names}
    print(f"\nplaced: {placed}")
    assert all(f"gate {NAMES.gate} added" in r for r in records.values()), records  # ours to place, not left alone
    assert placed["tpl-4"][0] == dra
    on_dra = [d for node, d in placed.values() if node == dra]
    assert sorted(len(d) for d in on_dra) == [4, 4], placed  # the DRA node: two pods, each a claim of 4 devices
    assert all(len({i // DOMAIN_SIZE for i in d}) == 1 for d in on_dra), placed
    assert [d for node, d in placed.values() if node == dp] == [(), ()], placed  # device-plugin GPUs: no claim
