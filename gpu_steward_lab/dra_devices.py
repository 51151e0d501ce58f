"""DRA objects for kwok GPU nodes (`resource.k8s.io/v1`): NVIDIA's DeviceClass, a node's ResourceSlice of GPUs, and
a node stripped of the device plugin's `nvidia.com/gpu`, as NVIDIA's DRA driver (v0.5) would leave the cluster.

No driver and no kubelet are needed on kwok nodes (seen on 1.37.2, tests/e2e/test_dra_e2e.py): kube-scheduler
allocates the devices of a slice that names the node, and a DeviceClass with `extendedResourceName: nvidia.com/gpu`
serves pods asking `nvidia.com/gpu: N` from them (DRAExtendedResource, GA in 1.37) on nodes whose allocatable has
no `nvidia.com/gpu`. The allocator takes devices first fit in the order the slice lists them (docs/placement.md):
`resource_slice` lists them in index order, so a node's NVLink domains are contiguous in it.

Plain dicts, no I/O; the demo, the benchmarks and the tests (`tests/builders.py`) build them here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common import gpu, topology

NVIDIA_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver, and the DeviceClass it installs
NVIDIA_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_CLASS = "mig.nvidia.com"  # NVIDIA's DeviceClass of MIG devices
MIG_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
DEFAULT_PRODUCT = "NVIDIA H100"

Mutator = Callable[[dict[str, Any]], None]


def device_class(name: str = NVIDIA_DRIVER, *, expression: str = NVIDIA_SELECTOR,
                 extended: str | None = gpu.FULL_GPU) -> dict[str, Any]:
    """A DeviceClass like NVIDIA's DRA driver's `gpu.nvidia.com` (`extended`: its extendedResourceName)."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def gpu_device(index: int, *, kind: str = "gpu", clique: str | None = None, product: str = DEFAULT_PRODUCT,
               mutate: Mutator | None = None) -> dict[str, Any]:
    """A device as NVIDIA's DRA driver publishes a GPU: name gpu-<index>, attributes type, index, uuid, productName
    (`clique`: an `nvlinkDomain` attribute too, which NVIDIA's driver does not publish for a node's own domains)."""
    attributes: dict[str, Any] = {"type": {"string": kind}, "index": {"int": index},
                                  "uuid": {"string": f"GPU-{index:08d}"}, "productName": {"string": product}}
    if clique is not None:
        attributes["nvlinkDomain"] = {"string": clique}
    device: dict[str, Any] = {"name": f"gpu-{index}", "attributes": attributes}
    if mutate:
        mutate(device)
    return device


def mig_device(parent: int, slot: int, *, profile: str, mutate: Mutator | None = None) -> dict[str, Any]:
    """A MIG device as NVIDIA's DRA driver publishes one (static MIG): name gpu-<parent>-mig-<profile>-<slot>,
    attributes type `mig`, profile, parentIndex, uuid."""
    attributes: dict[str, Any] = {"type": {"string": "mig"}, "profile": {"string": profile},
                                  "parentIndex": {"int": parent}, "uuid": {"string": f"MIG-{parent:04d}-{slot:04d}"}}
    device: dict[str, Any] = {"name": f"gpu-{parent}-mig-{profile.replace('.', '-')}-{slot}",
                              "attributes": attributes}
    if mutate:
        mutate(device)
    return device


def resource_slice(node: str, devices: Sequence[dict[str, Any]] | int, *, driver: str = NVIDIA_DRIVER,
                   pool: str | None = None, generation: int = 1, count: int = 1, name: str | None = None,
                   product: str = DEFAULT_PRODUCT) -> dict[str, Any]:
    """A node-local ResourceSlice; `devices`: the devices, or how many GPUs (gpu-0..n-1 of `product`, in index
    order), in the order the allocator will try them."""
    items = [gpu_device(i, product=product) for i in range(devices)] if isinstance(devices, int) else list(devices)
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-{generation}"},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
                 "devices": items},
    }


def without_device_plugin(node: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a GPU node manifest whose GPUs are DRA devices: no `nvidia.com/gpu` in its capacity or allocatable
    and no `nvidia.com/gpu.count` label (the device plugin's); its NVLink labels and annotation stay."""
    status = node.get("status") or {}
    meta = node.get("metadata") or {}
    return {
        **node,
        "metadata": {**meta, "labels": {k: v for k, v in (meta.get("labels") or {}).items()
                                        if k != topology.GPU_COUNT_LABEL}},
        "status": {**status, **{field: {k: v for k, v in status[field].items() if k != gpu.FULL_GPU}
                                for field in ("capacity", "allocatable") if field in status}},
    }
