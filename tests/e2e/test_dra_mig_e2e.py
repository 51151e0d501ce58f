"""MIG devices through DRA, on the real control plane (Kubernetes 1.37.2, a kwok node, no driver, no kubelet).

DeviceClasses like NVIDIA's DRA driver's `mig.nvidia.com` (its selector: type `mig`) and a `mig-1g` class pinning
profile 1g.10gb and serving `nvidia.com/mig-1g.10gb`; a kwok node with no GPU in its allocatable and a ResourceSlice
of 6 static MIG devices (2 parents, each 2 x 1g.10gb and 1 x 3g.40gb). Read from the API server: kube-scheduler
allocates an extended-resource pod's 1g.10gb devices, a template pod's 3g.40gb device (its selector pins the
profile) and an unpinned template pod's one device of either profile; the model built from the live cluster counts
the node's slices by profile, each pod's ask by the profile pinned (the unpinned pod asks none it can count, and is
said so, and never judged idle), and the node's free slices with every held device taken, so none is offered twice.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from common import gpu, settings
from descheduler import protections
from gpu_steward_lab import dra_devices, localcluster
from tests import builders
from tests.e2e import test_dra_e2e as dra_e2e

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


def _template(name: str, *, namespace: str, profile: str | None) -> dict[str, Any]:
    spec = builders.claim_spec(1, device_class_name=builders.MIG_CLASS)
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
