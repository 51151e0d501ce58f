"""common.gpu: the pod's effective GPU request as the scheduler counts it, and what a node offers."""

from __future__ import annotations

from typing import Any

import pytest

from common import gpu
from tests import builders


def _container(
    name: str,
    *,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "cuda:12"}
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    if resources:
        container["resources"] = resources
    if restart_policy:
        container["restartPolicy"] = restart_policy
    return container


def _pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["containers"] = containers
        if init is not None:
            body["spec"]["initContainers"] = init

    return builders.pod("p", mutate=mutate)


G = gpu.FULL_GPU
MIG_3G = "nvidia.com/mig-3g.40gb"
MIG_1G = "nvidia.com/mig-1g.10gb"


@pytest.mark.parametrize(
    ("raw_pod", "expected"),
    [
        pytest.param(builders.pod("cpu"), gpu.GpuRequest(), id="no-gpu"),
        pytest.param(builders.pod("one", gpus=1), gpu.GpuRequest(full=1), id="builder-one-gpu"),
        pytest.param(_pod([_container("a", limits={"cpu": "1", "memory": "1Gi"})]), gpu.GpuRequest(),
                     id="cpu-only-limits"),
        pytest.param(_pod([_container("a", limits={G: "2"}, requests={G: "2"})]), gpu.GpuRequest(full=2),
                     id="limits-and-equal-requests"),
        pytest.param(_pod([_container("a", limits={G: 4})]), gpu.GpuRequest(full=4), id="integer-limit"),
        pytest.param(_pod([_container("a", limits={G: "1.0"})]), gpu.GpuRequest(full=1), id="decimal-whole"),
        pytest.param(_pod([_container("a", requests={G: "3"})]), gpu.GpuRequest(full=3),
                     id="requests-only-fallback"),
        pytest.param(_pod([_container("a", limits={G: "2"}), _container("b", limits={G: "1"}),
                           _container("c", limits={"cpu": "2"})]),
                     gpu.GpuRequest(full=3), id="containers-add-up"),
        pytest.param(_pod([_container("a", limits={G: "0"})]), gpu.GpuRequest(), id="zero-gpus"),
        pytest.param(_pod([_container("a", limits={MIG_3G: "1"})]), gpu.GpuRequest(mig={"3g.40gb": 1}),
                     id="mig-one-profile"),
        pytest.param(_pod([_container("a", limits={MIG_3G: "1", MIG_1G: "2"}),
                           _container("b", limits={MIG_1G: "1"})]),
                     gpu.GpuRequest(mig={"3g.40gb": 1, "1g.10gb": 3}), id="mig-profiles-add-up"),
        pytest.param(_pod([_container("a", limits={MIG_1G: "0", G: "1"})]), gpu.GpuRequest(full=1),
                     id="mig-zero-dropped"),
        pytest.param(_pod([_container("a", limits={G: "2"})], init=[_container("i", limits={G: "4"})]),
                     gpu.GpuRequest(full=4), id="init-larger-wins"),
        pytest.param(_pod([_container("a", limits={G: "4"})], init=[_container("i", limits={G: "1"}),
                                                                    _container("j", limits={G: "2"})]),
                     gpu.GpuRequest(full=4), id="init-smaller-ignored"),
        pytest.param(_pod([_container("a", limits={G: "1"})],
                          init=[_container("side", limits={G: "1"}, restart_policy="Always")]),
                     gpu.GpuRequest(full=2), id="sidecar-adds"),
        pytest.param(_pod([_container("a", limits={G: "1"})],
                          init=[_container("side", limits={G: "1"}, restart_policy="Always"),
                                _container("i", limits={G: "3"})]),
                     gpu.GpuRequest(full=4), id="init-after-sidecar-counts-sidecar"),
        pytest.param(_pod([_container("a", limits={G: "1"})],
                          init=[_container("i", limits={G: "3"}),
                                _container("side", limits={G: "1"}, restart_policy="Always")]),
                     gpu.GpuRequest(full=3), id="init-before-sidecar-alone"),
        pytest.param(_pod([_container("a", limits={MIG_1G: "1"})], init=[_container("i", limits={MIG_1G: "2"})]),
                     gpu.GpuRequest(mig={"1g.10gb": 2}), id="mig-init-max"),
        pytest.param(_pod([_container("a", limits={G: "1"})], init=[_container("i", limits={MIG_1G: "1"})]),
                     gpu.GpuRequest(full=1, mig={"1g.10gb": 1}), id="max-per-resource"),
        pytest.param({"metadata": {"name": "bare"}}, gpu.GpuRequest(), id="no-spec"),
    ],
)
def test_pod_request(raw_pod: dict[str, Any], expected: gpu.GpuRequest) -> None:
    assert gpu.pod_request(raw_pod) == expected


@pytest.mark.parametrize(
    ("raw_pod", "accounted", "running"),
    [
        # Adversarial first: an init container asked more than the main containers. The scheduler accounts 4 (an
        # eviction frees 4), the running container holds 2: a measurement sees 2 devices, not 4.
        pytest.param(_pod([_container("a", limits={G: "2"})], init=[_container("i", limits={G: "4"})]),
                     gpu.GpuRequest(full=4), gpu.GpuRequest(full=2), id="init-larger-is-accounted-not-running"),
        pytest.param(_pod([_container("a", limits={G: "1"})],
                          init=[_container("side", limits={G: "1"}, restart_policy="Always"),
                                _container("i", limits={G: "3"})]),
                     gpu.GpuRequest(full=4), gpu.GpuRequest(full=2), id="sidecar-runs-the-init-after-it-does-not"),
        pytest.param(_pod([_container("a", limits={G: "1"})],
                          init=[_container("side", limits={G: "1"}, restart_policy="Always")]),
                     gpu.GpuRequest(full=2), gpu.GpuRequest(full=2), id="sidecar-held-while-running"),
        pytest.param(_pod([_container("a", limits={G: "2"})], init=[_container("i", limits={G: "2"})]),
                     gpu.GpuRequest(full=2), gpu.GpuRequest(full=2), id="init-equal-boundary"),
        pytest.param(_pod([_container("a", limits={"cpu": "1"})], init=[_container("i", limits={G: "1"})]),
                     gpu.GpuRequest(full=1), gpu.GpuRequest(), id="gpu-in-init-only"),
        pytest.param(_pod([_container("a", limits={MIG_1G: "1"})], init=[_container("i", limits={MIG_1G: "2"})]),
                     gpu.GpuRequest(mig={"1g.10gb": 2}), gpu.GpuRequest(mig={"1g.10gb": 1}), id="mig-init-larger"),
        pytest.param(_pod([_container("a", limits={G: "3"})]), gpu.GpuRequest(full=3), gpu.GpuRequest(full=3),
                     id="no-init-same"),
    ],
)
def test_running_request_is_what_the_running_containers_hold(raw_pod: dict[str, Any], accounted: gpu.GpuRequest,
                                                             running: gpu.GpuRequest) -> None:
    assert (gpu.pod_request(raw_pod), gpu.running_request(raw_pod)) == (accounted, running)


@pytest.mark.parametrize(
    ("request_", "any_", "text"),
    [
        pytest.param(gpu.GpuRequest(), False, "no GPU", id="none"),
        pytest.param(gpu.GpuRequest(full=2), True, "2 GPU", id="full"),
        pytest.param(gpu.GpuRequest(mig={"3g.40gb": 1, "1g.10gb": 2}), True,
                     "2x MIG 1g.10gb, 1x MIG 3g.40gb", id="mig-sorted"),
        pytest.param(gpu.GpuRequest(full=1, mig={"1g.10gb": 1}), True, "1 GPU, 1x MIG 1g.10gb", id="both"),
        pytest.param(gpu.GpuRequest(mig={"1g.10gb": 0}), False, "no GPU", id="zero-mig"),
    ],
)
def test_request_properties(request_: gpu.GpuRequest, any_: bool, text: str) -> None:
    assert (request_.any, request_.describe()) == (any_, text)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("500m", id="milli"),
        pytest.param("-1", id="negative"),
        pytest.param("abc", id="word"),
        pytest.param("1.5", id="fraction"),
        pytest.param("", id="empty"),
        pytest.param("1Gi", id="binary-suffix"),
        pytest.param("inf", id="infinity"),
        pytest.param("nan", id="not-a-number"),
    ],
)
def test_bad_quantity_raises(value: str) -> None:
    with pytest.raises(gpu.QuantityError) as caught:
        gpu.pod_request(_pod([_container("a", limits={G: value})]))
    assert str(caught.value) == f"{G}: {value!r} is not a whole number of devices"


def test_bad_mig_quantity_names_the_resource() -> None:
    with pytest.raises(gpu.QuantityError, match=r"^nvidia\.com/mig-3g\.40gb: '0\.5' "):
        gpu.pod_request(_pod([_container("a", limits={MIG_3G: "0.5"})]))


def _node_status(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "status": status}


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        pytest.param(builders.gpu_node("n", gpus=8), gpu.GpuRequest(full=8), id="allocatable"),
        pytest.param(_node_status({"capacity": {G: "4"}}), gpu.GpuRequest(full=4), id="capacity-fallback"),
        pytest.param(_node_status({"allocatable": {}, "capacity": {G: "4"}}), gpu.GpuRequest(full=4),
                     id="empty-allocatable-falls-back"),
        pytest.param(_node_status({"allocatable": {G: "3"}, "capacity": {G: "4"}}), gpu.GpuRequest(full=3),
                     id="allocatable-wins"),
        pytest.param(_node_status({"allocatable": {"cpu": "8"}, "capacity": {G: "4"}}), gpu.GpuRequest(),
                     id="allocatable-without-gpu-means-none"),
        pytest.param(_node_status({"allocatable": {MIG_3G: "2", MIG_1G: "1", G: "0"}}),
                     gpu.GpuRequest(mig={"3g.40gb": 2, "1g.10gb": 1}), id="mig-node"),
        pytest.param(_node_status({"allocatable": {G: "lots"}}), gpu.GpuRequest(), id="malformed-counts-none"),
        pytest.param(_node_status({"allocatable": {G: "inf"}}), gpu.GpuRequest(), id="infinite-counts-none"),
        pytest.param({"metadata": {"name": "n"}}, gpu.GpuRequest(), id="no-status"),
        pytest.param(_node_status({"allocatable": {"cpu": "64", "memory": "512Gi"}}), gpu.GpuRequest(),
                     id="cpu-node"),
    ],
)
def test_node_allocatable(node: dict[str, Any], expected: gpu.GpuRequest) -> None:
    assert gpu.node_allocatable(node) == expected
