"""Release churn: do released pods bind where release nominated them, and does anything strand or get deleted?

    python benchmarks/release_churn.py [--nodes N] [--pods N] [--rates 2,3] [--seed S]
        [--arms gpu-steward,default] [--churn-period SECONDS] [--drain SECONDS] [--quick] [--out FILE]

Each (arrival rate, arm) runs on a fresh local control plane (Kubernetes 1.37.2 built by
`scripts/setup test`: kube-apiserver, etcd, kube-scheduler, kube-controller-manager via kwokctl; kwok plays the
kubelets), with the harness of benchmarks/placement_trace.py: the device stand-in `gpu_steward_lab.devicesim` assigns
GPU indices and serves them as DCGM series to a real Prometheus (2 s scrapes), and in the `gpu-steward` arm our
webhook and descheduler (gang release, which nominates each placed pod and then un-gates it, and its observation
pass; reclaim off) run as processes, the descheduler's /metrics served. The `default` arm is kube-scheduler alone:
no gate, no nomination — what it shows is what release costs or gains (arrivals not placed by the end, waits, gangs
part-running).

Cluster: `--nodes` nodes of 8 GPUs in two NVLink domains of 4 (20, 160 GPUs). Workloads, drawn from `--seed`
(the same sequence at every rate and in every arm), until `--pods` pods (800) have arrived:

| kind              | share | pods        | GPUs a pod | gated in our arm |
|-------------------|-------|-------------|------------|------------------|
| bare              | 20 %  | 1 bare pod  | 2, 4 or 8  | yes              |
| replicaset        | 18 %  | 1 replica   | 2 or 4     | yes              |
| hostport-gated    | 8 %   | 1 bare pod, hostPort 8080 | 2 | yes          |
| gang              | 12 %  | 2 bare members (`gpu-steward.io/gang-name`/`gang-size`) | 4 | yes (as a gang) |
| one-gpu           | 22 %  | 1 bare pod  | 1          | no (under release_min_gpus) |
| hostport-one-gpu  | 8 %   | 1 bare pod, hostPort 8080 | 1 | no             |
| prefer            | 12 %  | 1 bare pod labelled `gpu-steward.io/placement: prefer` | 2 or 4 | no |

The never-gated pods (1-GPU, `prefer`) race the released ones for their nominated nodes, the hostPort pods take
ports a released pod may need. Arrivals: one pod every 1/rate s in sequence (a gang's members together, a
ReplicaSet counts its one pod). Each workload runs an exponential lifetime (mean chosen so that 2 pods/s offers
~90 % of the GPUs; at least `MIN_LIFETIME_SECONDS`) counted from when it is first bound whole, then the benchmark
deletes it (a ReplicaSet with its pods, a gang with all its members); a workload never bound stays to the end.
Mid-run, node churn repeats every `--churn-period` s: a node is cordoned, another deleted, the first uncordoned, the
deleted one created again. A workload with a pod on a deleted node ends with it (a ReplicaSet's pod is replaced).
The run ends `--drain` s after the last arrival.

Measured per (rate, arm), from the API server's watch (every snapshot of the cluster):
* arrivals and the offered load (GPU-seconds of the lifetimes / (GPUs x the arrival span));
* pods bound on their planned node: of the pods our release nominated (`planned=` in their release record), the
  share whose first binding was on that node;
* pods deleted or re-created by gpu-steward (must be 0): pods that vanished while the benchmark had neither ended
  their workload nor deleted them (or their node), by key;
* stuck pods: pods released by us (our release record), not bound, and reported Unschedulable by kube-scheduler;
  per 1,000 arrivals; how each ended — `bound` (the scheduler took it after all), `ended` (the benchmark deleted its
  workload), `vanished` (someone else deleted it) — the time from stuck to bound, p50 / p99 / max; still stuck at
  the end; each with the node planned, kube-scheduler's message when it first said Unschedulable and the node it
  bound to (JSON). Without a pin such a pod may bind on any node: it waits for room like any pending pod;
* the observation pass's outcomes by cause, from the descheduler's `gpu_steward_release_outcomes_total{cause}`;
* gangs: how many were part-running (at least one member bound while another is not) for more than
  `PART_RUNNING_SECONDS`, and the longest part-running time (excluding the gang's own deletion);
* pods bound, arrivals not placed by the end (an arrival whose pod, or any replacement of it, was never bound before
  the drain ended; those whose workload ended with a deleted node are counted apart), and create-to-bound waits
  p50 / p99 for the gated kinds and the never-gated kinds apart (of the arrivals that were bound).
Prints a table and writes JSON (--out). Seeded and reproducible in its workload sequence and node churn; the
timings are a real control plane's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Literal

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from kubernetes_asyncio import client  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks import placement_trace as pt  # noqa: E402
from common import feeder, gpu, kube, settings, snapshot  # noqa: E402
from descheduler.release import outcomes as release_outcomes  # noqa: E402
from gpu_steward_lab import demo, devicesim, localcluster, localprometheus, localsteward  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "release_churn.json"
ARMS = ("gpu-steward", "default")
NAMESPACE = "churn"
LEASE_NAMESPACE = "gpu-steward"
NAMES = settings.Names()
WORKLOAD_LABEL = "churn.gpu-steward.io/workload"
GPUS_PER_NODE, DOMAINS_PER_NODE = 8, 2
HOST_PORT = 8080
DRAIN_SECONDS = 40.0
PART_RUNNING_SECONDS = 5.0
MIN_LIFETIME_SECONDS = 3.0
REFERENCE_RATE, REFERENCE_LOAD = 2.0, 0.9  # the mean lifetime makes this rate offer this share of the GPUs
SCRAPE_SECONDS = 2
REAP_SECONDS = 0.25
OUTCOMES = "gpu_steward_release_outcomes"

Kind = Literal["bare", "replicaset", "hostport-gated", "gang", "one-gpu", "hostport-one-gpu", "prefer"]


@dataclasses.dataclass(frozen=True)
class Shape:
    share: float
    pods: int
    gpus: tuple[int, ...]  # drawn uniformly
    gated: bool  # our webhook gates it (strict placement, at least release_min_gpus GPUs, or a gang)
    host_port: bool = False
    prefer: bool = False


MIX: Mapping[Kind, Shape] = {
    "bare": Shape(0.20, 1, (2, 4, 8), gated=True),
    "replicaset": Shape(0.18, 1, (2, 4), gated=True),
    "hostport-gated": Shape(0.08, 1, (2,), gated=True, host_port=True),
    "gang": Shape(0.12, 2, (4,), gated=True),
    "one-gpu": Shape(0.22, 1, (1,), gated=False),
    "hostport-one-gpu": Shape(0.08, 1, (1,), gated=False, host_port=True),
    "prefer": Shape(0.12, 1, (2, 4), gated=False, prefer=True),
}


# --- the workload sequence and the node churn (pure) ------------------------------------------------


def mean_gpus_per_pod(mix: Mapping[Kind, Shape] = MIX) -> float:
    pods = sum(s.share * s.pods for s in mix.values())
    return sum(s.share * s.pods * sum(s.gpus) / len(s.gpus) for s in mix.values()) / pods


def mean_lifetime(total_gpus: int, mix: Mapping[Kind, Shape] = MIX) -> float:
    """Seconds a workload runs on average so that REFERENCE_RATE pods/s offer REFERENCE_LOAD of the GPUs."""
    return REFERENCE_LOAD * total_gpus / (REFERENCE_RATE * mean_gpus_per_pod(mix))


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    kind: Kind
    gpus: int  # per pod
    pods: int
    first_pod: int  # arrival index of its first pod
    lifetime: float  # seconds from its first binding

    @property
    def shape(self) -> Shape:
        return MIX[self.kind]

    def arrival(self, rate: float) -> float:
        return self.first_pod / rate

    def member_names(self) -> tuple[str, ...]:
        """Its pods' names (a ReplicaSet's pods are named by it: the workload stands for its one replica)."""
        if self.kind == "replicaset":
            return (self.name,)
        return tuple(f"{self.name}-{i}" for i in range(self.pods)) if self.pods > 1 else (self.name,)


def workloads(*, pods: int, seed: int, total_gpus: int, mix: Mapping[Kind, Shape] = MIX) -> tuple[Workload, ...]:
    """Workloads drawn from `seed` until `pods` pods have arrived (the last one may carry more)."""
    rng = random.Random(seed)
    kinds = list(mix)
    weights = [mix[k].share for k in kinds]
    mean = mean_lifetime(total_gpus, mix)
    out: list[Workload] = []
    index = 0
    while index < pods:
        kind = rng.choices(kinds, weights)[0]
        shape = mix[kind]
        gpus = rng.choice(shape.gpus)
        lifetime = max(MIN_LIFETIME_SECONDS, rng.expovariate(1 / mean))
        out.append(Workload(f"w{len(out):04d}-{kind}", kind, gpus, shape.pods, index, lifetime))
        index += shape.pods
    return tuple(out)


def offered_load(items: Sequence[Workload], *, rate: float, total_gpus: int) -> float:
    """GPU-seconds the lifetimes ask for over the GPU-seconds the arrival span holds."""
    if not items:
        return 0.0
    span = max(1.0, (items[-1].first_pod + items[-1].pods) / rate)
    return sum(w.gpus * w.pods * w.lifetime for w in items) / (total_gpus * span)


@dataclasses.dataclass(frozen=True, order=True)
class NodeEvent:
    at: float
    action: Literal["cordon", "delete", "uncordon", "create"]
    node: str


def node_churn(nodes: Sequence[str], *, start: float, end: float, period: float, seed: int) -> tuple[NodeEvent, ...]:
    """From `start`, every `period` s until `end`: cordon a node, delete another a quarter period later,
    uncordon the first at half, create the deleted one again at three quarters. Nodes drawn from `seed`."""
    if len(nodes) < 2 or period <= 0:
        return ()
    rng = random.Random(seed * 7919 + 1)
    out: list[NodeEvent] = []
    at = start
    while at + period * 0.75 <= end:
        cordoned, deleted = rng.sample(list(nodes), 2)
        out += [NodeEvent(at, "cordon", cordoned), NodeEvent(at + period / 4, "delete", deleted),
                NodeEvent(at + period / 2, "uncordon", cordoned), NodeEvent(at + period * 0.75, "create", deleted)]
        at += period
    return tuple(sorted(out))


def pod_manifest(name: str, *, workload: Workload, namespace: str, names: settings.Names = NAMES) -> dict[str, Any]:
    shape = workload.shape
    labels = {WORKLOAD_LABEL: workload.name}
    if workload.kind == "gang":
        labels |= {names.gang_name: workload.name, names.gang_size: str(workload.pods)}
    if shape.prefer:
        labels[names.placement] = settings.Placement.PREFER.value
    container: dict[str, Any] = {
        "name": "main", "image": "registry.local/churn:1",
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi", gpu.FULL_GPU: str(workload.gpus)},
                      "limits": {gpu.FULL_GPU: str(workload.gpus)}},
    }
    if shape.host_port:
        container["ports"] = [{"containerPort": HOST_PORT, "hostPort": HOST_PORT, "protocol": "TCP"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 0}}


def manifests(workload: Workload, *, namespace: str) -> list[dict[str, Any]]:
    """What the benchmark creates for a workload: its pods, or a ReplicaSet of one."""
    pods = [pod_manifest(n, workload=workload, namespace=namespace) for n in workload.member_names()]
    if workload.kind != "replicaset":
        return pods
    template = pods[0]
    selector = {WORKLOAD_LABEL: workload.name}
    return [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
             "metadata": {"name": workload.name, "namespace": namespace, "labels": selector},
             "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                      "template": {"metadata": {"labels": template["metadata"]["labels"]}, "spec": template["spec"]}}}]


# --- watching (pure: fed snapshots and times) ------------------------------------------------------


def stuck(pod: snapshot.Pod, *, names: settings.Names = NAMES) -> bool:
    """Released by us, not bound, not being deleted, and Unschedulable."""
    return not (pod.node_name or pod.deleting or names.gate in pod.scheduling_gates
                or names.release not in pod.annotations or not snapshot._unschedulable(pod.raw.get("status") or {}))


def planned_node(pod: snapshot.Pod, *, names: settings.Names = NAMES) -> str | None:
    """The node our release nominated the pod to (its release record), if it did."""
    raw = pod.annotations.get(names.release)
    return release_outcomes.read(raw).node if raw is not None else None


Outcome = Literal["bound", "ended", "vanished"]


def scheduler_message(pod: snapshot.Pod) -> str:
    """Why kube-scheduler could not place the pod (its PodScheduled condition's message), or ''."""
    for condition in (pod.raw.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return ""


@dataclasses.dataclass
class StuckPod:
    """`planned`: the node our release nominated it to ('' none); `message`: kube-scheduler's word when it first
    said Unschedulable; `bound_on`: the node it bound to in the end ('' none)."""

    key: str
    uid: str
    workload: str
    since: float
    planned: str = ""
    message: str = ""
    until: float | None = None
    outcome: Outcome | None = None
    bound_on: str = ""


@dataclasses.dataclass
class Watch:
    """Follows one run's pods through snapshots: stuck pods, first bindings against their plan, pods that vanished,
    gangs part-running.

    `plan`: the run's workloads by name. The shell tells it which workloads it ended (`end`) and which pods it deleted
    itself (`deleting`: with their node), so that only a pod someone else deleted counts as vanished.
    """

    plan: Mapping[str, Workload]
    namespace: str = NAMESPACE
    names: settings.Names = NAMES
    present: dict[str, snapshot.Pod] = dataclasses.field(default_factory=dict)  # uid -> pod
    first_seen: dict[str, float] = dataclasses.field(default_factory=dict)  # uid -> time
    bound_at: dict[str, float] = dataclasses.field(default_factory=dict)  # uid -> time
    planned: dict[str, str] = dataclasses.field(default_factory=dict)  # uid -> node our release nominated it to
    on_plan: dict[str, bool] = dataclasses.field(default_factory=dict)  # uid -> first bound on its planned node
    arrival_bound: dict[str, float] = dataclasses.field(default_factory=dict)  # member name -> first bound
    workload_bound: dict[str, float] = dataclasses.field(default_factory=dict)  # workload -> first bound whole
    stuck: dict[str, StuckPod] = dataclasses.field(default_factory=dict)  # uid -> its (first) stuck period
    ended: dict[str, float] = dataclasses.field(default_factory=dict)  # workload -> when the benchmark ended it
    deleted: set[str] = dataclasses.field(default_factory=set)  # uids the benchmark deleted itself
    vanished: list[str] = dataclasses.field(default_factory=list)  # pod keys someone else deleted
    part_since: dict[str, float] = dataclasses.field(default_factory=dict)  # gang -> part-running since
    part_running: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # gang -> durations

    def deleting(self, uids: Sequence[str]) -> None:
        self.deleted.update(uids)

    def member(self, pod: snapshot.Pod) -> str:
        """The arrival a pod stands for: its name, or its ReplicaSet's (replacements keep standing for it)."""
        return (pod.owner_name or pod.name) if pod.owner_kind == "ReplicaSet" else pod.name

    def end(self, workload: str, *, now: float) -> None:
        self.ended.setdefault(workload, now)
        self._close_part(workload, now)

    def observe(self, cluster: snapshot.Snapshot, *, now: float) -> list[str]:
        """Take in a snapshot; returns the workloads bound whole for the first time (every member of a gang): their
        lifetimes start."""
        seen = {p.uid: p for p in cluster.pods.values()
                if p.namespace == self.namespace and not p.deleting and p.labels.get(WORKLOAD_LABEL) in self.plan}
        started: list[str] = []
        for uid, pod in seen.items():
            self.first_seen.setdefault(uid, now)
            workload = pod.labels[WORKLOAD_LABEL]
            waiting = self.stuck.get(uid)
            if uid not in self.planned and (node := planned_node(pod, names=self.names)) is not None:
                self.planned[uid] = node
            if pod.node_name:
                if uid not in self.bound_at:
                    self.bound_at[uid] = now
                    if uid in self.planned:
                        self.on_plan[uid] = pod.node_name == self.planned[uid]
                    self.arrival_bound.setdefault(self.member(pod), now)
                    whole = all(n in self.arrival_bound for n in self.plan[workload].member_names())
                    if whole and workload not in self.workload_bound:
                        self.workload_bound[workload] = now
                        started.append(workload)
                if waiting is not None and waiting.outcome is None:
                    waiting.until, waiting.outcome, waiting.bound_on = now, "bound", pod.node_name
            elif waiting is None and stuck(pod, names=self.names):
                self.stuck[uid] = StuckPod(pod.key, uid, workload, now, planned=self.planned.get(uid, ""),
                                           message=scheduler_message(pod))
        for uid, pod in self.present.items():
            if uid in seen:
                continue
            ours = pod.labels[WORKLOAD_LABEL] in self.ended or uid in self.deleted
            if not ours:
                self.vanished.append(pod.key)
            waiting = self.stuck.get(uid)
            if waiting is not None and waiting.outcome is None:
                waiting.until = now
                waiting.outcome = "ended" if ours else "vanished"
        self.present = seen
        self._gangs(now)
        return started

    def _gangs(self, now: float) -> None:
        members: dict[str, list[snapshot.Pod]] = collections.defaultdict(list)
        for pod in self.present.values():
            workload = pod.labels[WORKLOAD_LABEL]
            if self.plan[workload].kind == "gang" and workload not in self.ended:
                members[workload].append(pod)
        for gang in list(self.part_since):
            if gang not in members:
                self._close_part(gang, now)
        for gang, pods in members.items():
            bound = sum(1 for p in pods if p.node_name)
            part = 0 < bound < self.plan[gang].pods
            if part:
                self.part_since.setdefault(gang, now)
            else:
                self._close_part(gang, now)

    def _close_part(self, gang: str, now: float) -> None:
        since = self.part_since.pop(gang, None)
        if since is not None:
            self.part_running.setdefault(gang, []).append(now - since)

    def finish(self, *, now: float) -> None:
        for gang in list(self.part_since):
            self._close_part(gang, now)


# --- summarising (pure) -----------------------------------------------------------------------------


def release_outcomes_by_cause(metrics_text: str) -> dict[str, float]:
    """cause -> count, from the descheduler's /metrics (`gpu_steward_release_outcomes_total`)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != OUTCOMES:
            continue
        for sample in family.samples:
            if sample.name == f"{OUTCOMES}_total" and sample.value:
                out[sample.labels["cause"]] = sample.value
    return out


def _seconds(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": pt._quantile(values, 0.5), "p99": pt._quantile(values, 0.99), "max": max(values, default=None)}


def summary(watch: Watch, *, plan: Sequence[Workload], rate: float, end: float) -> dict[str, Any]:
    """The numbers of one run, `end` seconds after its start (arrivals at `Workload.arrival(rate)`)."""
    arrivals = sum(w.pods for w in plan)
    waited = list(watch.stuck.values())
    ends = collections.Counter(p.outcome or "still stuck" for p in waited)
    to_bound = [p.until - p.since for p in waited if p.outcome == "bound" and p.until is not None]
    on_plan = sum(watch.on_plan.values())
    gangs = [w for w in plan if w.kind == "gang"]
    longest = {g.name: max(watch.part_running.get(g.name, [0.0])) for g in gangs}
    waits: dict[str, list[float]] = {"gated": [], "not_gated": []}
    never = {"gated": 0, "not_gated": 0}
    lost = 0
    for w in plan:
        kind = "gated" if w.shape.gated else "not_gated"
        for name in w.member_names():
            bound = watch.arrival_bound.get(name)
            if bound is not None:
                waits[kind].append(bound - w.arrival(rate))
            elif w.name in watch.ended:
                lost += 1  # its workload ended (its node deleted) before it was bound
            else:
                never[kind] += 1
    return {
        "arrivals": arrivals,
        "nominated_and_bound": len(watch.on_plan),
        "bound_on_planned_node": on_plan,
        "bound_on_planned_node_share": on_plan / len(watch.on_plan) if watch.on_plan else None,
        "deleted_or_recreated_by_gpu_steward": len(watch.vanished),
        "vanished_pods": list(watch.vanished),
        "stuck_pods": len(waited),
        "stuck_per_1000_arrivals": 1000 * len(waited) / arrivals if arrivals else None,
        "stuck_outcomes": dict(ends),
        "stuck_to_bound_seconds": _seconds(to_bound),
        "still_stuck_at_end": ends.get("still stuck", 0),
        "stuck": [dataclasses.asdict(p) for p in waited],
        "gangs": len(gangs),
        "gangs_part_running_over_threshold": sum(1 for v in longest.values() if v > PART_RUNNING_SECONDS),
        "part_running_threshold_seconds": PART_RUNNING_SECONDS,
        "longest_part_running_seconds": max(longest.values(), default=None),
        "pods_bound": len(watch.bound_at),
        "arrivals_unplaced_at_end": never,
        "arrivals_ended_before_bound": lost,
        "waits": {k: {"bound": len(v), **{f"wait_{q}_seconds": s for q, s in _seconds(v).items()}}
                  for k, v in waits.items()},
        "duration_seconds": end,
    }


# --- running one (rate, arm) (I/O) ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
    bin_dir: pathlib.Path
    nodes: tuple[str, ...]
    plan: tuple[Workload, ...]
    churn_period: float
    drain: float
    seed: int


def _node_manifest(name: str) -> dict[str, Any]:
    return localcluster.gpu_node(name, gpus=GPUS_PER_NODE, domains=DOMAINS_PER_NODE,
                                 product=localcluster.DEFAULT_GPU_PRODUCT, names=NAMES, cpu="64", memory="512Gi")


async def _request(api: client.ApiClient, method: str, path: str, **kwargs: Any) -> None:
    try:
        await kube.request(api, method, path, timeout_seconds=pt.API_TIMEOUT_SECONDS, **kwargs)
    except kube.ApiError as exc:
        if exc.status not in (404, 409):  # gone already / there already: what we wanted
            raise


async def _create(api: client.ApiClient, workload: Workload) -> None:
    for manifest in manifests(workload, namespace=NAMESPACE):
        kind = "replicasets" if manifest["kind"] == "ReplicaSet" else "pods"
        prefix = "/apis/apps/v1" if kind == "replicasets" else "/api/v1"
        await _request(api, "POST", f"{prefix}/namespaces/{NAMESPACE}/{kind}", body=manifest)


async def _end(api: client.ApiClient, workload: Workload) -> None:
    if workload.kind == "replicaset":
        await _request(api, "DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets/{workload.name}",
                       query={"propagationPolicy": "Background"})
        return
    for name in workload.member_names():
        await _request(api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", query={"gracePeriodSeconds": 0})


async def _node_event(api: client.ApiClient, event: NodeEvent, live: feeder.Feeder, watch: Watch,
                      ending: set[str], now: float) -> None:
    path = f"/api/v1/nodes/{event.node}"
    if event.action in ("cordon", "uncordon"):
        await _request(api, "PATCH", path, body={"spec": {"unschedulable": event.action == "cordon"}},
                       content_type="application/merge-patch+json")
    elif event.action == "create":
        await _request(api, "POST", "/api/v1/nodes", body=_node_manifest(event.node))
    else:
        # The node goes with what runs there: a workload of bare pods ends (a gang as a whole), a ReplicaSet's pod is
        # replaced by its controller.
        on_node = [p for p in live.snapshot.pods.values() if p.namespace == NAMESPACE and p.node_name == event.node]
        watch.deleting([p.uid for p in on_node])
        await _request(api, "DELETE", path)
        for pod in on_node:
            name = pod.labels.get(WORKLOAD_LABEL, "")
            if pod.owner_kind == "ReplicaSet":
                await _request(api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod.name}",
                               query={"gracePeriodSeconds": 0})
            elif name in watch.plan and name not in ending:
                ending.add(name)
                watch.end(name, now=now)
                await _end(api, watch.plan[name])


def _metrics(port: int | None) -> str:
    if port is None:
        return ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def _run(cluster: localcluster.LocalCluster, setup: Setup, *, rate: float, arm: str,
               workdir: pathlib.Path) -> dict[str, Any]:
    config = pt._settings(cluster.kubeconfig)
    api = await kube.api_client(config.kubernetes)
    plan = {w.name: w for w in setup.plan}
    watch = Watch(plan)
    metrics_port = localcluster.free_port() if arm == "gpu-steward" else None
    try:
        live = feeder.Feeder(config=config, api=api, prometheus=None)
        with contextlib.ExitStack() as stack:
            async with asyncio.TaskGroup() as group:
                stop = asyncio.Event()
                port = localcluster.free_port()
                background = [group.create_task(live.run()),
                              group.create_task(devicesim.serve(cluster_source=live, host="127.0.0.1", port=port,
                                                                stop=stop))]
                prom = await asyncio.to_thread(
                    localprometheus.start_prometheus, workdir / "prometheus", [],
                    scrape_targets=[f"127.0.0.1:{port}"], scrape_interval=f"{SCRAPE_SECONDS}s")
                stack.callback(prom.stop)
                if arm == "gpu-steward":
                    steward = {"kubernetes": {"watch_timeout_seconds": 60},
                               "prometheus": {"url": prom.url, "occupancy_refresh_seconds": SCRAPE_SECONDS},
                               "descheduler": {"leader_election": {"lease_namespace": LEASE_NAMESPACE},
                                               "reclaim": {"enabled": False}}}
                    await asyncio.to_thread(stack.enter_context, localsteward.webhook(
                        cluster, workdir, config=steward, descheduler=True, descheduler_metrics_port=metrics_port))
                await pt._wait_until(lambda: live.synced and len(live.snapshot.nodes) == len(setup.nodes), within=60)
                pt.say(f"   {arm}, {rate:g} pods/s: {sum(w.pods for w in setup.plan)} pods in {len(setup.plan)} "
                       "workloads")
                end = await _replay(api, setup, live, watch, rate=rate)
                text = await asyncio.to_thread(_metrics, metrics_port)  # before the descheduler stops
                stop.set()
                background[0].cancel()
    finally:
        await api.close()
    # The default arm has no descheduler: None, not "no outcome".
    return {**summary(watch, plan=setup.plan, rate=rate, end=end),
            "release_outcomes": release_outcomes_by_cause(text) if metrics_port else None}


async def _replay(api: client.ApiClient, setup: Setup, live: feeder.Feeder, watch: Watch, *, rate: float) -> float:
    """Create the workloads at their arrival times and play the node churn; end each workload its lifetime after
    its first binding; return the seconds from the start to the end of the drain."""
    start = time.monotonic()
    plan = watch.plan
    due: dict[str, float] = {}  # workload -> when the benchmark ends it
    ending: set[str] = set()
    last = max((w.arrival(rate) for w in setup.plan), default=0.0)
    events = node_churn(setup.nodes, start=min(5.0, last / 4), end=last, period=setup.churn_period, seed=setup.seed)

    def clock() -> float:
        return time.monotonic() - start

    async def follow() -> None:
        changed = live.subscribe()
        try:
            while True:
                await changed.wait()
                changed.clear()
                now = clock()
                for name in watch.observe(live.snapshot, now=now):
                    due[name] = now + plan[name].lifetime
        finally:
            live.unsubscribe(changed)

    async def reap(group: asyncio.TaskGroup) -> None:
        while True:
            now = clock()
            for name in [n for n, at in due.items() if at <= now and n not in ending]:
                ending.add(name)
                watch.end(name, now=now)
                group.create_task(_end(api, plan[name]))
            await asyncio.sleep(REAP_SECONDS)

    timeline: list[tuple[float, Workload | NodeEvent]] = sorted(
        [(w.arrival(rate), w) for w in setup.plan] + [(e.at, e) for e in events], key=lambda item: item[0])
    async with asyncio.TaskGroup() as group:
        helpers = [group.create_task(follow()), group.create_task(reap(group))]
        for at, item in timeline:
            delay = at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if isinstance(item, Workload):
                group.create_task(_create(api, item))
            else:
                group.create_task(_node_event(api, item, live, watch, ending, clock()))
        await asyncio.sleep(max(0.0, last + setup.drain - clock()))
        for task in helpers:
            task.cancel()
    end = clock()
    watch.observe(live.snapshot, now=end)
    watch.finish(now=end)
    return end


def run_one(setup: Setup, *, rate: float, arm: str, workdir: pathlib.Path) -> dict[str, Any]:
    started, load_before = time.monotonic(), os.getloadavg()
    cluster = localcluster.LocalCluster(setup.bin_dir, progress=lambda m: None)
    with cluster:
        cluster.add_nodes([_node_manifest(n) for n in setup.nodes], timeout_seconds=180)
        namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                      for n in (NAMESPACE, LEASE_NAMESPACE)]
        cluster.apply([*namespaces, *demo.priority_classes(settings.Settings())])
        result = asyncio.run(_run(cluster, setup, rate=rate, arm=arm, workdir=workdir))
    return {**result, "wall_seconds": time.monotonic() - started,
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]}}


# --- reporting --------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One column per `rate/arm` run."""
    rows: list[tuple[str, ...]] = [("", *runs)]

    def row(label: str, get: Any) -> None:
        rows.append((label, *(get(r) for r in runs.values())))

    def spread(r: Mapping[str, Any], key: str) -> str:
        s = r[key]
        return f"{_fmt(s['p50'])} / {_fmt(s['p99'])}"

    row("arrivals (pods)", lambda r: str(r["arrivals"]))
    row("offered load", lambda r: _fmt(r["offered_load"], ".0%"))
    row("bound on planned node", lambda r: f"{r['bound_on_planned_node']} of {r['nominated_and_bound']} "
        f"({_fmt(r['bound_on_planned_node_share'], '.1%')})")
    row("deleted/re-created by gpu-steward", lambda r: str(r["deleted_or_recreated_by_gpu_steward"]))
    row("stuck pods (released, Unschedulable)", lambda r: str(r["stuck_pods"]))
    row("  per 1,000 arrivals", lambda r: _fmt(r["stuck_per_1000_arrivals"]))
    row("  bound / ended / vanished", lambda r: "/".join(str(r["stuck_outcomes"].get(k, 0))
                                                         for k in ("bound", "ended", "vanished")))
    row("  stuck -> bound p50/p99 s", lambda r: spread(r, "stuck_to_bound_seconds"))
    row("  still stuck at the end", lambda r: str(r["still_stuck_at_end"]))
    row("release outcomes (descheduler metric)",
        lambda r: "-" if r["release_outcomes"] is None else _fmt(sum(r["release_outcomes"].values()), "g"))
    for key in sorted({k for r in runs.values() for k in r["release_outcomes"] or {}}):
        row(f"  {key}", lambda r, k=key: "-" if r["release_outcomes"] is None
            else _fmt(r["release_outcomes"].get(k, 0), "g"))
    row(f"gangs part-running > {PART_RUNNING_SECONDS:g} s", lambda r: f"{r['gangs_part_running_over_threshold']} "
        f"of {r['gangs']}")
    row("  longest part-running s", lambda r: _fmt(r["longest_part_running_seconds"]))
    row("pods bound (replacements count)", lambda r: str(r["pods_bound"]))
    row("arrivals unplaced at the end: gated", lambda r: str(r["arrivals_unplaced_at_end"]["gated"]))
    row("  never-gated", lambda r: str(r["arrivals_unplaced_at_end"]["not_gated"]))
    for kind, label in (("gated", "wait p50/p99 s: gated kinds"), ("not_gated", "  never-gated kinds")):
        row(label, lambda r, k=kind: f"{_fmt(r['waits'][k]['wait_p50_seconds'], '.2f')} / "
            f"{_fmt(r['waits'][k]['wait_p99_seconds'], '.2f')}")
    width = max(len(r[0]) for r in rows) + 2
    column = max([22, *(len(cell) + 2 for r in rows for cell in r[1:])])
    return [r[0].ljust(width) + "".join(cell.ljust(column) for cell in r[1:]) for r in rows]


# --- command line -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=20, help=f"nodes of {GPUS_PER_NODE} GPUs")
    parser.add_argument("--pods", type=int, default=800, help="pods arriving (gang members and replicas count)")
    parser.add_argument("--rates", default="2,3", help="arrival rates, pods/s, comma-separated: one run each")
    parser.add_argument("--seed", type=int, default=1, help="workload sequence and node churn")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {','.join(ARMS)}")
    parser.add_argument("--churn-period", type=float, default=60.0, help="seconds per cordon/delete cycle")
    parser.add_argument("--drain", type=float, default=DRAIN_SECONDS, help="seconds after the last arrival")
    parser.add_argument("--quick", action="store_true",
                        help="small CI run: 6 nodes, 50 pods at 3/s, gpu-steward arm, 8 s drain")
    parser.add_argument("--out", type=pathlib.Path, help=f"JSON results (default {DEFAULT_OUT.name})")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.rates, args.arms = 6, min(args.pods, 50), "3", "gpu-steward"
        args.churn_period, args.drain = 10.0, 8.0 if args.drain == DRAIN_SECONDS else args.drain
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or any(a not in ARMS for a in arms) or not args.rates or min(args.rates) <= 0:
        parser.error(f"--arms from {', '.join(ARMS)}; --rates positive")
    args.arms = arms
    args.out = args.out or DEFAULT_OUT.with_name(f"{DEFAULT_OUT.stem}{'_quick' if args.quick else ''}.json")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    with localcluster.sigterm_as_interrupt():
        return _main(parse_args(argv), command=list(argv if argv is not None else sys.argv[1:]))


def _main(args: argparse.Namespace, *, command: list[str]) -> int:
    total_gpus = args.nodes * GPUS_PER_NODE
    plan = workloads(pods=args.pods, seed=args.seed, total_gpus=total_gpus)
    nodes = tuple(f"churn-{i:02d}" for i in range(args.nodes))
    pt.say(f"{args.nodes} nodes ({total_gpus} GPUs), {sum(w.pods for w in plan)} pods in {len(plan)} workloads "
           f"{dict(collections.Counter(w.kind for w in plan))}, seed {args.seed}, mean lifetime "
           f"{mean_lifetime(total_gpus):.1f} s, rates {args.rates} pods/s, arms {args.arms}")
    bin_dir = localcluster.ensure_binaries(progress=lambda line: None)
    setup = Setup(bin_dir, nodes, plan, args.churn_period, args.drain, args.seed)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="release-churn-") as tmp:
        for rate in args.rates:
            for arm in args.arms:
                label = f"{rate:g}/s {arm}"
                workdir = pathlib.Path(tmp) / label.replace("/", "-").replace(" ", "-")
                workdir.mkdir(parents=True)
                result = run_one(setup, rate=rate, arm=arm, workdir=workdir)
                runs[label] = {**result, "rate": rate, "arm": arm,
                               "offered_load": offered_load(plan, rate=rate, total_gpus=total_gpus)}
                pt.say(f"   done in {result['wall_seconds']:.0f} s: {result['bound_on_planned_node']} of "
                       f"{result['nominated_and_bound']} bound on their planned node, "
                       f"{result['deleted_or_recreated_by_gpu_steward']} deleted by gpu-steward, "
                       f"{result['stuck_pods']} stuck ({result['still_stuck_at_end']} at the end), "
                       f"outcomes {result['release_outcomes']}; load average before "
                       f"{result['load_average']['before']}, after {result['load_average']['after']} (2 cores)")
    lines = table(runs)
    pt.say("\n" + "\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", "benchmarks/release_churn.py", *command]),
        "load_average": {"before": runs[next(iter(runs))]["load_average"]["before"],
                         "after": runs[next(reversed(runs))]["load_average"]["after"]},
        "nodes": args.nodes, "gpus": total_gpus, "seed": args.seed,
        "churn_period_seconds": args.churn_period, "drain_seconds": args.drain,
        "mean_lifetime_seconds": mean_lifetime(total_gpus),
        "workloads": dict(collections.Counter(w.kind for w in plan)),
        "runs": runs, "table": lines,
    }, indent=2))
    pt.say(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
