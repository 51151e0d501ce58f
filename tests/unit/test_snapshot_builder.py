"""common.snapshot_build.Builder and common.feeder.Builder: a snapshot built after a change re-does only what the change
touched, and equals a from-scratch build of the same objects, whatever the change.

First a row for each thing a kept part depends on (the change must reach the snapshot), then what is reused, then
random sequences of changes (hypothesis), each step compared with a from-scratch build.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from common import dra, feeder, settings, snapshot, snapshot_nodes
from tests import builders as b

NAMES = settings.Names()
CLASSES = settings.Dra().gpu_device_classes
EIGHT = [range(4), range(4, 8)]
ZONE = "topology.kubernetes.io/zone"
Stores = dict[str, dict[str, dict[str, Any]]]


def stores_of(*objects: dict[str, Any]) -> Stores:
    """The feeder's stores (kind -> key -> object) holding `objects`."""
    stores: Stores = {kind.name: {} for kind in feeder.KINDS}
    for obj in objects:
        put(stores, obj)
    return stores


KIND_OF = {"Node": "nodes", "Pod": "pods", "PriorityClass": "priorityclasses", "Namespace": "namespaces",
           "DeviceClass": "deviceclasses", "ResourceSlice": "resourceslices", "ResourceClaim": "resourceclaims",
           "ResourceClaimTemplate": "resourceclaimtemplates", "DeviceTaintRule": "devicetaintrules"}


def put(stores: Stores, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
    stores[KIND_OF[obj["kind"]]][key] = obj


def changed(stores: Stores, kind: str, key: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """A new object in place of the stored one, edited: as the feeder stores a watch event's object."""
    obj = copy.deepcopy(stores[kind][key])
    edit(obj)
    stores[kind][key] = obj


def fresh(stores: Stores, occupancy: snapshot.Occupancy | None = None) -> snapshot.Snapshot:
    return build(feeder.Builder(names=NAMES, gpu_classes=CLASSES), stores, occupancy)


def build(builder: feeder.Builder, stores: Stores, occupancy: snapshot.Occupancy | None = None) -> snapshot.Snapshot:
    return builder.build(stores={kind: dict(store) for kind, store in stores.items()}, served=True,
                         pod_group_version=None, occupancy=occupancy, taken_at=1.0)


def assert_same(warm: snapshot.Snapshot, cold: snapshot.Snapshot) -> None:
    """Equal as data, in the same order, with the same derived views."""
    assert warm == cold
    assert (list(warm.nodes), list(warm.pods)) == (list(cold.nodes), list(cold.pods))
    assert (warm.parsed, warm.parsed_nodes) == (cold.parsed, cold.parsed_nodes)
    assert warm.nodes_by_gpu_state == cold.nodes_by_gpu_state
    assert warm.residents == cold.residents


def anti_affinity(app: str) -> b.Mutator:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": app}}}]}}
    return mutate


def host_port(port: int) -> b.Mutator:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": port}]
    return mutate


def gated(body: dict[str, Any]) -> None:
    body["spec"]["schedulingGates"] = [{"name": NAMES.gate}]


def gpu_class() -> dict[str, Any]:
    cls = b.device_class()
    cls["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    return cls


def base() -> Stores:
    """Two device-plugin nodes in two zones, a DRA node with a pod and one without, a node without GPUs; a pod on
    each device-plugin node and on the first DRA node (through a claim kube-scheduler made for `nvidia.com/gpu`)."""
    return stores_of(
        b.gpu_node("a", gpus=8, domains=EIGHT, labels={ZONE: "z1"}),
        b.gpu_node("b", gpus=8, domains=EIGHT, labels={ZONE: "z2"}),
        b.dra_node("d", domains=EIGHT, mutate=lambda n: n["metadata"]["labels"].update({ZONE: "z1"})),
        b.dra_node("e", domains=EIGHT), b.resource_slice("e", 8),
        b.gpu_node("cpu", gpus=0, topology="none", labels={ZONE: "z2"}),
        b.resource_slice("d", 8), gpu_class(), *b.tier_classes(), b.namespace("default"),
        b.pod("on-a", gpus=2, node="a", phase="Running", labels={"app": "web"}),
        b.pod("on-b", gpus=4, node="b", phase="Running", created="2026-11-21T09:00:00Z"),
        b.pod("on-d", gpus=2, node="d", phase="Running", mutate=b.with_extended_claim("on-d-gpu")),
        b.resource_claim("on-d-gpu", extended=True, devices=[("d", 0), ("d", 1)], reserved_for=["on-d"]),
        b.pod("daemon", node="a", phase="Running", mutate=host_port(9100)),
    )


def _cordon(node: dict[str, Any]) -> None:
    node["spec"]["unschedulable"] = True


def _bind(node: str) -> Callable[[dict[str, Any]], None]:
    def edit(pod: dict[str, Any]) -> None:
        pod["spec"].pop("schedulingGates", None)
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"
    return edit


def _taint_device(index: int) -> Callable[[dict[str, Any]], None]:
    def edit(slice_: dict[str, Any]) -> None:
        slice_["spec"]["devices"][index]["taints"] = [{"key": "broken", "effect": "NoSchedule"}]
    return edit


# Each row: a change of the stores (or of the occupancy), and what the snapshot built after it must show.
Change = Callable[[Stores, dict[str, dict[int, str]]], Any]
Probe = Callable[[snapshot.Snapshot], Any]


def _asks(resource: str) -> b.Mutator:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
    return mutate


def _nothing(stores: Stores, occupancy: dict[str, dict[int, str]]) -> None:
    pass


def row(change: Change, probe: Probe, expected: Any, *, id: str, prepare: Change = _nothing) -> Any:
    return pytest.param(prepare, change, probe, expected, id=id)


def _reallocate(claim: dict[str, Any]) -> None:
    results = claim["status"]["allocation"]["devices"]["results"]
    results[0] = {**results[0], "device": "gpu-5"}


def _limit(value: str) -> Callable[[dict[str, Any]], None]:
    return lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": value})


REORDERED = [b.gpu_device(i) for i in (1, 0, 2, 3, 4, 5, 6, 7)]

INVALIDATIONS = [
    # Adversarial rows first: what reaches a node through nothing but the DRA inventory (node e holds no pod),
    # another node's labels, other controllers' objects and fields.
    row(lambda s, o: put(s, b.resource_claim("orphan", extended=True, devices=[("e", 7)])),
        lambda snap: 7 in snap.nodes["e"].used, True, id="claim-of-no-pod-blocks-a-device-of-an-idle-node"),
    row(lambda s, o: put(s, b.resource_slice("e", 4)),
        lambda snap: snap.nodes["e"].gpu_count, 4, id="slice-with-fewer-devices-on-an-idle-node"),
    row(lambda s, o: put(s, b.resource_slice("e", REORDERED)),
        lambda snap: snap.nodes["e"].device_order, (1, 0, 2, 3, 4, 5, 6, 7), id="slice-device-order-on-an-idle-node"),
    row(lambda s, o: changed(s, "deviceclasses", "gpu.nvidia.com", lambda c: c["spec"].pop("extendedResourceName")),
        lambda snap: snap.nodes["e"].extended_gpus, False, id="device-class-stops-serving-nvidia-gpu"),
    row(lambda s, o: changed(s, "deviceclasses", "gpu.nvidia.com",
                             lambda c: c["spec"].update(extendedResourceName="example.com/gpu")),
        lambda snap: snap.nodes["a"].requested.get("nvidia.com/gpu"), 3,
        prepare=lambda s, o: put(s, b.pod("renamed", node="a", phase="Running", mutate=_asks("example.com/gpu"))),
        id="device-class-serves-a-resource-a-pod-without-claims-asks"),
    row(lambda s, o: changed(s, "nodes", "cpu", lambda n: n["metadata"]["labels"].update({ZONE: "z1"})),
        lambda snap: [t.owner for t in snap.nodes["a"].anti_affinity], ["default/near"],
        prepare=lambda s, o: put(s, b.pod("near", node="cpu", phase="Running", mutate=anti_affinity("web"))),
        id="non-gpu-node-relabelled-moves-its-pods-terms"),
    row(lambda s, o: o.update({"a": {6: "default/on-a", 7: "default/on-a"}}),
        lambda snap: snap.pods["default/on-a"].gpu_indices, (6, 7), id="dcgm-occupancy-moves-a-pods-gpus"),
    row(lambda s, o: changed(s, "resourceclaims", "default/on-d-gpu", _reallocate),
        lambda snap: snap.pods["default/on-d"].gpu_indices, (1, 5), id="claim-allocation-changes-devices"),
    # A pod parsed before its claim or template reached our store (separate watches): the entry it missed arrives.
    row(lambda s, o: put(s, b.resource_claim("late-gpu", extended=True, devices=[("d", 6)], reserved_for=["late"])),
        lambda snap: snap.pods["default/late"].dra.claims, ("default/late-gpu",),
        prepare=lambda s, o: put(s, b.pod("late", gpus=1, node="d", phase="Running",
                                          mutate=b.with_extended_claim("late-gpu"))),
        id="claim-arrives-after-its-pod"),
    row(lambda s, o: put(s, b.claim_template("t", spec=b.claim_spec(2))),
        lambda snap: "default/tp" in snap.pods and snap.pods["default/tp"].request.full, 2,
        prepare=lambda s, o: put(s, b.pod("tp", mutate=b.with_claim_template("t"))),
        id="template-arrives-after-its-pod"),
    row(lambda s, o: changed(s, "resourceclaimtemplates", "default/t",
                             lambda t: t["spec"].update(spec=b.claim_spec(4))),
        lambda snap: snap.pods["default/tp"].request.full, 4,
        prepare=lambda s, o: (put(s, b.claim_template("t", spec=b.claim_spec(2))),
                              put(s, b.pod("tp", mutate=b.with_claim_template("t")))),
        id="template-changes-what-its-pod-asks"),
    row(lambda s, o: s["deviceclasses"].pop("gpu.nvidia.com"),
        lambda snap: "default/tp" in snap.pods, False,
        prepare=lambda s, o: (put(s, b.claim_template("t", spec=b.claim_spec(2))),
                              put(s, b.pod("tp", mutate=b.with_claim_template("t")))),
        id="gpu-class-gone-a-pending-template-pod-asks-no-gpu"),
    row(lambda s, o: s["resourceclaims"].pop("default/on-d-gpu"),
        lambda snap: snap.pods["default/on-d"].indices_observed, False, id="claim-deallocated-indices-estimated"),
    row(lambda s, o: put(s, b.resource_claim("orphan", extended=True, devices=[("d", 7)])),
        lambda snap: 7 in snap.nodes["d"].used, True, id="claim-of-no-known-pod-blocks-a-device"),
    row(lambda s, o: changed(s, "resourceslices", "d-gpu.nvidia.com-1", _taint_device(3)),
        lambda snap: 3 in snap.nodes["d"].used, True, id="slice-device-tainted"),
    row(lambda s, o: put(s, b.resource_slice("d", 1)),
        lambda snap: snap.pods["default/on-d"].dra.devices, (dra.DeviceId(b.NVIDIA_DRIVER, "d", "gpu-0"),),
        id="slice-loses-a-device-an-unchanged-claim-holds"),
    row(lambda s, o: put(s, b.resource_slice("d", 4)),
        lambda snap: (snap.nodes["d"].gpu_count, snap.nodes["d"].free_gpus), (4, 2),
        id="slice-with-fewer-devices-reparses-the-node"),
    row(lambda s, o: put(s, b.pod("near", node="b", phase="Running", mutate=anti_affinity("web"))),
        lambda snap: ([t.owner for t in snap.nodes["a"].anti_affinity],
                      [t.owner for t in snap.nodes["b"].anti_affinity]),
        ([], ["default/near"]), id="anti-affinity-pod-covers-its-zone-only"),
    row(lambda s, o: changed(s, "pods", "default/daemon", host_port(9200)),
        lambda snap: {port for _, _, port in snap.nodes["a"].host_ports}, {9200}, id="non-gpu-pod-changes-host-port"),
    row(lambda s, o: changed(s, "pods", "default/daemon", _bind("b")),
        lambda snap: (snap.nodes["a"].requested["pods"], snap.nodes["b"].requested["pods"]), (1, 2),
        id="non-gpu-pod-moves-node"),
    row(lambda s, o: changed(s, "priorityclasses", "gpu-steward-normal", lambda pc: pc.update(value=7)),
        lambda snap: snap.priority_classes["gpu-steward-normal"].value, 7, id="priority-class-value"),
    row(lambda s, o: changed(s, "namespaces", "default", lambda ns: ns["metadata"].update(labels={"team": "x"})),
        lambda snap: snap.namespaces["default"], {"team": "x"}, id="namespace-labels"),
    # The pods' own changes.
    row(lambda s, o: changed(s, "pods", "default/on-b", lambda p: p["status"].update(phase="Succeeded")),
        lambda snap: (snap.nodes["b"].free_gpus, snap.nodes["b"].pods), (8, ()), id="pod-finishes"),
    row(lambda s, o: put(s, b.pod("early", gpus=4, node="b", phase="Running", created="2026-11-21T08:00:00Z")),
        lambda snap: snap.pods["default/on-b"].gpu_indices, (4, 5, 6, 7),
        id="older-pod-bound-takes-the-estimated-indices-first"),
    row(lambda s, o: put(s, b.pod("wait", gpus=1, mutate=lambda p: p["status"].update(nominatedNodeName="a"))),
        lambda snap: snap.nodes["a"].reserved, ("default/wait",), id="nomination-reserves-the-node"),
    row(lambda s, o: changed(s, "pods", "default/on-a", lambda p: p["metadata"].update(labels={"v": "2"})),
        lambda snap: snap.pods["default/on-a"].labels, {"v": "2"}, id="pod-relabelled"),
    row(lambda s, o: changed(s, "pods", "default/on-a", _limit("many")),
        lambda snap: ["default/on-a" in snap.pods, [p for p in snap.problems if "on-a" in p] != []], [False, True],
        id="unparsable-pod-a-problem"),
    # The nodes' own changes.
    row(lambda s, o: changed(s, "nodes", "a", _cordon),
        lambda snap: snap.nodes["a"].schedulable, False, id="node-cordoned"),
    row(lambda s, o: s["nodes"].pop("a"),
        lambda snap: ("a" in snap.nodes, snap.pods["default/on-a"].gpu_indices), (False, ()),
        id="node-removed-its-pods-lose-their-indices"),
]


@pytest.mark.parametrize(("prepare", "change", "probe", "expected"), INVALIDATIONS)
def test_a_change_reaches_the_next_build(prepare: Change, change: Change, probe: Probe, expected: Any) -> None:
    stores, occupancy = base(), {"a": {0: "default/on-a", 1: "default/on-a"}}
    prepare(stores, occupancy)
    builder = feeder.Builder(names=NAMES, gpu_classes=CLASSES)
    before = build(builder, stores, occupancy)
    occupancy = copy.deepcopy(occupancy)
    change(stores, occupancy)
    warm = build(builder, stores, occupancy)
    assert probe(warm) == expected
    assert probe(before) != expected  # the row changes what it probes
    assert_same(warm, fresh(stores, occupancy))


def test_what_no_change_touched_is_reused() -> None:
    stores = base()
    for i in range(3):
        put(stores, b.gpu_node(f"n{i}", gpus=8, domains=EIGHT))
        put(stores, b.pod(f"p{i}", gpus=1, node=f"n{i}", phase="Running"))
    builder = feeder.Builder(names=NAMES, gpu_classes=CLASSES)
    first = build(builder, stores)
    changed(stores, "pods", "default/p1", lambda p: p["metadata"].update(labels={"v": "2"}))
    second = build(builder, stores)
    assert second.nodes["n0"] is first.nodes["n0"] and second.pods["default/p0"] is first.pods["default/p0"]
    assert second.nodes["n1"] is not first.nodes["n1"] and second.pods["default/p1"].labels == {"v": "2"}
    assert second.dra is first.dra  # no DRA object changed: the inventory is not built again


def test_a_claim_change_parses_again_only_the_pods_that_read_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pod kube-scheduler binds on a DRA node writes a claim: the other claiming pods are kept as parsed."""
    stores = base()
    put(stores, b.pod("tp", node="e", phase="Running", mutate=b.with_claim_template("t", generated="tp-gpus")))
    put(stores, b.claim_template("t"))
    put(stores, b.pod("waits", mutate=b.with_claim("n")))  # its claim not made yet: a miss it depends on
    builder = feeder.Builder(names=NAMES, gpu_classes=CLASSES)
    build(builder, stores)
    parsed: list[str] = []
    real = snapshot.parse

    def counted(raw: Any, **kwargs: Any) -> Any:
        parsed.append(raw["metadata"]["name"])
        return real(raw, **kwargs)

    def parsed_again() -> list[str]:
        warm = build(builder, stores)
        again = sorted(parsed)
        assert_same(warm, fresh(stores))
        parsed.clear()
        return again

    monkeypatch.setattr(snapshot, "parse", counted)
    put(stores, b.pod("new", gpus=1, node="d", phase="Running", mutate=b.with_extended_claim("new-gpu")))
    put(stores, b.resource_claim("new-gpu", extended=True, devices=[("d", 5)], reserved_for=["new"]))
    assert parsed_again() == ["new"]
    put(stores, b.resource_claim("n"))
    assert parsed_again() == ["waits"]
    changed(stores, "resourceclaims", "default/on-d-gpu", _reallocate)
    assert parsed_again() == ["on-d"]
    put(stores, b.resource_claim("orphan", extended=True, devices=[("e", 7)]))
    assert parsed_again() == []  # a claim no pod names
    changed(stores, "resourceclaims", "default/on-d-gpu", lambda c: None)
    put(stores, b.resource_claim("orphan-2", extended=True, devices=[("e", 6)]))
    assert parsed_again() == []  # a pod's claim sent again, equal in content, beside another claim's change
    changed(stores, "pods", "default/waits", lambda p: p["spec"].pop("resourceClaims"))
    assert parsed_again() == ["waits"]
    changed(stores, "resourceclaims", "default/n", lambda c: c["spec"].update(b.claim_spec(2)))
    assert parsed_again() == []  # it no longer names the claim


def test_a_build_that_raises_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    stores = base()
    builder = feeder.Builder(names=NAMES, gpu_classes=CLASSES)
    build(builder, stores)
    changed(stores, "pods", "default/on-a", _bind("b"))
    real = snapshot_nodes.assemble

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(snapshot_nodes, "assemble", broken)
    with pytest.raises(RuntimeError):
        build(builder, stores)
    monkeypatch.setattr(snapshot_nodes, "assemble", real)
    assert_same(build(builder, stores), fresh(stores))


def test_nodes_reparsed_only_when_their_object_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from common import topology

    stores = base()
    builder = feeder.Builder(names=NAMES, gpu_classes=CLASSES)
    build(builder, stores)
    changed(stores, "nodes", "b", lambda n: None)  # sent again, equal in content
    calls: list[str] = []
    real = topology.from_node

    def counted(raw: Any, **kwargs: Any) -> Any:
        calls.append(raw["metadata"]["name"])
        return real(raw, **kwargs)

    monkeypatch.setattr(topology, "from_node", counted)
    warm = build(builder, stores)
    assert calls == ["b"]
    assert_same(warm, fresh(stores))


# --- random sequences of changes ---------------------------------------------------------------------------------

POD_SIZES = (0, 1, 2, 4, 8)


def _new_pod(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    name = f"r{rng.randrange(10**6)}"
    nodes = sorted(n for n in stores["nodes"] if n not in ("d", "e"))
    mutators: list[b.Mutator] = []
    node = rng.choice([None, *nodes])
    if rng.random() < 0.2:
        mutators.append(anti_affinity(rng.choice(["web", "db"])))
    if rng.random() < 0.2:
        mutators.append(host_port(rng.choice([8080, 9100])))
    if node is None and rng.random() < 0.5:
        mutators.append(gated)
    if rng.random() < 0.2:
        mutators.append(lambda p: p["metadata"].setdefault("labels", {}).update({NAMES.gang_name: "g"}))
    if rng.random() < 0.1:
        mutators.append(_asks("example.com/gpu"))
    put(stores, b.pod(name, gpus=rng.choice(POD_SIZES), node=node, phase="Running" if node else "Pending",
                      labels={"app": rng.choice(["web", "db"])}, created=f"2026-11-21T10:00:{rng.randrange(60):02d}Z",
                      mutate=b.both(*mutators)))


def _pick(stores: Stores, kind: str, rng: random.Random) -> str | None:
    keys = sorted(stores[kind])
    return rng.choice(keys) if keys else None


def _bind_pod(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    key, node = _pick(stores, "pods", rng), _pick(stores, "nodes", rng)
    if key and node:
        changed(stores, "pods", key, _bind(node))


def _delete_pod(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    if key := _pick(stores, "pods", rng):
        del stores["pods"][key]


def _relabel_pod(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    if key := _pick(stores, "pods", rng):
        changed(stores, "pods", key, lambda p: p["metadata"].update(labels={"app": rng.choice(["web", "db", "x"])}))


def _nominate_or_finish(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    key, node = _pick(stores, "pods", rng), _pick(stores, "nodes", rng)
    if key and node:
        changed(stores, "pods", key, lambda p: p["status"].update(
            nominatedNodeName=node) if rng.random() < 0.5 else p["status"].update(phase="Succeeded"))


def _resend(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    kind = rng.choice(["pods", "nodes", "resourceslices", "resourceclaims"])
    if key := _pick(stores, kind, rng):
        changed(stores, kind, key, lambda obj: None)


def _node_change(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    what = rng.choice(["add", "cordon", "remove", "zone"])
    name = _pick(stores, "nodes", rng)
    if what == "add" or name is None:
        put(stores, b.gpu_node(f"n{rng.randrange(5)}", gpus=rng.choice([4, 8]), domains=None,
                               labels={ZONE: rng.choice(["z1", "z2"])}))
    elif what == "cordon":
        changed(stores, "nodes", name, _cordon)
    elif what == "remove":
        del stores["nodes"][name]
    else:
        changed(stores, "nodes", name, lambda n: n["metadata"]["labels"].update({ZONE: rng.choice(["z1", "z2"])}))


def _cluster_change(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    what = rng.choice(["priority", "namespace", "occupancy", "claim", "orphan", "unclaim", "slice", "class"])
    if what == "priority":
        changed(stores, "priorityclasses", "gpu-steward-normal", lambda pc: pc.update(value=rng.randrange(100)))
    elif what == "namespace":
        changed(stores, "namespaces", "default", lambda ns: ns["metadata"].update(labels={"t": str(rng.random())}))
    elif what == "occupancy":
        node, key = rng.choice(["a", "b", "n0"]), _pick(stores, "pods", rng)
        occupancy[node] = {} if key is None else {i: key for i in rng.sample(range(8), rng.randrange(1, 3))}
    elif what == "claim":
        name = f"c{rng.randrange(10**6)}"
        put(stores, b.pod(name, gpus=2, node="d", phase="Running", mutate=b.with_extended_claim(f"{name}-gpu")))
        put(stores, b.resource_claim(f"{name}-gpu", extended=True, reserved_for=[name],
                                     devices=[("d", i) for i in rng.sample(range(8), rng.randrange(1, 3))]))
    elif what == "orphan":
        put(stores, b.resource_claim(f"o{rng.randrange(10**6)}", extended=True,
                                     devices=[(rng.choice(["d", "e"]), rng.randrange(8))]))
    elif what == "unclaim":
        if key := _pick(stores, "resourceclaims", rng):
            del stores["resourceclaims"][key]
    elif what == "slice":
        node, order = rng.choice(["d", "e"]), rng.sample(range(8), 8) if rng.random() < 0.3 else range(8)
        put(stores, b.resource_slice(node, rng.choice([4, 8])) if rng.random() < 0.5 else
            b.resource_slice(node, [b.gpu_device(i, mutate=(lambda d: d.update(
                taints=[{"key": "k", "effect": "NoSchedule"}])) if i == 2 else None) for i in order]))
    else:
        changed(stores, "deviceclasses", "gpu.nvidia.com", lambda c: c["spec"].update(
            extendedResourceName=rng.choice(["nvidia.com/gpu", "example.com/gpu"])) if rng.random() < 0.7
            else c["spec"].pop("extendedResourceName", None))


def _claim_change(stores: Stores, occupancy: dict[str, dict[int, str]], rng: random.Random) -> None:
    """Claims and templates a few pods name (`t0`-`t2`, `n0`-`n2`), each arriving, changing or going in any order
    against the pods: a parse reads entries that may not exist yet (`dra_reads`)."""
    what, i = rng.choice(["template pod", "named pod", "template", "named claim", "reallocate", "rule"]), \
        rng.randrange(3)
    node = rng.choice([None, "d", "e"])
    if what == "template pod":
        made = f"p{rng.randrange(10**6)}"
        put(stores, b.pod(made, node=node, phase="Running" if node else "Pending", mutate=b.with_claim_template(
            f"t{i}", generated=f"{made}-gpus" if rng.random() < 0.5 else None)))
    elif what == "named pod":
        put(stores, b.pod(f"p{rng.randrange(10**6)}", node=node, phase="Running" if node else "Pending",
                          mutate=b.with_claim(f"n{i}")))
    elif what == "template":
        if rng.random() < 0.3:
            stores["resourceclaimtemplates"].pop(f"default/t{i}", None)
        else:
            put(stores, b.claim_template(f"t{i}", spec=b.claim_spec(rng.choice([1, 2, 4]))))
    elif what == "named claim":
        if rng.random() < 0.3:
            stores["resourceclaims"].pop(f"default/n{i}", None)
        else:
            put(stores, b.resource_claim(f"n{i}", spec=b.claim_spec(rng.choice([1, 2])),
                                         devices=[(rng.choice(["d", "e"]), rng.randrange(8))] if node else ()))
    elif what == "rule":  # a DeviceTaintRule on one device: made, moved or gone
        if rng.random() < 0.3:
            stores["devicetaintrules"].pop("drain", None)
        else:
            put(stores, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "drain"},
                         "spec": {"deviceSelector": {"pool": rng.choice(["d", "e"]), "device": f"gpu-{i}"},
                                  "taint": {"key": "maintenance", "effect": "NoSchedule"}}})
    elif key := _pick(stores, "resourceclaims", rng):  # reallocate: other devices, or none (deallocated)
        changed(stores, "resourceclaims", key, lambda c: c.update(status={"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": b.NVIDIA_DRIVER, "pool": rng.choice(["d", "e"]),
             "device": f"gpu-{rng.randrange(8)}"}]}}} if rng.random() < 0.7 else {}))


STEPS = [_new_pod, _new_pod, _bind_pod, _delete_pod, _relabel_pod, _nominate_or_finish, _resend, _node_change,
         _cluster_change, _claim_change]


@hypothesis_settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(STEPS), st.integers(0, 2**32)), min_size=1, max_size=25))
def test_random_changes_build_what_a_fresh_build_gives(
        steps: list[tuple[Callable[[Stores, dict[str, dict[int, str]], random.Random], None], int]]) -> None:
    stores, occupancy = base(), {"a": {0: "default/on-a"}}
    builder = feeder.Builder(names=NAMES, gpu_classes=CLASSES)
    build(builder, stores, occupancy)
    for step, seed in steps:
        occupancy = copy.deepcopy(occupancy)
        step(stores, occupancy, random.Random(seed))
        assert_same(build(builder, stores, occupancy), fresh(stores, occupancy))
