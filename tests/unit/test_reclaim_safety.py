"""Reclaim never evicts the wrong pod: adversarial tables on the pure planner, each asserting the decision
and its reason (issue 14). The multi-cycle invariant is in test_reclaim_cycles.py."""

from __future__ import annotations

from typing import Any

import pytest

from common import settings, settings_loader, snapshot_build
from descheduler import protections, reclaim, unschedulable
from tests import builders
from tests.unit.test_reclaim_planner import ONE, TWO, Raw, busy, gang, idle, pending, reason_of, run, running

DEMAND = "team-b/want"
DRA_SHORT = unschedulable.DRA_SHORT


def waiting(message: str | None = None, *, nominated: str | None = None, scheduler: str | None = None,
            gpus: int = 1, limits: dict[str, str] | None = None, claims: list[Raw] | None = None) -> Raw:
    """A pending pod as kube-scheduler left it: Unschedulable with its message; `limits` beside its GPUs,
    `claims` its `spec.resourceClaims`."""
    pod = pending("want", gpus=gpus)
    pod["spec"]["containers"][0]["resources"]["limits"].update(limits or {})
    if claims:
        pod["spec"]["resourceClaims"] = claims
    condition = pod["status"]["conditions"][0]
    if message is not None:
        condition["message"] = message
    if nominated:
        pod["status"]["nominatedNodeName"] = nominated
    if scheduler:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def outcome(plan: reclaim.Plan, demand: str = DEMAND) -> str:
    return {o.demand: o.reason for o in plan.demands}[demand]


CPU_AND_MEMORY = ("0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 Insufficient nvidia.com/gpu. "
                  "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")


@pytest.mark.parametrize(
    ("pending_pod", "evicted", "reason"),
    [
        pytest.param(waiting(CPU_AND_MEMORY), set(), "kube-scheduler reports more than a GPU shortage "
                     "(1 Insufficient cpu, 1 Insufficient memory): freeing GPUs would not let it run",
                     id="issue-short-of-cpu-and-memory-too"),
        pytest.param(waiting("0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."), set(),
                     "(1 Insufficient cpu, 1 Insufficient memory)", id="short-of-cpu-and-memory-only"),
        pytest.param(waiting("0/1 nodes are available: 1 Insufficient example.com/fpga, "
                             "1 Insufficient nvidia.com/gpu."), set(), "(1 Insufficient example.com/fpga)",
                     id="short-of-another-extended-resource"),
        pytest.param(waiting("0/1 nodes are available: 1 Too many pods."), set(), "(1 Too many pods)",
                     id="node-pod-count-full"),
        pytest.param(waiting("0/1 nodes are available: 1 node(s) didn't match pod affinity rules."), set(),
                     "(1 node(s) didn't match pod affinity rules)", id="pod-affinity"),
        # Anti-affinity, the pod's own or existing pods', is a node filter reclaim's search repeats: our model decides.
        pytest.param(waiting("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match pod "
                             "anti-affinity rules."), {("team-a/idle", DEMAND)}, "1 idle pod(s) evicted on n1",
                     id="own-anti-affinity-elsewhere-our-model-decides"),
        pytest.param(waiting("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't satisfy "
                             "existing pods anti-affinity rules."), {("team-a/idle", DEMAND)},
                     "1 idle pod(s) evicted on n1", id="existing-anti-affinity-elsewhere-our-model-decides"),
        pytest.param(waiting("0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."), set(),
                     "kube-scheduler reports no GPU shortage: freeing GPUs would not let it run",
                     id="boundary-anti-affinity-alone-is-no-gpu-shortage"),
        pytest.param(waiting('0/1 nodes are available: persistentvolumeclaim "data" not found. preemption: '
                             "0/1 nodes are available: 1 Preemption is not helpful for scheduling."), set(),
                     '(persistentvolumeclaim "data" not found)', id="prefilter-rejection"),
        pytest.param(waiting("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."), set(),
                     "kube-scheduler reports no GPU shortage: freeing GPUs would not let it run",
                     id="no-gpu-shortage-named"),
        pytest.param(waiting("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's "
                             "node affinity/selector, 1 node(s) had untolerated taint(s). preemption: 0/3 nodes are "
                             "available: 1 No preemption victims found for incoming pod, 2 Preemption is not "
                             "helpful for scheduling."), {("team-a/idle", DEMAND)}, "1 idle pod(s) evicted on n1",
                     id="gpu-short-beside-tainted-and-cpu-only-nodes"),
        pytest.param(waiting("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."), {("team-a/idle", DEMAND)},
                     "1 idle pod(s) evicted on n1", id="gpu-short-only"),
        pytest.param(waiting(None), {("team-a/idle", DEMAND)}, "1 idle pod(s) evicted on n1",
                     id="no-message-our-own-fit-check-decides"),
        pytest.param(waiting("cpu: not enough", scheduler="volcano"), {("team-a/idle", DEMAND)},
                     "1 idle pod(s) evicted on n1", id="another-schedulers-message-says-nothing"),
        # DRA GPU nodes: DynamicResources says only "cannot allocate all claims" (v1.37.2, v1.36.3).
        pytest.param(waiting(f"0/2 nodes are available: 2 {DRA_SHORT}."), {("team-a/idle", DEMAND)},
                     "1 idle pod(s) evicted on n1", id="dra-nodes-short-of-gpus-for-an-extended-resource-pod"),
        pytest.param(waiting(f"0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 {DRA_SHORT}. preemption: "
                             "0/3 nodes are available: 3 No preemption victims found for incoming pod."),
                     {("team-a/idle", DEMAND)}, "1 idle pod(s) evicted on n1",
                     id="dra-and-device-plugin-nodes-both-short-of-gpus"),
        pytest.param(waiting(f"0/2 nodes are available: 2 {DRA_SHORT}.", limits={"example.com/nic": "1"}), set(),
                     f"(2 {DRA_SHORT})", id="adversarial-another-extended-resource-may-be-the-claim-that-fails"),
        # MIG slices are GPUs too (DRA MIG devices serve them): the capacity model decides, n1 has no such slice.
        pytest.param(waiting(f"0/2 nodes are available: 2 {DRA_SHORT}.", limits={"nvidia.com/mig-1g.10gb": "1"}),
                     set(), "n1: requests more than the node has: nvidia.com/mig-1g.10gb 1 > 0",
                     id="boundary-a-mig-slice-beside-is-a-gpu-shortage-the-model-decides"),
        pytest.param(waiting(f"0/2 nodes are available: 1 Insufficient cpu, 1 {DRA_SHORT}."), set(),
                     "(1 Insufficient cpu)", id="dra-short-beside-a-cpu-shortage"),
        pytest.param(waiting(f"0/2 nodes are available: 2 {DRA_SHORT}.",
                             claims=[{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]), set(),
                     "spec.resourceClaims (not modelled)", id="claims-of-its-own-are-not-modelled-here"),
        pytest.param(waiting("0/2 nodes are available: 2 resourceclaim not available on the node."), set(),
                     "(2 resourceclaim not available on the node)", id="another-dra-reason-is-no-gpu-shortage"),
        pytest.param(waiting("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.", nominated="n1"), set(),
                     "nominated to n1 (status.nominatedNodeName): kube-scheduler tries that node first",
                     id="scheduler-already-preempted-for-it"),
    ],
)
def test_a_demand_counts_only_if_freeing_gpus_lets_it_run(
    pending_pod: Raw, evicted: set[tuple[str, str]], reason: str
) -> None:
    plan = run(ONE, [running("idle", node="n1"), pending_pod], idle("team-a/idle"))
    assert {(e.pod, e.preemptor) for e in plan.evictions} == evicted
    assert reason in outcome(plan)


@pytest.mark.parametrize(
    ("message", "gpu_short", "other"),
    [
        pytest.param("0/2 nodes are available: 2 Insufficient nvidia.com/mig-1g.10gb.",
                     ("2 Insufficient nvidia.com/mig-1g.10gb",), (), id="mig-profile"),
        pytest.param("0/2 nodes are available: 1 node(s) had taints that the pod didn't tolerate, 1 Insufficient "
                     "nvidia.com/gpu.", ("1 Insufficient nvidia.com/gpu",), (), id="older-taint-wording"),
        pytest.param("0/5 nodes are available: 2 Insufficient nvidia.com/gpu, 3 node(s) had volume node affinity "
                     "conflict.", ("2 Insufficient nvidia.com/gpu",),
                     ("3 node(s) had volume node affinity conflict",), id="volumes"),
        pytest.param("pod has unbound immediate PersistentVolumeClaims", None, None, id="not-the-format"),
        pytest.param(f"0/2 nodes are available: 2 {DRA_SHORT}.", (), (f"2 {DRA_SHORT}",),
                     id="dra-short-is-another-reason-unless-the-claims-are-gpus"),
    ],
)
def test_scheduler_message_reading(message: str, gpu_short: tuple[str, ...] | None,
                                   other: tuple[str, ...] | None) -> None:
    reading = unschedulable.read(message, claims_are_gpus=False)
    assert (reading.gpu_short, reading.other) == (gpu_short, other) if reading else gpu_short is None


def test_dra_short_is_a_gpu_shortage_when_the_claims_are_gpus() -> None:
    message = f"0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 {DRA_SHORT}, 1 Insufficient cpu."
    assert unschedulable.read(message, claims_are_gpus=True) == unschedulable.Reading(
        ("1 Insufficient nvidia.com/gpu", f"2 {DRA_SHORT}"), ("1 Insufficient cpu",))


# --- Pods already leaving free their GPUs: one pending pod, one reclaim decision ------------------------


def terminating(name: str, *, node: str) -> Raw:
    return running(name, node=node, deleting=True)


@pytest.mark.parametrize(
    ("pods", "leaving", "evicted", "about", "reason"),
    [
        pytest.param(
            [terminating("victim", node="n1"), running("other", node="n2"), pending("want")], None, set(),
            DEMAND, "fits on n1 once the pods already leaving there are gone: team-a/victim (terminating); "
            "no new eviction", id="issue-victim-still-terminating-is-not-holding",
        ),
        pytest.param(
            [running("victim", node="n1"), running("other", node="n2"), pending("want")], {"team-a/victim": DEMAND},
            set(), DEMAND, "team-a/victim (evicted for team-b/want); no new eviction",
            id="evicted-last-cycle-not-terminating-yet",
        ),
        pytest.param(
            [running("victim", node="n1"), running("other", node="n2"), pending("want")], {"team-a/victim": DEMAND},
            set(), "team-a/victim", "already leaving: evicted for team-b/want", id="never-a-victim-twice",
        ),
        pytest.param(
            [running("victim", node="n1", deleting=True), running("other", node="n2"), pending("want"),
             pending("urgent", priority=50_000)], {"team-a/victim": DEMAND},
            {("team-a/other", "team-b/urgent")}, DEMAND, "team-a/victim (evicted for team-b/want)",
            id="its-gpus-stay-with-the-demand-it-was-evicted-for",
        ),
        pytest.param(
            [running("victim", node="n1", deleting=True), running("other", node="n2"), pending("want")],
            {"team-a/victim": "team-b/bound-meanwhile"}, set(), DEMAND,
            "team-a/victim (evicted for team-b/bound-meanwhile)", id="a-gone-demands-gpus-are-anyones",
        ),
    ],
)
def test_pods_already_leaving_count_as_freeing(
    pods: list[Raw], leaving: dict[str, str | None] | None, evicted: set[tuple[str, str]], about: str, reason: str
) -> None:
    plan = run(TWO, pods, idle("team-a/victim", "team-a/other"), leaving=leaving)
    assert {(e.pod, e.preemptor) for e in plan.evictions} == evicted
    said = outcome(plan, about) if about.startswith("team-b/") else reason_of(plan, about)
    assert reason in said


# --- Operators' conventions -----------------------------------------------------------------------------

SHM = {"name": "shm", "emptyDir": {"medium": "Memory"}}
SCRATCH = {"name": "scratch", "emptyDir": {}}
HOST = {"name": "models", "hostPath": {"path": "/models"}}
SAFE = "cluster-autoscaler.kubernetes.io/safe-to-evict"


def conventions(**values: bool) -> dict[str, Any]:
    return {"descheduler": {"reclaim": {"conventions": values}}}


@pytest.mark.parametrize(
    ("pod", "overrides", "reason"),
    [
        pytest.param(running("idle", node="n1", owner=None), {},
                     "no owner (a bare pod): eviction would delete it for good (conventions.evict_bare_pods)",
                     id="bare-pod"),
        pytest.param(running("idle", node="n1", owner=None), conventions(evict_bare_pods=True), None,
                     id="bare-pod-allowed"),
        pytest.param(running("idle", node="n1", owner=None,
                             annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}), {}, None,
                     id="bare-pod-says-safe-to-evict"),
        pytest.param(running("idle", node="n1", owner=None, annotations={"descheduler.alpha.kubernetes.io/evict": ""}),
                     {}, None, id="bare-pod-with-the-descheduler-evict-annotation"),
        pytest.param(running("idle", node="n1", volumes=[SHM, SCRATCH]), {},
                     "local storage (emptyDir volume scratch) would be lost (conventions.evict_local_storage_pods)",
                     id="emptydir-on-disk"),
        pytest.param(running("idle", node="n1", volumes=[HOST]), {}, "local storage (hostPath volume models)",
                     id="hostpath"),
        pytest.param(running("idle", node="n1", volumes=[SHM]), {}, None, id="dev-shm-in-memory-is-not-storage"),
        pytest.param(running("idle", node="n1", volumes=[SHM]), conventions(memory_emptydir_is_local_storage=True),
                     "local storage (emptyDir volume shm)", id="dev-shm-counted-as-the-descheduler-does"),
        pytest.param(running("idle", node="n1", volumes=[SCRATCH]), conventions(evict_local_storage_pods=True), None,
                     id="local-storage-allowed"),
        pytest.param(running("idle", node="n1", volumes=[SCRATCH],
                             annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}), {}, None,
                     id="local-storage-pod-says-safe-to-evict"),
        pytest.param(running("idle", node="n1", annotations={SAFE: "false"}),
                     {}, 'cluster-autoscaler.kubernetes.io/safe-to-evict: "false"', id="safe-to-evict-false"),
        pytest.param(running("idle", node="n1", annotations={SAFE: "False", protections.EVICT: ""}),
                     {}, 'safe-to-evict: "false"', id="safe-to-evict-false-beats-the-evict-annotation"),
        pytest.param(running("idle", node="n1", annotations={SAFE: "false"}),
                     conventions(honour_safe_to_evict=False), None, id="safe-to-evict-not-honoured"),
        pytest.param(running("idle", node="n1", annotations={"karpenter.sh/do-not-disrupt": "true"}), {},
                     'karpenter.sh/do-not-disrupt: "true"', id="karpenter-do-not-disrupt"),
        pytest.param(running("idle", node="n1", annotations={"karpenter.sh/do-not-disrupt": "false"}), {}, None,
                     id="karpenter-do-not-disrupt-false"),
        pytest.param(running("idle", node="n1", annotations={"karpenter.sh/do-not-disrupt": "true"}),
                     conventions(honour_do_not_disrupt=False), None, id="karpenter-not-honoured"),
    ],
)
def test_eviction_conventions(pod: Raw, overrides: dict[str, Any], reason: str | None) -> None:
    plan = run(ONE, [pod, pending("want")], idle("team-a/idle"), overrides=overrides)
    if reason is None:
        assert {(e.pod, e.preemptor) for e in plan.evictions} == {("team-a/idle", DEMAND)}
    else:
        assert plan.evictions == ()
        assert reason in reason_of(plan, "team-a/idle")


def test_conventions_are_settings_with_safe_defaults() -> None:
    found = settings_loader.load().descheduler.reclaim.conventions
    assert found == settings.Conventions(evict_bare_pods=False, evict_local_storage_pods=False,
                                         memory_emptydir_is_local_storage=False, honour_safe_to_evict=True,
                                         honour_do_not_disrupt=True)


# --- Gangs: native PodGroups and limits -----------------------------------------------------------------


def member(name: str, *, node: str, group: str = "pg") -> Raw:
    pod = running(name, node=node)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


@pytest.mark.parametrize(
    ("modes", "assessments", "evicted", "reason"),
    [
        pytest.param({"team-a/pg": "all"}, {**idle("team-a/p-0"), **busy("team-a/p-1")}, set(),
                     "gang team-a/pg is reclaimed only as a whole: team-a/p-1 is not reclaimable (not idle",
                     id="disruption-mode-all-one-busy-member-keeps-all"),
        pytest.param({"team-a/pg": "all"}, idle("team-a/p-0", "team-a/p-1"), {"team-a/p-0", "team-a/p-1"},
                     "with its gang team-a/pg", id="disruption-mode-all-evicted-whole"),
        pytest.param({}, {**idle("team-a/p-0"), **busy("team-a/p-1")}, set(),
                     "is reclaimed only as a whole", id="podgroup-not-known-yet-is-never-split"),
        pytest.param({"team-a/pg": "single"}, {**idle("team-a/p-0"), **busy("team-a/p-1")}, {"team-a/p-0"},
                     "reclaimed for team-b/want", id="disruption-mode-single-pods-go-alone"),
    ],
)
def test_native_podgroup_disruption_mode(
    modes: dict[str, str], assessments: dict[str, Any], evicted: set[str], reason: str
) -> None:
    pods = [member("p-0", node="n1"), member("p-1", node="n2"), pending("want")]
    plan = run(TWO, pods, assessments, pod_groups=modes)
    assert {e.pod for e in plan.evictions} == evicted
    assert reason in reason_of(plan, "team-a/p-0")


def podgroup(name: str = "pg", *, disruption: str | None, gang: bool = False) -> Raw:
    """A native scheduling.k8s.io/v1beta1 PodGroup (field names as in k8s.io/api v0.37.2)."""
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": 2}} if gang else {"basic": {}}}
    if disruption:
        spec["disruptionMode"] = {disruption: {}}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "team-a"}, "spec": spec}


@pytest.mark.parametrize(
    ("group", "evicted", "reason"),
    [
        pytest.param(podgroup(disruption="all"), set(), "gang team-a/pg is reclaimed only as a whole",
                     id="basic-policy-disruption-all-is-one-unit"),
        pytest.param(podgroup(disruption=None), {"team-a/p-0"}, "reclaimed for team-b/want",
                     id="basic-policy-unset-mode-is-single-as-the-api-defaults"),
        pytest.param(podgroup(disruption="single", gang=True), {"team-a/p-0"}, "reclaimed for team-b/want",
                     id="gang-policy-disruption-single-pods-go-alone"),
        pytest.param(podgroup(disruption=None, gang=True), set(), "is reclaimed only as a whole",
                     id="gang-policy-unset-mode-stays-whole"),
    ],
)
def test_podgroup_disruption_mode_read_from_the_snapshot(group: Raw, evicted: set[str], reason: str) -> None:
    pods = [member("p-0", node="n1"), member("p-1", node="n2"), pending("want")]
    plan = run(TWO, pods, {**idle("team-a/p-0"), **busy("team-a/p-1")}, groups=[group])
    assert {e.pod for e in plan.evictions} == evicted
    assert reason in reason_of(plan, "team-a/p-0")


def gang_of_four(size: int = 4) -> list[Raw]:
    labels = {**gang("big"), "gpu-steward.io/gang-size": str(size)}
    return [running(f"big-{i}", node="n1", labels=labels) for i in range(size)]


@pytest.mark.parametrize(
    ("limits", "evicted", "reason"),
    [
        pytest.param({}, 4, "4 idle pod(s) evicted on n1", id="issue-default-per-node-2-gang-of-4-is-one-decision"),
        pytest.param({"per_node": 0}, 0, "per-node limit of 0 eviction decisions reached on n1",
                     id="a-limit-spares-the-gang"),
        pytest.param({"per_cycle": 1}, 4, "4 idle pod(s) evicted on n1", id="per-cycle-1-still-one-gang"),
    ],
)
def test_limits_treat_a_gang_as_one_decision(limits: dict[str, int], evicted: int, reason: str) -> None:
    nodes = [builders.gpu_node("n1", gpus=4)]
    plan = run(nodes, [*gang_of_four(), pending("want", gpus=4)], idle(*(f"team-a/big-{i}" for i in range(4))),
               overrides={"descheduler": {"reclaim": {"limits": limits}}})
    assert len(plan.evictions) == evicted
    assert reason in outcome(plan)
    if not evicted:
        assert f"({reason}; spares the whole gang team-a/big)" in outcome(plan)
        assert reason_of(plan, "team-a/big-0") == f"idle but spared: {reason}; spares the whole gang team-a/big"


def test_nominated_and_message_demands_are_recorded_not_dropped() -> None:
    config = settings_loader.load()
    cluster = snapshot_build.build(nodes=ONE, pods=[waiting(CPU_AND_MEMORY)], names=config.names, taken_at=0)
    [demand] = reclaim.demands_from_snapshot(cluster)
    assert demand.ignored and demand.ignored.startswith("kube-scheduler reports more than a GPU shortage")


# --- The one capacity model: freeing GPUs must let the pod run on that node ------------------------------


def cpu(pod: Raw, cores: str) -> Raw:
    pod["spec"]["containers"][0].setdefault("resources", {}).setdefault("requests", {})["cpu"] = cores
    return pod


def hog(name: str, *, node: str, cores: str) -> Raw:
    """A busy pod without GPUs holding CPU on the node."""
    return cpu(builders.pod(name, namespace="team-c", node=node, phase="Running"), cores)


@pytest.mark.parametrize(
    ("nodes", "pods", "evicted", "reason"),
    [
        pytest.param(ONE, [cpu(running("idle", node="n1"), "4"), hog("hog", node="n1", cores="58"),
                           cpu(pending("want"), "8")],
                     set(), "n1: Insufficient cpu even after evicting every eligible idle pod",
                     id="short-of-cpu-on-the-node-evicts-nothing"),
        pytest.param(ONE, [cpu(running("idle", node="n1"), "10"), hog("hog", node="n1", cores="50"),
                           cpu(pending("want"), "8")], {("team-a/idle", DEMAND)}, "1 idle pod(s) evicted on n1",
                     id="the-victim-frees-the-cpu-too"),
        pytest.param(TWO, [cpu(running("cheap", node="n1", priority=10), "4"), hog("hog", node="n1", cores="58"),
                           cpu(running("dear", node="n2", priority=900), "4"), cpu(pending("want"), "8")],
                     {("team-a/dear", DEMAND)}, "1 idle pod(s) evicted on n2", id="goes-where-the-cpu-is"),
    ],
)
def test_cpu_memory_and_the_rest_are_checked_on_the_candidate_node(
    nodes: list[Raw], pods: list[Raw], evicted: set[tuple[str, str]], reason: str
) -> None:
    plan = run(nodes, pods, idle("team-a/idle", "team-a/cheap", "team-a/dear"))
    assert {(e.pod, e.preemptor) for e in plan.evictions} == evicted
    assert reason in outcome(plan)
