"""Kubernetes' own nomination, proven on every Kubernetes version the project builds (issue 28; DESIGN.md,
"Nominate, never pin"): what release relies on when it says where a pod goes with `status.nominatedNodeName`
instead of pinning it with a required node term.

1. A controller may set `status.nominatedNodeName` on a gated pod (a `pods/status` merge patch, under a role
   that grants no other write); it stays while the pod is gated. Control: the same patch on the pod itself
   (not its status subresource) is accepted but the field is dropped.
2. While the gated pod is nominated to node A, kube-scheduler keeps A's resources for it from equal- and
   lower-priority pods: a never-gated racer that prefers A (weight 100) and would fit there only on the
   nominated pod's GPUs is placed on B. Control: without the nomination it takes A. A higher-priority racer
   ignores the nomination and takes A.
3. Once un-gated with no pin, the pod binds to its nominated node although its own preferred term favours
   the other node, and the API server clears `nominatedNodeName` on binding
   (`ClearingNominatedNodeNameAfterBinding`). Control: without the nomination it binds where it prefers.
4. Nominated to a node that has meanwhile filled up (a higher-priority pod took it, or a pod was bound there
   directly), the un-gated pod binds elsewhere: nothing strands. Control: the same pod pinned to A by a
   required term stays Unschedulable.
5. At full load: six gated 4-GPU pods nominated to fill three 8-GPU nodes hold every GPU against six
   equal-priority racers (all stay Pending), and once un-gated each binds on its nominated node although it
   preferred another.
6. Where the versions differ: after a kube-scheduler restart (or leader change) a gated pod's stored
   nomination reserves its node again on 1.37.2, but on 1.36.3 only from the pod's next update on
   (kubernetes/kubernetes#139057, fixed in 1.37).
7. On nodes whose GPUs are DRA devices (a DeviceClass serving `nvidia.com/gpu`, a ResourceSlice per node), a
   nomination keeps the node's CPU and memory for the nominated pod but **not its devices**: an equal-priority
   racer that prefers A takes A's devices the nominated pod was to get (kube-scheduler's DynamicResources plugin
   has no PreFilterExtensions, so nominated pods are not added to its view; kubernetes/enhancements#4981). The
   nominated pod, once un-gated, binds elsewhere: nothing strands, but the plan's node is lost (fact 2's control
   is on device-plugin nodes).
8. Nor does kube-scheduler preempt for DRA devices: a higher-priority pod asking the GPUs a lower-priority pod
   holds on a DRA node stays Unschedulable, not nominated, and the lower-priority pod keeps running (KEP-5690,
   "DRA preemption", is not in 1.37). Control: the same pods on a device-plugin node, where it preempts.

All six seen on 1.37.2 and on 1.36.3 (2026-11-28: 24 passed, 12 per version; kube-scheduler's
`NominatedNodeNameForExpectation` and `ClearingNominatedNodeNameAfterBinding` are beta and on by default since
1.35), 6 as the versions differ. Each test runs once per version
in `localcluster.KUBERNETES_VERSIONS`, on a plain cluster of its own (no webhook, no feature gates), so an
upgrade that changes any of these facts fails here.

Facts 7 and 8 were first seen on 2026-12-06 (8 passed, 4 per version). Each test makes its own kwok nodes,
labelled with a group of its own that all its pods select (the other tests'
nodes never compete); the scheduler's decisions are awaited by polling the API up to a generous bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import secrets
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from common import settings
from gpu_steward_lab import dra_devices, localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

GATE = "e2e.gpu-steward.io/hold"
GROUP_LABEL = "e2e.gpu-steward.io/facts-group"
HOSTNAME = "kubernetes.io/hostname"
LOW, MID, HIGH = "facts-low", "facts-mid", "facts-high"
CLASSES = {LOW: 100, MID: 500, HIGH: 1000}
# The nominating client: a ServiceAccount whose only write is `patch` on `pods/status` (what the chart's
# descheduler role needs for release to nominate; `get` too only because `kubectl patch` reads the object
# first), used by impersonation from the admin kubeconfig.
NOMINATOR_NAMESPACE = "gpu-steward-facts"
NOMINATOR = "nominator"
NOMINATOR_USER = f"system:serviceaccount:{NOMINATOR_NAMESPACE}:{NOMINATOR}"
BOUND_SECONDS = 60  # generous: kube-scheduler decides in well under a second on an idle machine
NAMES = settings.Names()


def _nominator_rbac() -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NOMINATOR_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": NOMINATOR, "namespace": NOMINATOR_NAMESPACE}},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "gpu-steward-facts-nominator"},
         "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch"]}]},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "gpu-steward-facts-nominator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "gpu-steward-facts-nominator"},
         "subjects": [{"kind": "ServiceAccount", "name": NOMINATOR, "namespace": NOMINATOR_NAMESPACE}]},
    ]  # fmt: skip


def _start(version: str, pytestconfig: pytest.Config) -> localcluster.LocalCluster:
    """A plain control plane of Kubernetes `version` with the tests' PriorityClasses and the nominator's RBAC."""
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
        cluster.apply([kube.priority_class(name, value=value) for name, value in CLASSES.items()])
        cluster.apply(_nominator_rbac())
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module", params=localcluster.KUBERNETES_VERSIONS, ids=lambda v: f"k8s-{v}")
def versioned_cluster(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config
) -> Iterator[localcluster.LocalCluster]:
    """One version's cluster, shared by the module's tests on that version (they run on each in turn)."""
    with localcluster.sigterm_as_interrupt():
        cluster = _start(request.param, pytestconfig)
        try:
            yield cluster
        finally:
            cluster.stop()


@dataclasses.dataclass
class Lab:
    """One test's namespace and kwok nodes on one version's cluster; its pods select only its nodes."""

    cluster: localcluster.LocalCluster
    namespace: str
    group: str
    node_names: list[str] = dataclasses.field(default_factory=list)
    slices: list[str] = dataclasses.field(default_factory=list)

    def add_nodes(self, count: int, *, dra: bool = False) -> list[str]:
        """`count` more 8-GPU nodes (two NVLink domains of 4, 64 CPUs) in this test's group; their names.
        `dra`: their GPUs are DRA devices (NVIDIA's DeviceClass serving `nvidia.com/gpu`, a ResourceSlice of 8
        devices per node, no `nvidia.com/gpu` in their allocatable)."""
        nodes = localcluster.gpu_nodes(
            f"{count}x8g2d", names=NAMES, name_prefix=f"facts-{self.group}-{len(self.node_names)}", cpu="64"
        )
        for node in nodes:
            node["metadata"]["labels"][GROUP_LABEL] = self.group
        if dra:
            nodes = [dra_devices.without_device_plugin(node) for node in nodes]
        names = self.cluster.add_nodes(nodes)
        self.node_names += names
        if dra:
            slices = [dra_devices.resource_slice(name, 8) for name in names]
            self.cluster.apply([dra_devices.device_class(), *slices])
            self.slices += [str(s["metadata"]["name"]) for s in slices]
        return names

    def pod(
        self,
        name: str,
        *,
        gpus: int,
        priority_class: str = MID,
        gated: bool = False,
        prefers: str | None = None,
        pinned_to: str | None = None,
        cpu: str | None = None,
    ) -> dict[str, Any]:
        prefer = [(100, {"matchExpressions": [kube.requirement(HOSTNAME, "In", prefers)]})] if prefers else []
        pin = [{"matchExpressions": [kube.requirement(HOSTNAME, "In", pinned_to)]}] if pinned_to else None
        body = kube.pod(
            name,
            namespace=self.namespace,
            gpus=gpus,
            gates=[GATE] if gated else (),
            priority_class=priority_class,
            node_selector={GROUP_LABEL: self.group},
            preferred_terms=prefer,
            required_terms=pin,
        )
        if cpu is not None:
            body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        return body

    def create(self, body: Mapping[str, Any]) -> None:
        self.cluster.kubectl("create", "-f", "-", input=json.dumps(body))

    def create_pod(self, name: str, **kwargs: Any) -> None:
        self.create(self.pod(name, **kwargs))

    def get(self, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.cluster.kubectl_json("get", "pod", name, "-n", self.namespace)
        return pod

    def patch(
        self, name: str, patch_type: str, body: Any, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(
            "patch", "pod", name, "-n", self.namespace, f"--type={patch_type}", "-p", json.dumps(body), *args,
            check=check,
        )  # fmt: skip

    def nominate(self, name: str, node: str) -> None:
        """What release does: a merge patch of `pods/status`, as the nominating ServiceAccount."""
        self.patch(
            name, "merge", {"status": {"nominatedNodeName": node}}, "--subresource=status", f"--as={NOMINATOR_USER}"
        )

    def ungate(self, name: str) -> None:
        self.patch(name, "json", [{"op": "remove", "path": "/spec/schedulingGates"}])

    def wait_bound(self, name: str) -> dict[str, Any]:
        """The pod as first seen bound to a node."""

        def bound() -> dict[str, Any] | None:
            pod = self.get(name)
            return pod if pod["spec"].get("nodeName") else None

        return kube.poll(f"{name} bound", bound, timeout_seconds=BOUND_SECONDS)

    def wait_unschedulable(self, name: str) -> dict[str, Any]:
        """The pod as first seen reported Unschedulable by kube-scheduler."""

        def unschedulable() -> dict[str, Any] | None:
            pod = self.get(name)
            return pod if kube.scheduled_reason(pod) == "Unschedulable" else None

        return kube.poll(f"{name} Unschedulable", unschedulable, timeout_seconds=BOUND_SECONDS)


def nominated(pod: Mapping[str, Any]) -> str | None:
    value = (pod.get("status") or {}).get("nominatedNodeName")
    return str(value) if value else None


def held(pod: Mapping[str, Any]) -> bool:
    """Still gated and unbound."""
    return (
        kube.gates(pod) == [GATE]
        and not pod["spec"].get("nodeName")
        and kube.scheduled_reason(pod) == "SchedulingGated"
    )


@pytest.fixture
def lab(versioned_cluster: localcluster.LocalCluster) -> Iterator[Lab]:
    with lab_in(versioned_cluster) as lab:
        yield lab


@contextlib.contextmanager
def lab_in(cluster: localcluster.LocalCluster) -> Iterator[Lab]:
    """A fresh namespace and node group on `cluster`; both deleted after."""
    namespace = f"facts-{secrets.token_hex(4)}"
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=30s")
    lab = Lab(cluster, namespace, secrets.token_hex(3))
    try:
        yield lab
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        if lab.slices:  # the DeviceClass too: the other tests' nodes have the device plugin's GPUs
            cluster.kubectl("delete", "resourceslice", *lab.slices, "--ignore-not-found", check=False)
            cluster.kubectl("delete", "deviceclass", dra_devices.NVIDIA_DRIVER, "--ignore-not-found", check=False)
        if lab.node_names:
            cluster.kubectl("delete", "node", *lab.node_names, "--wait=false", check=False)


# --- fact 1: a controller may nominate a gated pod ---------------------------------------------------


def test_a_controller_may_nominate_a_gated_pod_and_the_nomination_stays_while_gated(lab: Lab) -> None:
    a, _ = lab.add_nodes(2)
    lab.create_pod("held", gpus=8, gated=True)

    # Control: on the pod itself the field is status, which a pod update drops without a word.
    lab.patch("held", "merge", {"status": {"nominatedNodeName": a}})
    assert nominated(lab.get("held")) is None

    lab.nominate("held", a)
    assert nominated(lab.get("held")) == a

    # The scheduler sees the pod again (an update re-queues a gated pod), then decides on a pod created after:
    # by then it has handled the update too (one pod informer, events in order).
    lab.cluster.kubectl("label", "pod", "held", "-n", lab.namespace, "touched=yes")
    lab.create_pod("witness", gpus=1)
    lab.wait_bound("witness")
    after = lab.get("held")
    assert held(after)
    assert nominated(after) == a


# --- fact 2: a nomination reserves the node against equal- and lower-priority pods ---------------------


@pytest.mark.parametrize(
    ("racer_class", "nominate", "racer_node"),
    [
        pytest.param(HIGH, True, "A", id="higher-priority-racer-ignores-the-nomination"),
        pytest.param(MID, False, "A", id="control-without-nomination-racer-takes-A"),
        pytest.param(MID, True, "B", id="equal-priority-racer-goes-elsewhere"),
        pytest.param(LOW, True, "B", id="lower-priority-racer-goes-elsewhere"),
    ],
)
def test_a_gated_pods_nomination_keeps_its_node_from_equal_and_lower_priority_pods(
    lab: Lab, racer_class: str, nominate: bool, racer_node: str
) -> None:
    a, b = lab.add_nodes(2)
    lab.create_pod("held", gpus=8, gated=True)  # all of A's GPUs
    if nominate:
        lab.nominate("held", a)

    lab.create_pod("racer", gpus=4, priority_class=racer_class, prefers=a)  # fits on A only on held's GPUs

    assert lab.wait_bound("racer")["spec"]["nodeName"] == {"A": a, "B": b}[racer_node]
    after = lab.get("held")
    assert held(after)
    assert nominated(after) == (a if nominate else None)


# --- fact 3: once un-gated, the pod binds to its nominated node ----------------------------------------


@pytest.mark.parametrize(
    ("nominate", "bound_on"),
    [
        pytest.param(False, "B", id="control-without-nomination-binds-where-it-prefers"),
        pytest.param(True, "A", id="nominated-binds-on-its-nomination-against-its-preference"),
    ],
)
def test_an_ungated_pod_binds_to_its_nominated_node_and_the_nomination_is_cleared(
    lab: Lab, nominate: bool, bound_on: str
) -> None:
    a, b = lab.add_nodes(2)
    lab.create_pod("held", gpus=4, gated=True, prefers=b)
    if nominate:
        lab.nominate("held", a)

    lab.ungate("held")

    bound = lab.wait_bound("held")
    assert bound["spec"]["nodeName"] == {"A": a, "B": b}[bound_on]
    assert nominated(bound) is None  # cleared in the binding's own write: never seen bound and nominated


# --- fact 4: a nomination that no longer fits yields; a pin strands ------------------------------------


@pytest.mark.parametrize(
    ("filled_by", "pinned", "outcome"),
    [
        pytest.param("higher-priority-pod", True, "Unschedulable", id="control-pinned-to-A-strands"),
        pytest.param("higher-priority-pod", False, "B", id="A-taken-by-a-higher-priority-pod-binds-on-B"),
        pytest.param("pod-bound-directly", False, "B", id="A-taken-by-a-pod-bound-directly-binds-on-B"),
    ],
)
def test_a_pod_nominated_to_a_node_that_filled_up_binds_elsewhere(
    lab: Lab, filled_by: str, pinned: bool, outcome: str
) -> None:
    a, b = lab.add_nodes(2)
    lab.create_pod("held", gpus=8, gated=True, pinned_to=a if pinned else None)
    lab.nominate("held", a)
    filler = lab.pod("filler", gpus=8, priority_class=HIGH, prefers=a)
    if filled_by == "pod-bound-directly":
        filler["spec"]["nodeName"] = a
    lab.create(filler)
    assert lab.wait_bound("filler")["spec"]["nodeName"] == a

    lab.ungate("held")

    if outcome == "Unschedulable":
        stuck = lab.wait_unschedulable("held")
        assert not stuck["spec"].get("nodeName")
        return
    bound = lab.wait_bound("held")
    assert bound["spec"]["nodeName"] == b
    assert nominated(bound) is None


# --- at full load: nominations hold every GPU, then each pod binds where it was nominated ----------------


def test_at_full_load_nominations_hold_every_gpu_against_equal_priority_racers(lab: Lab) -> None:
    nodes = lab.add_nodes(3)
    plan = {f"held-{i}": nodes[i // 2] for i in range(6)}  # two 4-GPU pods fill each 8-GPU node
    preferred = {name: nodes[(nodes.index(node) + 1) % 3] for name, node in plan.items()}  # another node
    for name in plan:
        lab.create_pod(name, gpus=4, gated=True, prefers=preferred[name])
    for name, node in plan.items():
        lab.nominate(name, node)

    racers = [f"racer-{i}" for i in range(6)]
    for racer in racers:
        lab.create_pod(racer, gpus=4)
    for racer in racers:
        lab.wait_unschedulable(racer)
    assert all(held(lab.get(name)) for name in plan)

    for name in plan:
        lab.ungate(name)

    bound = {name: lab.wait_bound(name) for name in plan}
    assert {name: pod["spec"]["nodeName"] for name, pod in bound.items()} == plan
    assert all(nominated(pod) is None for pod in bound.values())
    assert [r for r in racers if lab.get(r)["spec"].get("nodeName")] == []


# --- a kube-scheduler restart while a gated pod is nominated: where the versions differ ------------------


@pytest.fixture(params=localcluster.KUBERNETES_VERSIONS, ids=lambda v: f"k8s-{v}")
def restartable_cluster(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config, tmp_path: pathlib.Path
) -> Iterator[Restartable]:
    """A cluster of its own (its kube-scheduler is replaced by the test), stopped by PID after."""
    version: str = request.param
    with localcluster.sigterm_as_interrupt():
        cluster = _start(version, pytestconfig)
        restartable = Restartable(cluster, version, tmp_path)
        try:
            yield restartable
        finally:
            try:
                restartable.stop_replacement()
            finally:
                cluster.stop()


@dataclasses.dataclass
class Restartable:
    cluster: localcluster.LocalCluster
    version: str
    tmp_path: pathlib.Path
    replacement: localcluster.ManagedProcess | None = None

    def restart_scheduler(self) -> None:
        """Stop kube-scheduler by PID and start it again with the same command line (kwokctl's binary runtime
        does not supervise its processes); the new one is ours to stop."""
        old = self.cluster.pids["kube-scheduler"]
        argv = pathlib.Path(f"/proc/{old.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        localcluster.stop_pids({"kube-scheduler": old}, grace_seconds=10)
        self.replacement = localcluster.ManagedProcess(
            "kube-scheduler", [a.decode() for a in argv], log_file=self.tmp_path / "kube-scheduler.log"
        ).start()

    def stop_replacement(self) -> None:
        if self.replacement is not None:
            self.replacement.stop()


# kube-scheduler records a pod's nomination when an update event brings it, on every version; when the pod is
# first seen (an add: after a restart, a leader change) only 1.37 records it for a gated pod
# (kubernetes/kubernetes#139057, "Fixed a bug, where nomination of gated pod wasn't preventing lower priority
# pods from scheduling on the nominated space"; 1.36.3's PriorityQueue.moveToActiveQ nominates only pods it
# queues as active). Where the first racer lands after a restart, by version:
FIRST_RACER_AFTER_RESTART = {"1.37.2": "B", "1.36.3": "A"}


def test_a_kube_scheduler_restart_keeps_a_gated_pods_reservation_from_1_37_on(restartable_cluster: Restartable) -> None:
    """After kube-scheduler restarts, a gated pod's stored nomination reserves its node again on 1.37.2; on
    1.36.3 it does not until the pod's next update (here a label): then a second racer goes elsewhere."""
    restartable = restartable_cluster
    with lab_in(restartable.cluster) as lab:
        a, b = lab.add_nodes(2)
        lab.create_pod("held", gpus=8, gated=True)
        lab.nominate("held", a)

        restartable.restart_scheduler()
        lab.create_pod("racer", gpus=4, prefers=a)  # equal priority; fits on A only on held's GPUs

        first = lab.wait_bound("racer")["spec"]["nodeName"]
        assert first == {"A": a, "B": b}[FIRST_RACER_AFTER_RESTART[restartable.version]]
        assert nominated(lab.get("held")) == a  # stored all along: only the scheduler's memory differs
        lab.cluster.kubectl("label", "pod", "held", "-n", lab.namespace, "touched=yes")
        lab.create_pod("racer-2", gpus=4, prefers=a)
        assert lab.wait_bound("racer-2")["spec"]["nodeName"] == b
        assert held(lab.get("held"))


# --- on DRA nodes: a nomination holds CPU and memory but not devices, and nothing preempts for devices -------


@pytest.mark.parametrize(
    ("held_cpu", "racer_gpus", "racer_cpu", "racer_node"),
    [
        pytest.param(None, 4, None, "A", id="equal-priority-racer-takes-the-nominated-devices"),
        pytest.param("60", 0, "8", "B", id="equal-priority-racer-is-kept-off-the-nominated-cpu"),
    ],
)
def test_on_dra_nodes_a_nomination_keeps_cpu_and_memory_but_not_devices(
    lab: Lab, held_cpu: str | None, racer_gpus: int, racer_cpu: str | None, racer_node: str
) -> None:
    a, b = lab.add_nodes(2, dra=True)
    lab.create_pod("held", gpus=8, gated=True, cpu=held_cpu)  # all of A's devices (and 60 of its 64 CPUs)
    lab.nominate("held", a)

    # Equal priority, prefers A, fits there only on what held was nominated for: 4 devices, or 8 CPUs.
    lab.create_pod("racer", gpus=racer_gpus, cpu=racer_cpu, prefers=a)

    assert lab.wait_bound("racer")["spec"]["nodeName"] == {"A": a, "B": b}[racer_node]
    assert held(lab.get("held"))
    assert nominated(lab.get("held")) == a
    lab.ungate("held")
    # Where the racer took A's devices, held no longer fits A: it binds on B (nothing strands), off its plan.
    assert lab.wait_bound("held")["spec"]["nodeName"] == {"A": b, "B": a}[racer_node]


@pytest.mark.parametrize(
    "dra",
    [
        pytest.param(False, id="control-device-plugin-node-preempts"),
        pytest.param(True, id="dra-node-no-preemption-for-devices"),
    ],
)
def test_kube_scheduler_preempts_for_device_plugin_gpus_but_not_for_dra_devices(lab: Lab, dra: bool) -> None:
    (a,) = lab.add_nodes(1, dra=dra)
    lab.create_pod("victim", gpus=8, priority_class=LOW)
    assert lab.wait_bound("victim")["spec"]["nodeName"] == a

    lab.create_pod("preemptor", gpus=8, priority_class=HIGH)

    if not dra:
        gone = kube.poll(
            "victim preempted",
            lambda: "victim" not in kube.pods(lab.cluster, lab.namespace),
            timeout_seconds=BOUND_SECONDS,
        )
        assert gone
        assert lab.wait_bound("preemptor")["spec"]["nodeName"] == a
        return
    # Preemption runs in the very cycle that reports the pod Unschedulable: had it found a victim, the pod
    # would be nominated to A in the same status write.
    stuck = lab.wait_unschedulable("preemptor")
    message = next(c.get("message", "") for c in stuck["status"]["conditions"] if c["type"] == "PodScheduled")
    assert nominated(stuck) is None, message
    assert "cannot allocate all claims" in message
    victim = lab.get("victim")
    assert victim["spec"]["nodeName"] == a and not victim["metadata"].get("deletionTimestamp")
