"""Kubernetes' native gang scheduling (KEP-4671) as release would use it, proven on the real control plane
(issue 28: "a released gang binds all-or-nothing"): what a gang of ours would get from a gang PodGroup if the
webhook named it in `spec.schedulingGroup.podGroupName` at creation and release created it before nominating
and un-gating the members.

a. A gated pod may be created naming a PodGroup that does not exist yet, and stays SchedulingGated. Control: an
   un-gated pod naming a missing PodGroup never binds while the PodGroup is missing (kube-scheduler's
   GangScheduling PreEnqueue: "waiting for pods's pod group ... to appear"), and binds once it appears: every
   path that lifts our gate must make sure the PodGroup exists first.
b. With a gang PodGroup (minCount = gang size), members nominated and un-gated one by one bind on their
   nominated nodes.
c. A nominated node cordoned between nomination and un-gating, with no room elsewhere: no member binds (none
   part-running). Control: the same without the PodGroup part-runs (the member whose node is still free binds).
   With room elsewhere the whole gang binds.
d. Members waiting for room stay Pending, none bound, and all bind once room appears (the node uncordoned), but
   not necessarily on their nominations any more (seen once in three runs on 1.37.2: swapped).

Each test runs on each Kubernetes version in `CLUSTERS`: 1.37.2 with `GenericWorkload` (which alone turns on
kube-scheduler's GangScheduling plugin: pkg/scheduler/apis/config/v1/default_plugins.go) and
`scheduling.k8s.io/v1beta1`; 1.36.3 with `GenericWorkload` and its separate alpha gate `GangScheduling`, and
`scheduling.k8s.io/v1alpha2`; and 1.37.2 with the API served but the GangScheduling plugin disabled in the
scheduler's configuration (what a cluster may do, and what API discovery cannot see).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.e2e import test_nomination_facts_e2e as facts
from tests.support import kube

pytestmark = pytest.mark.e2e

HOLD_SECONDS = 5  # how long a held gang is watched to stay unbound (kube-scheduler decides in well under 1 s)


@dataclasses.dataclass(frozen=True)
class Flavour:
    version: str
    feature_gates: dict[str, bool]
    api: str  # the PodGroup group/version served
    gang_plugin: bool  # kube-scheduler's GangScheduling plugin enabled
    honours_nomination: bool  # a gang member binds on its nominated node


CLUSTERS = {
    "k8s-1.37.2": Flavour("1.37.2", {"GenericWorkload": True}, "scheduling.k8s.io/v1beta1", True, True),
    "k8s-1.36.3": Flavour("1.36.3", {"GenericWorkload": True, "GangScheduling": True},
                          "scheduling.k8s.io/v1alpha2", True, False),
    "k8s-1.37.2-no-gang-plugin": Flavour("1.37.2", {"GenericWorkload": True}, "scheduling.k8s.io/v1beta1", False,
                                        True),
}  # fmt: skip


def _scheduler_config(flavour: Flavour) -> dict[str, Any] | None:
    if flavour.gang_plugin:
        return None
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "default-scheduler",
                      "plugins": {"multiPoint": {"disabled": [{"name": "GangScheduling"}]}}}],
    }  # fmt: skip


@dataclasses.dataclass
class GangCluster:
    cluster: localcluster.LocalCluster
    flavour: Flavour


@pytest.fixture(scope="module", params=list(CLUSTERS), ids=list(CLUSTERS))
def gang_cluster(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[GangCluster]:
    flavour = CLUSTERS[request.param]
    say = conftest._progress(pytestconfig)
    problem: str | None = None
    with localcluster.sigterm_as_interrupt():
        try:
            bin_dir = localcluster.ensure_binaries(version=flavour.version, progress=say)
            cluster = localcluster.LocalCluster(
                bin_dir, progress=say, feature_gates=flavour.feature_gates,
                runtime_config={flavour.api: "true"}, scheduler_config=_scheduler_config(flavour),
            ).start()  # fmt: skip
        except localcluster.HarnessError as exc:
            problem = str(exc)
        if problem is not None:
            pytest.fail(f"the local Kubernetes {flavour.version} control plane is not available: {problem}")
        try:
            assert cluster.server_version() == f"v{flavour.version}"
            cluster.apply([kube.priority_class(name, value=value) for name, value in facts.CLASSES.items()])
            cluster.apply(facts._nominator_rbac())
            yield GangCluster(cluster, flavour)
        finally:
            cluster.stop()


@dataclasses.dataclass
class GangLab:
    lab: facts.Lab
    flavour: Flavour

    def member(self, name: str, group: str | None, **kwargs: Any) -> None:
        pod = self.lab.pod(name, **kwargs)
        if group is not None:
            pod["spec"]["schedulingGroup"] = {"podGroupName": group}
        self.lab.create(pod)

    def pod_group(self, name: str, *, min_count: int) -> None:
        spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
        if self.flavour.api.endswith("v1beta1"):
            spec["priorityClassName"] = facts.MID  # 1.37 refuses members whose priority differs from the group's
        self.lab.create({"apiVersion": self.flavour.api, "kind": "PodGroup",
                         "metadata": {"name": name, "namespace": self.lab.namespace}, "spec": spec})  # fmt: skip

    def nodes_of(self, *names: str) -> dict[str, str | None]:
        pods = kube.pods(self.lab.cluster, self.lab.namespace)
        return {n: pods[n]["spec"].get("nodeName") for n in names}

    def stays_unbound(self, *names: str, seconds: float = HOLD_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            nodes = self.nodes_of(*names)
            assert not any(nodes.values()), f"bound while held: {nodes}\n{self.explain()}"
            time.sleep(0.25)

    def explain(self) -> str:
        cluster, namespace = self.lab.cluster, self.lab.namespace
        pods = {n: (kube.gates(p), p["spec"].get("nodeName"), (p.get("status") or {}).get("conditions"))
                for n, p in kube.pods(cluster, namespace).items()}
        evs = [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in kube.events(cluster, namespace)]
        return json.dumps({"pods": pods, "events": evs}, indent=1)


@pytest.fixture
def gang_lab(gang_cluster: GangCluster) -> Iterator[GangLab]:
    with facts.lab_in(gang_cluster.cluster) as lab:
        yield GangLab(lab, gang_cluster.flavour)


def wait_all_bound(gl: GangLab, *names: str) -> dict[str, str]:
    def bound() -> dict[str, str] | None:
        nodes = gl.nodes_of(*names)
        return {k: str(v) for k, v in nodes.items()} if all(nodes.values()) else None

    try:
        return kube.poll(f"{names} bound", bound, timeout_seconds=facts.BOUND_SECONDS)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{gl.explain()}") from None


@contextlib.contextmanager
def cordoned(gl: GangLab, node: str) -> Iterator[None]:
    gl.lab.cluster.kubectl("cordon", node)
    try:
        yield
    finally:
        gl.lab.cluster.kubectl("uncordon", node)


# --- a: a gated pod may name a PodGroup that does not exist yet --------------------------------------


def test_a_gated_pod_may_name_a_missing_pod_group_and_stays_gated(gang_lab: GangLab) -> None:
    gang_lab.lab.add_nodes(1)
    gang_lab.member("m0", "later", gpus=4, gated=True)
    pod = gang_lab.lab.get("m0")
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "later"}
    gang_lab.stays_unbound("m0", seconds=2)
    assert facts.held(gang_lab.lab.get("m0"))


def test_an_ungated_pod_naming_a_missing_pod_group_binds_only_once_it_exists(gang_lab: GangLab) -> None:
    gang_lab.lab.add_nodes(1)
    gang_lab.member("m0", "later", gpus=4)
    # Held by kube-scheduler's queue itself (incompletePodGroupPods), with the GangScheduling plugin or without:
    # no condition, no Event, nothing a user would see.
    gang_lab.stays_unbound("m0")
    assert not (gang_lab.lab.get("m0").get("status") or {}).get("conditions")
    gang_lab.pod_group("later", min_count=1)
    wait_all_bound(gang_lab, "m0")


# --- b: nominated and un-gated members of a gang PodGroup bind on their nominations -------------------


def test_a_gangs_nominated_members_bind_on_their_nominations(gang_lab: GangLab) -> None:
    lab = gang_lab.lab
    a, b = lab.add_nodes(2)
    gang_lab.member("m0", "g", gpus=8, gated=True, prefers=b)
    gang_lab.member("m1", "g", gpus=8, gated=True, prefers=a)
    gang_lab.pod_group("g", min_count=2)
    lab.nominate("m0", a)
    lab.nominate("m1", b)
    lab.ungate("m0")
    lab.ungate("m1")
    expected = {"m0": a, "m1": b} if gang_lab.flavour.honours_nomination else {"m0": b, "m1": a}
    assert wait_all_bound(gang_lab, "m0", "m1") == expected  # 1.36.3: each where it prefers, not nominated


# --- c, d: a nominated node cordoned before un-gating --------------------------------------------------


@pytest.mark.parametrize(
    "with_pod_group",
    [
        pytest.param(False, id="control-without-pod-group-part-runs"),
        pytest.param(True, id="gang-pod-group-binds-none-until-room-then-all"),
    ],
)
def test_a_gang_whose_nominated_node_is_cordoned_binds_all_or_nothing(gang_lab: GangLab, with_pod_group: bool) -> None:
    lab = gang_lab.lab
    a, b = lab.add_nodes(2)
    group = "g" if with_pod_group else None
    gang_lab.member("m0", group, gpus=8, gated=True)
    gang_lab.member("m1", group, gpus=8, gated=True)
    if with_pod_group:
        gang_lab.pod_group("g", min_count=2)
    lab.nominate("m0", a)
    lab.nominate("m1", b)
    with cordoned(gang_lab, b):
        lab.ungate("m0")
        lab.ungate("m1")
        if with_pod_group and gang_lab.flavour.gang_plugin:
            gang_lab.stays_unbound("m0", "m1")  # d: none bound while the gang has no room
        else:
            assert wait_all_bound(gang_lab, "m0") == {"m0": a}  # part-running: m1 has no room
            time.sleep(1)
            assert gang_lab.nodes_of("m1") == {"m1": None}
    nodes = wait_all_bound(gang_lab, "m0", "m1")  # d: room again, all bind
    if with_pod_group and gang_lab.flavour.gang_plugin:
        # Whole, one per node, but not always on the nominations: seen on 1.37.2 both ways (m0 on B, m1 on A once
        # in three runs); kube-scheduler clears a nomination after a failed attempt (KEP-5278).
        assert sorted(nodes.values()) == sorted([a, b]), nodes
    else:
        assert nodes == {"m0": a, "m1": b}


def test_a_gang_whose_nominated_node_is_cordoned_binds_whole_elsewhere(gang_lab: GangLab) -> None:
    lab = gang_lab.lab
    a, b, c = lab.add_nodes(3)
    gang_lab.member("m0", "g", gpus=8, gated=True)
    gang_lab.member("m1", "g", gpus=8, gated=True)
    gang_lab.pod_group("g", min_count=2)
    lab.nominate("m0", a)
    lab.nominate("m1", b)
    with cordoned(gang_lab, b):
        lab.ungate("m0")
        lab.ungate("m1")
        nodes = wait_all_bound(gang_lab, "m0", "m1")
    if gang_lab.flavour.honours_nomination:
        assert nodes["m1"] == c and nodes["m0"] == a, nodes
    else:  # 1.36.3: each member where it prefers (the nominations ignored), still whole and off the cordoned node
        assert sorted(nodes.values()) == sorted([a, c]), nodes
