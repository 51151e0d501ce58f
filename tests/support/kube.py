"""Builders for the Kubernetes objects tests create (plain dicts, exactly what goes over the wire), and
the few reads and waits the end-to-end tests share."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from common import gpu, settings, snapshot, snapshot_build
from descheduler import policy
from gpu_steward_lab import devicesim, localcluster


def requirement(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)} if values else {"key": key, "operator": operator}


def pod(
    name: str,
    *,
    namespace: str,
    gpus: int = 0,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gates: Sequence[str] = (),
    required_terms: Sequence[Mapping[str, Any]] | None = None,
    preferred_terms: Sequence[tuple[int, Mapping[str, Any]]] = (),
    priority_class: str | None = None,
    priority: int | None = None,
    preemption_policy: str | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A single-container pod; `required_terms`/`preferred_terms` are nodeSelectorTerms
    (`{"matchExpressions": [...], "matchFields": [...]}`), preferred ones with their weight."""
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {gpu.FULL_GPU: str(gpus)}
        resources["requests"][gpu.FULL_GPU] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/gpu-steward/e2e:1", "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    node_affinity: dict[str, Any] = {}
    if required_terms is not None:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [dict(term) for term in required_terms]
        }
    if preferred_terms:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": weight, "preference": dict(term)} for weight, term in preferred_terms
        ]
    if node_affinity:
        spec["affinity"] = {"nodeAffinity": node_affinity}
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if priority is not None:
        spec["priority"] = priority
    if preemption_policy is not None:
        spec["preemptionPolicy"] = preemption_policy
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def kubeconfig(server: str) -> dict[str, Any]:
    """A kubeconfig whose one context reaches `server` with a token nobody checks."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "test"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }  # fmt: skip


def priority_class(name: str, *, value: int, preemption_policy: str = "PreemptLowerPriority",
                   reclaim: tuple[int, int] | None = None) -> dict[str, Any]:
    """`reclaim` (idle window seconds, threshold percent): its idle pods may go to pending pods of its own
    priority (no toleration) after that window."""
    body: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": preemption_policy,
    }
    if reclaim:
        idle_seconds, threshold_percent = reclaim
        body["metadata"]["annotations"] = {policy.MIN_PRIORITY: str(value), policy.TOLERATION: "0",
                                           policy.IDLE_SECONDS[0]: str(idle_seconds),
                                           policy.THRESHOLD[0]: str(threshold_percent)}
    return body


def pod_disruption_budget(
    name: str, *, namespace: str, match_labels: Mapping[str, str], min_available: int
) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": dict(match_labels)}},
    }


# --- reading and waiting on a live cluster (end-to-end tests) ------------------------------------

T = TypeVar("T")
Cluster = localcluster.LocalCluster


def poll(
    what: str, check: Callable[[], T | None], *, timeout_seconds: float = 30, interval_seconds: float = 0.25
) -> T:
    """Call `check` until it returns something truthy and return that; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_seconds:.0f} s (last: {value!r})")
        time.sleep(interval_seconds)


def pods(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's pods by name, as stored."""
    listed = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    return {p["metadata"]["name"]: p for p in listed}


def events(cluster: Cluster, namespace: str, *, reason: str | None = None) -> list[dict[str, Any]]:
    """Events of the namespace as `kubectl get events` lists them (optionally of one reason)."""
    selector = ["--field-selector", f"reason={reason}"] if reason else []
    listed: list[dict[str, Any]] = cluster.kubectl_json("get", "events", "-n", namespace, *selector)["items"]
    return listed


def events_about(cluster: Cluster, namespace: str, pod_name: str, *, reason: str) -> list[dict[str, Any]]:
    return [e for e in events(cluster, namespace, reason=reason) if e["involvedObject"].get("name") == pod_name]


def scheduled_reason(pod: Mapping[str, Any]) -> str | None:
    """`PodScheduled` as one word: "True", or the reason it is False (Unschedulable, SchedulingGated)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return "True" if condition.get("status") == "True" else condition.get("reason")
    return None


def preferred_nodes(pod: Mapping[str, Any]) -> list[tuple[int, list[str]]]:
    """(weight, node names) of each preferred node-affinity term naming nodes (`matchFields metadata.name In`)."""
    node_affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    out = []
    for term in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        for field in term["preference"].get("matchFields") or []:
            if field["key"] == "metadata.name" and field["operator"] == "In":
                out.append((int(term["weight"]), list(field["values"])))
    return out


def scheduler_verdicts(
    cluster: Cluster, bodies: Sequence[Mapping[str, Any]], *, timeout_seconds: float = 30
) -> dict[str, str | None]:
    """kube-scheduler's own verdict on pods nobody else decides for: each is created (in order, one namespace),
    its outcome awaited, then all are deleted. Pod name -> the node the scheduler bound it to, "" when it
    reported the pod Unschedulable, None when the API server refused the pod."""
    if not bodies:
        return {}
    namespace = bodies[0]["metadata"]["namespace"]
    verdicts: dict[str, str | None] = {}
    created = []
    for body in bodies:
        name = body["metadata"]["name"]
        done = cluster.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
        verdicts[name] = None
        if done.returncode == 0:
            created.append(name)

    def decided() -> dict[str, str] | None:
        found = {p["metadata"]["name"]: p for p in cluster.kubectl_json("get", "pods", "-n", namespace)["items"]}
        out = {}
        for name in created:
            pod = found.get(name) or {"spec": {}}
            if pod["spec"].get("nodeName"):
                out[name] = str(pod["spec"]["nodeName"])
            elif scheduled_reason(pod) == "Unschedulable":
                out[name] = ""
        return out if len(out) == len(created) else None

    try:
        if created:
            verdicts.update(poll(f"scheduler decisions for {', '.join(created)}", decided,
                                 timeout_seconds=timeout_seconds))
    finally:
        if created:
            cluster.kubectl("delete", "pod", *created, "-n", namespace, "--grace-period=0", "--wait=true",
                            check=False)
    return verdicts


def required_node_terms(pod: Mapping[str, Any]) -> list[Any]:
    """The pod's required node-affinity terms (a pin is one): preferred terms are no constraint."""
    affinity = pod["spec"].get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def gates(pod: Mapping[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def cluster_state(cluster: Cluster) -> dict[str, Any]:
    """`kubectl get nodes,pods,priorityclasses,namespaces -A -o json`: what the snapshot is built from."""
    state: dict[str, Any] = cluster.kubectl_json("get", "nodes,pods,priorityclasses,namespaces", "-A")
    return state


@dataclasses.dataclass(frozen=True)
class GpuView:
    """The cluster as stored, with the GPU indices the device-plugin stand-in gives each bound pod
    (`devicesim.Assignments`: the one policy every compared arm is measured with)."""

    state: snapshot.Snapshot
    assignments: devicesim.Assignments

    @classmethod
    def of(cls, cluster: Cluster, *, names: settings.Names) -> GpuView:
        state = snapshot_build.from_list(cluster_state(cluster), names=names, taken_at=None)
        assignments = devicesim.Assignments()
        assignments.update(state)
        return cls(state, assignments)

    def indices(self, pod: snapshot.Pod) -> tuple[int, ...]:
        return self.assignments.by_node.get(pod.node_name or "", {}).get(pod.key, ())

    def domains_spanned(self, pod: snapshot.Pod) -> int:
        """NVLink domains the pod's GPUs span (0: not bound)."""
        node = self.state.nodes.get(pod.node_name or "")
        held = set(self.indices(pod))
        return sum(1 for domain in node.topology.domains if held & set(domain)) if node else 0


def wait_gpus_free(cluster: Cluster, *, timeout_seconds: float = 60) -> None:
    """Wait until no pod anywhere holds or waits for GPUs: earlier tests' namespaces are deleted without
    waiting, and a test that measures placement or capacity needs the GPU nodes to itself."""

    def leftovers() -> list[str]:
        listed = cluster.kubectl_json("get", "pods", "-A")["items"]
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in listed if gpu.pod_request(p).any]

    poll("GPU pods of earlier tests gone", lambda: not leftovers() or None, timeout_seconds=timeout_seconds)
