"""MIG through DRA (issue 30, item 5): MIG devices in ResourceSlices are a node's MIG slices by their `profile`
attribute, a pod's claims on a MIG class count by the one profile the class or the request's selector pins, and the
capacity model and reclaim treat them as the device plugin's `nvidia.com/mig-<profile>`. Anything the model cannot
tell (no profile, several, a selector with `||`, partitionable devices) is left to kube-scheduler and said so."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from common import capacity, dra, gpu, settings, settings_loader, snapshot, snapshot_build
from descheduler import policy, protections, reclaim, unschedulable
from gpu_steward_lab import dra_devices
from tests import builders as b
from tests.unit import test_reclaim_planner as planner

CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "mig-1g")
NAMES = settings.Names()
ONE_G = "1g.10gb"
THREE_G = "3g.40gb"
PROFILE_1G = f"device.attributes['gpu.nvidia.com'].profile == '{ONE_G}'"


def mig_class(name: str = b.MIG_CLASS, *, expression: str = b.MIG_SELECTOR, extended: str | None = None,
              ) -> dict[str, Any]:
    return b.device_class(name, expression=expression, extended=extended)


ONE_G_CLASS = mig_class("mig-1g", expression=f"{b.MIG_SELECTOR} && {PROFILE_1G}", extended=gpu.MIG_PREFIX + ONE_G)
THREE_G_CLASS = mig_class("mig-3g", expression=f"{b.MIG_SELECTOR} && {PROFILE_1G.replace(ONE_G, THREE_G)}",
                          extended=gpu.MIG_PREFIX + THREE_G)


def mig_slice(node: str, *devices: dict[str, Any]) -> dict[str, Any]:
    """A slice of 2 parents, each 2 x 1g.10gb and 1 x 3g.40gb, unless `devices` are given."""
    items = list(devices) or [b.mig_device(p, s, profile=prof) for p in range(2)
                              for s, prof in enumerate((ONE_G, ONE_G, THREE_G))]
    return b.resource_slice(node, items)


def inventory(*, classes: Sequence[dict[str, Any]] = (), slices: Sequence[dict[str, Any]] = (),
              claims: Sequence[dict[str, Any]] = (), templates: Sequence[dict[str, Any]] = (),
              gpu_classes: Sequence[str] = CLASSES) -> dra.Inventory:
    return dra.build(device_classes=classes or [b.device_class(), mig_class(), ONE_G_CLASS], slices=slices,
                     claims=claims, templates=templates, gpu_classes=gpu_classes)


def cluster(*, nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]] = (),
            inv: dra.Inventory) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, names=NAMES, taken_at=0.0, inventory=inv)


def mig_node(name: str = "n") -> dict[str, Any]:
    """A node whose GPUs are all MIG devices of NVIDIA's DRA driver: no GPU in its allocatable."""
    return dra_devices.without_device_plugin(b.gpu_node(name, gpus=0, topology="none"))


def plugin_mig_node(name: str = "n", *, slices: int = 7) -> dict[str, Any]:
    """A node whose MIG slices are a device plugin's (`nvidia.com/mig-1g.10gb` in its allocatable)."""
    def mutate(node: dict[str, Any]) -> None:
        node["status"]["allocatable"] = {**node["status"]["allocatable"], gpu.FULL_GPU: "0",
                                         gpu.MIG_PREFIX + ONE_G: str(slices)}
    return b.gpu_node(name, gpus=0, topology="none", mutate=mutate)


def claim(name: str, *devices: str, spec: dict[str, Any] | None = None, reserved_for: Sequence[str] = (),
          extended: bool = False) -> dict[str, Any]:
    """A ResourceClaim allocated the devices named (on pool "n")."""
    body = b.resource_claim(name, spec=spec or mig_spec(1), reserved_for=reserved_for, extended=extended)
    if devices:
        body.setdefault("status", {})["allocation"] = {"devices": {"results": [
            {"request": "gpus", "driver": b.NVIDIA_DRIVER, "pool": "n", "device": d} for d in devices]}}
    return body


def mig_spec(count: int = 1, *, device_class: str = b.MIG_CLASS, selector: str | None = PROFILE_1G,
             ) -> dict[str, Any]:
    spec = b.claim_spec(count, device_class_name=device_class)
    if selector is not None:
        spec["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    return spec


def _no_profile(device: dict[str, Any]) -> None:
    del device["attributes"]["profile"]


def _counters(device: dict[str, Any]) -> None:
    device["consumesCounters"] = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}}]


def _taint(device: dict[str, Any]) -> None:
    device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]


def _int_profile(device: dict[str, Any]) -> None:
    device["attributes"]["profile"] = {"int": 1}


def _selectors(*selectors: Any) -> dict[str, Any]:
    spec = mig_spec(1, selector=None)
    spec["devices"]["requests"][0]["exactly"]["selectors"] = list(selectors)
    return spec


# --- which MIG devices are a node's slices, and which are free -----------------------------------------------------


@pytest.mark.parametrize(("node", "objects", "free", "problem"), [
    pytest.param(mig_node(), dict(slices=[mig_slice("n")]), {ONE_G: 4, THREE_G: 2}, None,
                 id="mig-devices-are-slices-by-profile"),
    pytest.param(mig_node(), dict(slices=[mig_slice("n")], gpu_classes=("gpu.nvidia.com",)), None, None,
                 id="mig-class-not-configured-no-gpu-node"),
    pytest.param(mig_node(), dict(slices=[mig_slice("n", b.mig_device(0, 0, profile=ONE_G, mutate=_no_profile),
                                                    b.mig_device(0, 1, profile=ONE_G))]),
                 {ONE_G: 1}, "a MIG device without a `profile` attribute; not counted",
                 id="mig-device-without-profile-not-counted"),
    pytest.param(mig_node(), dict(slices=[mig_slice("n", b.mig_device(0, 0, profile=ONE_G, mutate=_int_profile),
                                                    b.mig_device(0, 1, profile=ONE_G))]),
                 {ONE_G: 1}, "a MIG device without a `profile` attribute; not counted",
                 id="mig-device-whose-profile-is-no-string-not-counted"),
    pytest.param(mig_node(), dict(slices=[mig_slice("n", b.mig_device(0, 0, profile=ONE_G, mutate=_counters))]),
                 None, "a MIG device that consumes counters (partitionable); not counted",
                 id="partitionable-mig-device-not-counted"),
    pytest.param(mig_node(), dict(slices=[mig_slice("n", b.mig_device(0, 0, profile=ONE_G, mutate=_taint),
                                                    b.mig_device(0, 1, profile=ONE_G))]),
                 {ONE_G: 1}, None, id="tainted-mig-device-is-not-free"),
    pytest.param(mig_node(), dict(slices=[mig_slice("n")], claims=[claim("other", "gpu-1-mig-1g-10gb-0")]),
                 {ONE_G: 3, THREE_G: 2}, None, id="mig-device-of-a-claim-of-no-known-pod-is-not-free"),
    pytest.param(plugin_mig_node(), dict(slices=[mig_slice("n")]), {ONE_G: 7},
                 "6 DRA MIG devices beside a device plugin's GPUs; only the device plugin's are counted",
                 id="device-plugin-mig-node-counts-the-device-plugin-only"),
])
def test_node_slices(node: dict[str, Any], objects: dict[str, Any], free: dict[str, int] | None,
                     problem: str | None) -> None:
    built = cluster(nodes=[node], inv=inventory(**objects))
    if free is None:
        assert "n" not in built.nodes
    else:
        got = built.nodes["n"]
        assert {p: got.free_mig(p) for p in got.allocatable.mig} == free
        assert {k: v for k, v in got.resources.items() if k.startswith(gpu.MIG_PREFIX)} == {
            gpu.MIG_PREFIX + p: n for p, n in got.allocatable.mig.items()}
    assert [p for p in built.problems if problem and problem in p] or (not problem and not built.problems), \
        built.problems


# --- what a pod asks of MIG classes -------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "mig", "left"), [
    pytest.param(mig_spec(2), {ONE_G: 2}, None, id="request-selector-pins-the-profile"),
    pytest.param(mig_spec(1, device_class="mig-1g", selector=None), {ONE_G: 1}, None,
                 id="class-pins-the-profile"),
    pytest.param(mig_spec(1, device_class="mig-1g"), {ONE_G: 1}, None, id="class-and-request-agree"),
    pytest.param(mig_spec(1, selector=None), {}, "request gpus: MIG class mig.nvidia.com with no profile pinned "
                 "(the allocator picks any: not counted)", id="no-profile-left-to-kube-scheduler"),
    pytest.param(mig_spec(1, selector=f"{PROFILE_1G} || device.attributes['gpu.nvidia.com'].profile == '{THREE_G}'"),
                 {}, "no profile pinned", id="either-profile-left-to-kube-scheduler"),
    pytest.param(mig_spec(1, device_class="mig-1g",
                          selector=f"device.attributes['gpu.nvidia.com'].profile == '{THREE_G}'"),
                 {}, f"profiles {ONE_G}, {THREE_G} pinned", id="two-profiles-left-to-kube-scheduler"),
    pytest.param(mig_spec(3, selector=f"{PROFILE_1G} && device.attributes['gpu.nvidia.com'].parentIndex == 0"),
                 {ONE_G: 3}, None, id="profile-beside-other-terms"),
    pytest.param({"devices": {"requests": [*mig_spec(1)["devices"]["requests"],
                                           {"name": "whole", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
                 {ONE_G: 1}, None, id="mig-and-a-whole-gpu-in-one-template"),
    pytest.param({"devices": {"requests": [mig_spec(1)["devices"]["requests"][0],
                                           {**mig_spec(2)["devices"]["requests"][0], "name": "more"}]}},
                 {ONE_G: 3}, None, id="two-requests-of-one-profile-add-up"),
    pytest.param(mig_spec(1, selector=f"device.attributes['gpu.nvidia.com'].type == 'mig' && {PROFILE_1G}"),
                 {ONE_G: 1}, None, id="another-string-attribute-is-no-profile"),
    pytest.param(mig_spec(1, selector=f"{PROFILE_1G} && device.attributes['gpu.nvidia.com'].parentIndex == 0 || "
                                      f"device.attributes['gpu.nvidia.com'].profile == '{THREE_G}'"),
                 {}, "no profile pinned", id="a-conjunction-before-an-or-pins-none"),
    # Selectors all hold at once: one that pins nothing (no object, or an `||`) leaves the next one's profile.
    pytest.param(_selectors("not-an-object", {"cel": {"expression": f"{PROFILE_1G} || true"}},
                            {"cel": {"expression": PROFILE_1G}}),
                 {ONE_G: 1}, None, id="selectors-that-pin-nothing-skipped-the-next-read"),
])
def test_pod_asks(spec: dict[str, Any], mig: dict[str, int], left: str | None) -> None:
    pod = b.pod("p", mutate=b.with_claim_template("t"))
    got = dra.pod_gpus(pod, inventory(templates=[b.claim_template("t", spec=spec)]), annotation=NAMES.domain_claim)
    assert dict(got.mig) == mig
    assert (left in got.left) if left and got.left else got.left == left, got.left
    assert got.asks_gpus


def test_a_claim_of_its_own_whose_alternatives_pin_no_profile_is_left_and_says_which() -> None:
    """A pod's one-domain claim (`Record`) asks what its `firstAvailable` alternatives all ask: here an unpinned MIG
    class, which the model cannot count."""
    alternatives = [{"name": n, "deviceClassName": b.MIG_CLASS, "count": 1} for n in ("domain", "any")]
    own = claim("p-a-mine", spec={"devices": {"requests": [{"name": "gpus", "firstAvailable": alternatives}]}})
    own["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": "uid-p"}]

    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimName": "p-a-mine"}]
        body["metadata"].setdefault("annotations", {})[NAMES.domain_claim] = dra.Record("a", "p-a-mine", "t").text()

    got = dra.pod_gpus(b.pod("p", mutate=mutate), inventory(claims=[own]), annotation=NAMES.domain_claim)
    assert (got.left, dict(got.mig), got.asks_gpus) == (
        "claim default/p-a-mine request gpus: MIG class mig.nvidia.com with no profile pinned (the allocator picks "
        "any: not counted)", {}, True)


def test_a_pods_mig_claim_counts_as_its_slices_and_takes_them_on_the_node() -> None:
    pod = b.pod("p", node="n", phase="Running", mutate=b.with_claim_template("t", generated="p-mig"))
    inv = inventory(slices=[mig_slice("n")], templates=[b.claim_template("t", spec=mig_spec(2))],
                    claims=[claim("p-mig", "gpu-0-mig-1g-10gb-0", "gpu-0-mig-1g-10gb-1", spec=mig_spec(2),
                                  reserved_for=["p"])])
    built = cluster(nodes=[mig_node()], pods=[pod], inv=inv)
    got = built.pods["default/p"]
    assert (got.request, got.measured, got.requests.get(gpu.MIG_PREFIX + ONE_G)) == (
        gpu.GpuRequest(mig={ONE_G: 2}), gpu.GpuRequest(mig={ONE_G: 2}), 2)
    assert len(got.dra.mig_devices) == 2
    node = built.nodes["n"]
    assert (node.free_mig(ONE_G), node.free_mig(THREE_G), node.requested.get(gpu.MIG_PREFIX + ONE_G)) == (2, 2, 2)
    assert protections.dra_uncounted(got, node, NAMES) is None


def test_a_pod_holding_more_mig_devices_than_counted_is_never_a_victim() -> None:
    pod = b.pod("p", mig={ONE_G: 1}, node="n", phase="Running", mutate=b.with_extended_claim("p-x"))
    inv = inventory(slices=[mig_slice("n")], claims=[
        claim("p-x", "gpu-0-mig-1g-10gb-0", "gpu-0-mig-1g-10gb-1", reserved_for=["p"], extended=True)])
    built = cluster(nodes=[mig_node()], pods=[pod], inv=inv)
    assert protections.dra_uncounted(built.pods["default/p"], built.nodes["n"], NAMES) == (
        "holds 2 DRA MIG devices (gpu.nvidia.com/n/gpu-0-mig-1g-10gb-0, gpu.nvidia.com/n/gpu-0-mig-1g-10gb-1) but "
        "is counted for 1 MIG slices")
    # Both devices are in use, whatever the pod was counted for.
    assert built.nodes["n"].free_mig(ONE_G) == 2


def test_a_pod_whose_only_gpus_are_held_mig_devices_is_a_gpu_pod() -> None:
    pod = b.pod("p", node="n", phase="Running", mutate=b.with_extended_claim("p-x"))
    inv = inventory(slices=[mig_slice("n")], claims=[
        claim("p-x", "gpu-0-mig-1g-10gb-0", reserved_for=["p"], extended=True)])
    got = dra.pod_gpus(pod, inv, annotation=NAMES.domain_claim)
    assert (got.asks_gpus, got.count, dict(got.mig), len(got.mig_devices)) == (True, 0, {}, 1)


def test_a_renamed_mig_extended_resource_counts_as_its_profile() -> None:
    renamed = mig_class("mig-1g", expression=f"{b.MIG_SELECTOR} && {PROFILE_1G}", extended=None)
    pod = b.pod("p", mutate=lambda body: body["spec"]["containers"][0].update(
        resources={"limits": {dra.IMPLICIT_PREFIX + "mig-1g": "2"}}))
    built = cluster(nodes=[mig_node()], pods=[pod], inv=inventory(classes=[renamed], slices=[mig_slice("n")]))
    got = built.pods["default/p"]
    assert (got.request.mig, got.requests.get(gpu.MIG_PREFIX + ONE_G),
            dra.IMPLICIT_PREFIX + "mig-1g" in got.requests) == ({ONE_G: 2}, 2, False)
    assert capacity.never_pod(got, built.nodes["n"]) is None


@pytest.mark.parametrize(("pod", "node", "classes", "why"), [
    pytest.param(b.pod("p", mig={ONE_G: 1}), mig_node(), [ONE_G_CLASS], None,
                 id="extended-mig-request-served-by-a-mig-class"),
    pytest.param(b.pod("p", mig={THREE_G: 1}), mig_node(), [ONE_G_CLASS],
                 f"asks {gpu.MIG_PREFIX}{THREE_G}; the node's GPUs are DRA devices and no MIG DeviceClass of "
                 "dra.gpu_device_classes serves "
                 "that name", id="extended-mig-request-no-class-serves-it"),
    pytest.param(b.pod("p", mutate=b.with_claim_template("t")), plugin_mig_node(),
                 [mig_class()], f"asks 2 MIG {gpu.MIG_PREFIX}{ONE_G} of DRA device classes; the node's GPUs are a "
                 "device plugin's", id="claim-mig-pod-on-a-device-plugin-node"),
    pytest.param(b.pod("p", mutate=b.with_claim_template("t")), mig_node(), [mig_class()], None,
                 id="claim-mig-pod-on-a-dra-mig-node"),
    pytest.param(b.pod("p", mig={ONE_G: 1}), plugin_mig_node(), [ONE_G_CLASS], None,
                 id="extended-mig-request-on-a-device-plugin-node"),
])
def test_never(pod: dict[str, Any], node: dict[str, Any], classes: list[dict[str, Any]], why: str | None) -> None:
    inv = inventory(classes=classes, slices=[mig_slice("n")], templates=[b.claim_template("t", spec=mig_spec(2))])
    built = cluster(nodes=[node], pods=[pod], inv=inv)
    assert capacity.never_pod(built.pods["default/p"], built.nodes["n"]) == why


def test_room_counts_free_dra_slices() -> None:
    pods = [b.pod("held", node="n", phase="Running", mutate=b.with_claim_template("t", generated="held-mig")),
            b.pod("p", mutate=b.with_claim_template("three"))]
    inv = inventory(slices=[mig_slice("n")], templates=[b.claim_template("t", spec=mig_spec(2)),
                                                        b.claim_template("three", spec=mig_spec(3))],
                    claims=[claim("held-mig", "gpu-0-mig-1g-10gb-0", "gpu-1-mig-1g-10gb-0", spec=mig_spec(2),
                                  reserved_for=["held"])])
    built = cluster(nodes=[mig_node()], pods=pods, inv=inv)
    assert capacity.place_pod(built.pods["default/p"], capacity.Room.of(built.nodes["n"])) == (
        f"needs 3x MIG {ONE_G}, 2 free")
    # The held pod's slices come back when it is to leave (reclaim's view).
    room = capacity.Room.of(built.nodes["n"], cluster=built, leaving={"default/held"})
    assert not isinstance(capacity.place_pod(built.pods["default/p"], room), str)


def test_a_rebuild_reads_a_mig_claim_allocated_since_the_last_build() -> None:
    """Only the claim changes between builds: the node must be assembled again, and equal a from-scratch build."""
    pod = b.pod("p", node="n", phase="Running", mutate=b.with_claim_template("t", generated="p-mig"))
    templates = [b.claim_template("t", spec=mig_spec(1))]
    stores = {"nodes": {"n": mig_node()}, "pods": {"default/p": pod}}
    builder = snapshot_build.Builder(names=NAMES)
    first = builder.build(**stores, taken_at=0.0, inventory=inventory(
        slices=[mig_slice("n")], templates=templates, claims=[claim("other", "gpu-1-mig-3g-40gb-2")]))
    later = inventory(slices=[mig_slice("n")], templates=templates, claims=[claim("other", "gpu-1-mig-3g-40gb-2"),
                      claim("p-mig", "gpu-0-mig-1g-10gb-0", reserved_for=["p"]),
                      claim("gone", "gpu-1-mig-1g-10gb-1", reserved_for=["gone"])])
    second = builder.build(**stores, taken_at=0.0, inventory=later)
    scratch = cluster(nodes=[mig_node()], pods=[pod], inv=later)
    got = [(s.nodes["n"].free_mig(ONE_G), s.nodes["n"].free_mig(THREE_G)) for s in (first, second, scratch)]
    assert got == [(3, 1), (2, 1), (2, 1)]


# --- reclaim on a DRA MIG node: the device plugin's MIG compatibility rules -----------------------------------------


def _holding(name: str, profile: str, *devices: str) -> list[dict[str, Any]]:
    """A reclaimable running pod (team-a) asking `len(devices)` slices of `profile` as an extended resource, and the
    claim kube-scheduler made for it, allocated `devices`."""
    pod = planner.running(name, node="n", gpus=0, mig={profile: len(devices)})
    b.with_extended_claim(f"{name}-x")(pod)
    made = claim(f"{name}-x", *devices, reserved_for=[name], extended=True)
    made["metadata"]["namespace"] = "team-a"
    return [pod, made]


MIG_CLASSES = [b.device_class(), mig_class(), ONE_G_CLASS, THREE_G_CLASS]
FULL_MIG_NODE = [*_holding("idle-1g", ONE_G, "gpu-0-mig-1g-10gb-0", "gpu-0-mig-1g-10gb-1"),
                 *_holding("busy-1g", ONE_G, "gpu-1-mig-1g-10gb-0", "gpu-1-mig-1g-10gb-1"),
                 *_holding("idle-3g", THREE_G, "gpu-0-mig-3g-40gb-2", "gpu-1-mig-3g-40gb-2")]


def _want(profile: str, count: int, *, message: str = f"0/1 nodes are available: 1 {unschedulable.DRA_SHORT}.",
          ) -> dict[str, Any]:
    pod = planner.pending("want", gpus=0, mig={profile: count})
    pod["status"]["conditions"][0]["message"] = message
    return pod


@pytest.mark.parametrize(("want", "classes", "evicted", "reason"), [
    pytest.param(_want(ONE_G, 2), MIG_CLASSES, {"team-a/idle-1g"}, "1 idle pod(s) evicted on n",
                 id="idle-1g-pod-reclaimed-for-a-1g-demand"),
    pytest.param(_want(THREE_G, 1), MIG_CLASSES, {"team-a/idle-3g"}, "1 idle pod(s) evicted on n",
                 id="idle-3g-pod-reclaimed-for-a-3g-demand"),
    pytest.param(_want(ONE_G, 3), MIG_CLASSES, set(), "no node can hold it",
                 id="adversarial-two-idle-1g-slices-for-three-wanted-evicts-none"),
    pytest.param(_want(THREE_G, 1), MIG_CLASSES[:-1], set(), f"asks {gpu.MIG_PREFIX}{THREE_G}; the node's GPUs are "
                 "DRA devices and no MIG DeviceClass of dra.gpu_device_classes serves that name",
                 id="adversarial-no-class-serves-the-profile"),
    pytest.param(_want(ONE_G, 2, message=f"0/1 nodes are available: 1 Insufficient cpu, 1 {unschedulable.DRA_SHORT}."),
                 MIG_CLASSES, set(), "(1 Insufficient cpu)", id="short-of-cpu-too-is-no-demand"),
])
def test_reclaim_on_a_dra_mig_node_frees_slices_of_the_profile_wanted(
        want: dict[str, Any], classes: list[dict[str, Any]], evicted: set[str], reason: str) -> None:
    """Evicting an idle pod frees slices of its own profile only, as with the device plugin's MIG: idle-1g and
    idle-3g are idle, busy-1g is not."""
    pods = [o for o in FULL_MIG_NODE if o["kind"] == "Pod"] + [want]
    claims = [o for o in FULL_MIG_NODE if o["kind"] == "ResourceClaim"]
    config = settings_loader.load(overrides={})
    built = snapshot_build.build(nodes=[mig_node()], pods=pods, priority_classes=planner.CLASSES, names=config.names,
                           taken_at=planner.NOW, inventory=inventory(classes=classes, slices=[mig_slice("n")],
                                                                     claims=claims, gpu_classes=(*CLASSES, "mig-3g")))
    assert built.nodes["n"].free_mig(ONE_G) == built.nodes["n"].free_mig(THREE_G) == 0, built.problems
    assessments = {**planner.idle("team-a/idle-1g", "team-a/idle-3g"), **planner.busy("team-a/busy-1g")}
    plan = reclaim.plan(cluster=built, policies=policy.parse_all(built.priority_classes, default_threshold_percent=5),
                        assessments=assessments, demands=reclaim.demands_from_snapshot(built),
                        state=planner.NO_COOLDOWNS, config=config, now=planner.NOW)
    assert {e.pod for e in plan.evictions} == evicted
    assert reason in {o.demand: o.reason for o in plan.demands}["team-b/want"]
