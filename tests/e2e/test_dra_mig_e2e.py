"""MIG devices through DRA, on the real control plane (Kubernetes 1.37.2, a kwok node, no driver, no kubelet).

DeviceClasses like NVIDIA's DRA driver's `mig.nvidia.com` (its selector: type `mig`) and a `mig-1g` class pinning
profile 1g.10gb and serving `nvidia.com/mig-1g.10gb`; a kwok node with no GPU in its allocatable and a ResourceSlice
of 6 static MIG devices (2 parents, each 2 x 1g.10gb and 1 x 3g.40gb). Read from the API server: kube-scheduler
allocates an extended-resource pod's 1g.10gb devices, a template pod's 3g.40gb device (its selector pins the
profile) and an unpinned template pod's one device of either profile; the model built from the live cluster counts
the node's slices by profile, each pod's ask by the profile pinned (the unpinned pod asks none it can count, and is
said so, and never judged idle), and the node's free slices with every held device taken, so none is offered twice.
Reclaim against a real Prometheus with dcgm-exporter 4.8.4-style MIG series of DRA devices: an idle pod of 1g.10gb
slices is evicted for a pending pod asking those slices; a pod busy on one of its slices, and an idle pod of 3g.40gb
slices (which free no 1g.10gb slice), are never evicted.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common import gpu, settings
from descheduler import protections
from gpu_steward_lab import dra_devices, localcluster
from tests import builders
from tests.e2e import conftest
from tests.e2e import test_dra_e2e as dra_e2e
from tests.support import kube, prometheus

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
ONE_G, THREE_G = "1g.10gb", "3g.40gb"
ONE_G_CLASS = "mig-1g"


def _profile(profile: str) -> str:
    return f"device.attributes['{dra_devices.NVIDIA_DRIVER}'].profile == '{profile}'"


@pytest.fixture
def mig_node(control_plane: localcluster.LocalCluster) -> Iterator[tuple[str, str]]:
    """(pool label value, node name): a node whose GPUs are 6 DRA MIG devices, tainted for this test's pods."""
    pool = f"mig-{secrets.token_hex(3)}"
    node = dra_devices.without_device_plugin(localcluster.gpu_node(
        f"{pool}-0", gpus=2, domains=1, product="NVIDIA-H100-80GB-HBM3", names=NAMES, cpu="64", memory="512Gi"))
    node["metadata"]["labels"]["e2e.gpu-steward.io/pool"] = pool
    node["spec"]["taints"] = [dra_e2e.TAINT]
    (name,) = control_plane.add_nodes([node])
    devices = [builders.mig_device(parent, slot, profile=profile)
               for parent in range(2) for slot, profile in enumerate((ONE_G, ONE_G, THREE_G))]
    control_plane.apply([
        builders.device_class(builders.MIG_CLASS, expression=builders.MIG_SELECTOR, extended=None),
        builders.device_class(ONE_G_CLASS, expression=f"{builders.MIG_SELECTOR} && {_profile(ONE_G)}",
                              extended=gpu.MIG_PREFIX + ONE_G),
        builders.resource_slice(name, devices),
    ])
    try:
        yield pool, name
    finally:
        control_plane.kubectl("delete", "resourceslice", f"{name}-{dra_devices.NVIDIA_DRIVER}-1", "--ignore-not-found",
                              check=False)
        control_plane.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
        control_plane.kubectl("delete", "deviceclass", builders.MIG_CLASS, ONE_G_CLASS, "--ignore-not-found",
                              check=False)


def _template(name: str, *, namespace: str, profile: str | None, count: int = 1) -> dict[str, Any]:
    spec = builders.claim_spec(count, device_class_name=builders.MIG_CLASS)
    if profile:
        spec["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": _profile(profile)}}]
    return builders.claim_template(name, namespace=namespace, spec=spec)


def _devices(cluster: localcluster.LocalCluster, namespace: str, pod: dict[str, Any]) -> list[str]:
    got = cluster.kubectl_json("get", "resourceclaim", dra_e2e._claim_of(pod), "-n", namespace)
    return sorted(r["device"] for r in got["status"]["allocation"]["devices"]["results"])


def test_the_model_counts_dra_mig_slices_by_profile_and_each_pods_ask_by_the_profile_it_pins(
        control_plane: localcluster.LocalCluster, mig_node: tuple[str, str], plain_namespace: str) -> None:
    pool, node = mig_node
    control_plane.apply([_template("three-g", namespace=plain_namespace, profile=THREE_G),
                         _template("any-mig", namespace=plain_namespace, profile=None)])
    ext = dra_e2e._pod("ext-1g", namespace=plain_namespace, pool=pool)
    resources = ext["spec"]["containers"][0]["resources"]
    resources["requests"][gpu.MIG_PREFIX + ONE_G] = resources.setdefault("limits", {})[gpu.MIG_PREFIX + ONE_G] = "2"
    control_plane.apply([ext, dra_e2e._pod("tpl-3g", namespace=plain_namespace, pool=pool, template="three-g")])
    running = {n: dra_e2e._running(control_plane, plain_namespace, n) for n in ("ext-1g", "tpl-3g")}
    control_plane.apply([dra_e2e._pod("tpl-any", namespace=plain_namespace, pool=pool, template="any-mig")])
    running["tpl-any"] = dra_e2e._running(control_plane, plain_namespace, "tpl-any")
    devices = {n: _devices(control_plane, plain_namespace, p) for n, p in running.items()}
    # kube-scheduler allocated each pod devices of the profile its class or selector pins.
    assert [all(f"-mig-{ONE_G.replace('.', '-')}-" in d for d in devices["ext-1g"]), len(devices["ext-1g"]),
            [f"-mig-{THREE_G.replace('.', '-')}-" in d for d in devices["tpl-3g"]], len(devices["tpl-any"])] == \
        [True, 2, [True], 1], devices

    state = dra_e2e._state(control_plane)
    got = state.nodes[node]
    assert (got.gpu_count, dict(got.allocatable.mig)) == (0, {ONE_G: 4, THREE_G: 2}), state.problems
    asks = {n: dict(state.pods[f"{plain_namespace}/{n}"].request.mig) for n in running}
    assert asks == {"ext-1g": {ONE_G: 2}, "tpl-3g": {THREE_G: 1}, "tpl-any": {}}, state.problems
    # The unpinned pod's device is taken all the same: 2 of the 6 slices are free, whichever profile it got.
    any_profile = ONE_G if f"-mig-{ONE_G.replace('.', '-')}-" in devices["tpl-any"][0] else THREE_G
    free = {p: got.free_mig(p) for p in (ONE_G, THREE_G)}
    assert free == {ONE_G: 2 - (any_profile == ONE_G), THREE_G: 1 - (any_profile == THREE_G)}, (devices, free)
    # Its ask is left to kube-scheduler and said so; that is also why reclaim never evicts it (partial data).
    left = state.pods[f"{plain_namespace}/tpl-any"].dra.left or ""
    assert f"MIG class {builders.MIG_CLASS} with no profile pinned" in left, left
    reasons = {n: protections.dra_uncounted(state.pods[f"{plain_namespace}/{n}"], got, NAMES) for n in running}
    assert {n: bool(r) for n, r in reasons.items()} == {"ext-1g": False, "tpl-3g": False, "tpl-any": True}, reasons
    assert not [p for p in state.problems if node in p], state.problems


MIG_RECLAIMABLE = "e2e-dra-mig-reclaimable"


def _mig_series(cluster: localcluster.LocalCluster, namespace: str, busy: dict[str, float],
                ) -> list[prometheus.Series]:
    """`DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio) per MIG device of each running pod, labelled as dcgm-exporter
    4.8.4 labels a DRA-allocated MIG instance (parent GPU index and UUID, instance id and profile, its pod, claim
    and device); 0.01 unless `busy` gives a pod's first device a value."""
    series = []
    for name, pod in kube.pods(cluster, namespace).items():
        node = pod["spec"].get("nodeName")
        if not node or not dra_e2e._claim_of(pod):
            continue
        for i, device in enumerate(_devices(cluster, namespace, pod)):
            # gpu-<parent>-mig-<profile, dots as dashes>-<slot> (`dra_devices.mig_device`)
            named = re.fullmatch(r"gpu-(\d+)-mig-(.+)-(\d+)", device)
            assert named, device
            parent, dashed, slot = named.groups()
            profile = dashed.replace("-", ".")
            labels = {"gpu": parent, "UUID": f"GPU-{node}-{parent}", "GPU_I_ID": slot, "GPU_I_PROFILE": profile,
                      "device": f"nvidia{parent}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node,
                      "container": "main", "namespace": namespace, "pod": name,
                      "dra_claim_name": dra_e2e._claim_of(pod), "dra_claim_namespace": namespace,
                      "dra_driver_name": dra_devices.NVIDIA_DRIVER, "dra_pool_name": node, "dra_device_name": device,
                      "dra_mig_profile": profile}
            value = busy.get(name, 0.01) if i == 0 else 0.01
            series.append(prometheus.Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels,
                                            [(float(ago), value) for ago in range(420)]))
    return series


def test_an_idle_pod_of_dra_mig_slices_is_reclaimed_for_slices_of_its_profile_only(
        control_plane: localcluster.LocalCluster, mig_node: tuple[str, str], plain_namespace: str,
        descheduler_factory: conftest.StartDescheduler, prometheus_factory: prometheus.StartPrometheus) -> None:
    pool, node = mig_node
    control_plane.apply([kube.priority_class(MIG_RECLAIMABLE, value=1000, reclaim=(dra_e2e.IDLE_WINDOW_SECONDS,
                                                                                   dra_e2e.THRESHOLD_PERCENT)),
                         _template("three-g-2", namespace=plain_namespace, profile=THREE_G, count=2)])

    def reclaimable(name: str, *, slices: int = 2, template: str | None = None) -> dict[str, Any]:
        body = dra_e2e._pod(name, namespace=plain_namespace, pool=pool, template=template)
        body["spec"]["priorityClassName"] = MIG_RECLAIMABLE
        if not template:
            resources = body["spec"]["containers"][0]["resources"]
            resources["requests"][gpu.MIG_PREFIX + ONE_G] = str(slices)
            resources.setdefault("limits", {})[gpu.MIG_PREFIX + ONE_G] = str(slices)
        return body

    try:
        control_plane.apply([reclaimable("idle-1g"), reclaimable("busy-1g"),
                             reclaimable("idle-3g", template="three-g-2")])
        for name in ("idle-1g", "busy-1g", "idle-3g"):
            dra_e2e._running(control_plane, plain_namespace, name)
        state = dra_e2e._state(control_plane)
        assert (state.nodes[node].free_mig(ONE_G), state.nodes[node].free_mig(THREE_G)) == (0, 0), state.problems
        dcgm = prometheus_factory(_mig_series(control_plane, plain_namespace, {"busy-1g": 0.9}),
                                  now=time.time() + dra_e2e.AHEAD_SECONDS)
        descheduler = descheduler_factory({
            # The operator's class serving nvidia.com/mig-1g.10gb is named as a GPU class too.
            "dra": {"gpu_device_classes": [dra_devices.NVIDIA_DRIVER, builders.MIG_CLASS, ONE_G_CLASS]},
            "prometheus": {"url": dcgm.url, "occupancy_refresh_seconds": 1},
            "descheduler": {"reclaim": {"cooldowns": {"node_seconds": 0, "workload_seconds": 0},
                                        "conventions": {"evict_bare_pods": True}}},
        })
        # Of the same priority: kube-scheduler cannot preempt for it; it reads `cannot allocate all claims`.
        control_plane.apply([reclaimable("want")])
        want = kube.poll("want bound where the idle 1g pod was", lambda: (
            p if (p := kube.pods(control_plane, plain_namespace).get("want")) and p["spec"].get("nodeName")
            else None), timeout_seconds=90)
        # Another 1g demand: only the busy pod's slices, or none (the 3g pod's), could serve it: three cycles decide
        # it, none evicting for it.
        control_plane.apply([reclaimable("want-2")])
        told = f"reclaim demand {plain_namespace}/want-2 "
        said = kube.poll("three cycles on want-2", lambda: (
            lines if len(lines := [x for x in descheduler.process.log_file.read_text(errors="replace").splitlines()
                                   if told in x]) >= 3 else None), timeout_seconds=60)
        pods = kube.pods(control_plane, plain_namespace)
        log = descheduler.process.log_file.read_text(errors="replace")
        assert want["spec"]["nodeName"] == node, log[-3000:]
        assert all(": no node " in x and "evicted" not in x for x in said), said
        assert not pods["want-2"]["spec"].get("nodeName")
        assert "idle-1g" not in pods or pods["idle-1g"]["metadata"].get("deletionTimestamp"), sorted(pods)
        for kept in ("busy-1g", "idle-3g"):
            assert kept in pods and not pods[kept]["metadata"].get("deletionTimestamp"), (kept, log[-3000:])
        reasons = {(e["reason"], e["involvedObject"]["name"]) for e in kube.events(control_plane, plain_namespace)}
        assert ("IdleGPUReclaimed", "idle-1g") in reasons, reasons
        assert not {n for r, n in reasons if r == "IdleGPUReclaimed"} - {"idle-1g"}, reasons
    finally:
        control_plane.kubectl("delete", "priorityclass", MIG_RECLAIMABLE, "--ignore-not-found", check=False)
