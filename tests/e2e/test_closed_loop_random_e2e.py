"""Closed-loop placement, differential against the real kube-scheduler 1.37.2: seeded random clusters and pods,
our webhook and descheduler as the chart runs them, cordons and node deletions mid-run; no pod is ever stranded.

Setup (once for the module, on the session's control plane): the chart is rendered (`helm template`) and its
ServiceAccounts, RBAC and Leases are applied in a namespace of their own; our webhook and our descheduler then run
on this machine with bound tokens of those ServiceAccounts (every API call checked against the chart's RBAC), with
the chart's settings file plus a short `descheduler.gangs.bind_bound_seconds`. The webhook is registered for the
namespaces labelled `PROOF_LABEL` only (the session's webhook does not see them), and it watches this
descheduler's Lease, so that governed pods are gated and released (nominated, then un-gated) by the descheduler.

Each seed draws:
- kwok GPU nodes of 2, 4 or 8 GPUs in one or two NVLink domains, in zones a and b, some without our NVLink and
  NVIDIA labels (tainted and labelled for the test, so no other test's pod lands there);
- PersistentVolumes bound to claims: local ones (node affinity on one node) and zonal ones (a zone);
- guards: pods that were never ours, with a required pod anti-affinity against an app's label, on one node;
- arrivals over `ARRIVAL_SECONDS`, alone or in bursts: governed multi-GPU bare pods and ReplicaSets, gangs of 2-3
  bare members, never-gated 1-GPU pods and `prefer` pods, pods with claims (never gated: ungoverned), any of them
  with host ports that collide and labels the guards repel;
- departures (pods finishing, so that room appears while gated and never-gated pods wait: the race), a cordon, a
  node deletion and an uncordon, each aimed at a node a released, nominated, unbound pod waits for when there is
  one.

Judged by oracles that are not our capacity model:
1. at the end (at least `PENDING_BOUND_SECONDS` after the last arrival or disruption) no pod the test created is
   lost — nothing in gpu-steward deletes or re-creates a pod (a pod on a deleted node is the node's loss: counted
   apart) — no pod carries a pin, and no gang is part-running: members bound while others are absent, held by our
   gate, or Pending past the bound. A gang in its own gang PodGroup (`descheduler.gangs.native_binding`, on here:
   the session's 1.37.2 serves `scheduling.k8s.io/v1beta1`) part-running past the bound fails the test: kube-scheduler
   binds such a gang all-or-nothing (issue 28's 0). A gang without one (the mechanism off or not served) is counted
   and printed, and fails the test unless every pending member was told `GangNotBoundInTime`: a nomination alone
   does not make binding all-or-nothing when a node is taken, cordoned or deleted between nomination and binding;
2. every pod left Pending at the end is one kube-scheduler cannot place either: a probe, the pod as its creator
   wrote it (opted out of our webhook, our gang labels off, preemptionPolicy Never: filters only), is created in
   the same namespace beside it; kube-scheduler binding the probe (a gang's pending members: all of them) fails
   the test with the pod's gates, nomination, conditions and Events.

Each seed prints what happened: arrivals, disruptions (and the nominated pods waiting on that node then), the
longest wait of a released pod seen, the descheduler's `gpu_steward_release_outcomes_total` by cause, the
observation pass's Events, and the probes' verdicts. Timing decides which races happen, so a seed is not replayed
exactly; the checks hold for whatever happened.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import json
import pathlib
import random
import re
import ssl
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from common import gangs, gpu, settings, snapshot
from descheduler.release import outcomes
from gpu_steward_lab import certs, localcluster
from tests.chart import helm
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
RELEASE, RELEASE_NAMESPACE = "proof", "gpu-steward-proof"
PREFIX = f"{RELEASE}-gpu-steward"
PROOF_LABEL = "e2e.gpu-steward.io/closed-loop"
REGISTRATION = "gpu-steward-e2e-closed-loop"
POOL = "e2e.gpu-steward.io/pool"
UNIT = "e2e.gpu-steward.io/unit"
TAINT = {"key": "e2e.gpu-steward.io/closed-loop", "value": "true", "effect": "NoSchedule"}
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
STORAGE_CLASS = "e2e-closed-loop-static"
APPS = ("web", "db", "batch")
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Lease"}

BIND_BOUND_SECONDS = 15  # descheduler.gangs.bind_bound_seconds: a released pod not bound by then is reported
# The end state is judged at least this long after the last arrival or disruption: the bound, and 20 s for
# kube-scheduler's back-off and a pass on a 2-core machine shared with other work.
PENDING_BOUND_SECONDS = BIND_BOUND_SECONDS + 20
# With backfill off, a waiting gang keeps nodes from single pods behind it for this long: short, so that the end
# state is not judged inside a reservation the planner documents.
RESERVATION_SECONDS = 8
ARRIVAL_SECONDS = 15  # arrivals fill the nodes past their capacity in this long
RUN_SECONDS = 42  # then pods finish, nodes are cordoned, deleted and uncordoned until this long
# A racer waits this long before its room appears: past kube-scheduler's first back-off (1 s), so that the pod's
# deletion sends it straight back to the active queue.
RACER_LEAD_SECONDS = 1.5
POSTPONE_SECONDS = 8  # a disruption waits up to this long for a nominated pod waiting on a node to aim at
# Never-gated pods of a class above our default tier's (normal, 10,000) that never preempt: kube-scheduler takes
# them before a pod we nominated (its queue is ordered by priority, and a higher priority ignores a nomination).
URGENT_CLASS = "e2e-closed-loop-urgent"
BACKLOG = 12
PROBE_CLASS = "e2e-closed-loop-probe"  # priority 0, preemptionPolicy Never: kube-scheduler's filters alone
QUIET_SECONDS = RESERVATION_SECONDS + 4  # nothing bound, released or created for this long: the end state
SETTLE_SECONDS = PENDING_BOUND_SECONDS + 25  # at most this long after the last arrival or disruption
SEEDS = (20261126, 20261127, 20261128)


# --- the chart's webhook and descheduler, under its RBAC ---------------------------------------------------------


@dataclasses.dataclass
class Steward:
    webhook: localcluster.ManagedProcess
    descheduler: localcluster.ManagedProcess
    metrics_port: int

    def outcomes(self) -> collections.Counter[str]:
        """`gpu_steward_release_outcomes_total` by cause, as the descheduler exports it."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        out: collections.Counter[str] = collections.Counter()
        for line in text.splitlines():
            found = re.match(r'gpu_steward_release_outcomes_total\{cause="([^"]+)"\} (\S+)', line)
            if found:
                out[found[1]] += int(float(found[2]))
        return out


def _chart(port: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The chart's ServiceAccounts, RBAC and Leases for the webhook and the descheduler, and its settings file."""
    values = helm.local_values(port, settings={"descheduler": {"gangs": {
        "bind_bound_seconds": BIND_BOUND_SECONDS, "reservation_seconds": RESERVATION_SECONDS,
        "resync_seconds": 1}}})
    rendered = helm.template(values, release=RELEASE, namespace=RELEASE_NAMESPACE)
    ours = {f"{PREFIX}-webhook", f"{PREFIX}-descheduler"}
    objects = [o for o in rendered
               if o["kind"] in RBAC_KINDS and (o["kind"] == "Lease" or o["metadata"]["name"] in ours)]
    [config] = [o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{PREFIX}-config"]
    return objects, yaml.safe_load(config["data"]["config.yaml"])


def _process(name: str, workdir: pathlib.Path, config: dict[str, Any], *args: str) -> localcluster.ManagedProcess:
    config_file = workdir / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return localcluster.ManagedProcess(
        name, [sys.executable, "-m", "gpu_steward", name, "--config", str(config_file), *args],
        log_file=workdir / f"{name}.log", env=conftest._env_with_repo_on_path())


@pytest.fixture(scope="module")
def steward(control_plane: localcluster.LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Steward]:
    cluster, workdir = control_plane, tmp_path_factory.mktemp("closed-loop")
    port, metrics_port = localcluster.free_ports(2)
    objects, chart_config = _chart(port)
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NAMESPACE}}])
    cluster.apply(objects)
    cluster.apply([{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS},
                    "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate"}])
    chart_settings = settings.Settings(**chart_config)
    cluster.apply([kube.priority_class(c.name, value=c.value, preemption_policy=c.preemption_policy)
                   for c in (chart_settings.tiers.for_tier(t) for t in settings.Tier)]
                  + [kube.priority_class(PROBE_CLASS, value=0, preemption_policy="Never"),
                     kube.priority_class(URGENT_CLASS, value=50_000, preemption_policy="Never")])

    def token(component: str) -> str:
        return str(helm.service_account_kubeconfig(kubeconfig=cluster.kubeconfig, namespace=RELEASE_NAMESPACE,
                                                   service_account=f"{PREFIX}-{component}",
                                                   dest=workdir / f"{component}.kubeconfig"))

    election = {"lease_namespace": RELEASE_NAMESPACE, "identity": "closed-loop", "lease_duration_seconds": 6,
                "renew_deadline_seconds": 4, "retry_period_seconds": 1}
    serving = certs.generate(workdir / "tls", dns_names=["localhost"])
    webhook = _process("webhook", workdir, settings.merge(chart_config, {
        "webhook": {"host": "127.0.0.1", "port": port, "cert_file": str(serving.cert_file),
                    "key_file": str(serving.key_file), "managed_tls": {"enabled": False}},
        "kubernetes": {"kubeconfig": token("webhook")},
        "descheduler": {"leader_election": election}}))
    descheduler = _process("descheduler", workdir, settings.merge(chart_config, {
        "kubernetes": {"kubeconfig": token("descheduler")},
        "descheduler": {"leader_election": election, "reclaim": {"enabled": False}}}),
        "--metrics-port", str(metrics_port))
    registration = localcluster.mutating_webhook_configuration(
        name=REGISTRATION, url=f"https://127.0.0.1:{port}/mutate", ca_bundle=serving.ca_bundle)
    registration["webhooks"][0]["namespaceSelector"] = {"matchLabels": {PROOF_LABEL: "true"}}
    try:
        webhook.start()
        webhook.wait_http_ok(f"https://127.0.0.1:{port}/readyz",
                             ssl_context=ssl.create_default_context(cafile=str(serving.ca_file)))
        descheduler.start()
        descheduler.wait_http_ok(f"http://127.0.0.1:{metrics_port}/readyz", timeout_seconds=60)
        cluster.apply([registration])
        yield Steward(webhook, descheduler, metrics_port)
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", REGISTRATION, "--ignore-not-found", check=False)
        descheduler.stop()
        webhook.stop()
        cluster.kubectl("delete", "storageclass", STORAGE_CLASS, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "priorityclass", PROBE_CLASS, URGENT_CLASS, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "clusterrole,clusterrolebinding", *sorted(
            o["metadata"]["name"] for o in objects if o["kind"].startswith("Cluster")), "--ignore-not-found",
            check=False)
        cluster.kubectl("delete", "namespace", RELEASE_NAMESPACE, "--wait=false", check=False)


def _wait_gating(cluster: localcluster.LocalCluster, steward: Steward, namespace: str) -> None:
    """Until a governed pod created in `namespace` comes back gated: the webhook is routed and sees the
    descheduler's Lease renewed."""
    probe = kube.pod("gating-probe", namespace=namespace, gpus=2)

    def gated() -> bool:
        done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe),
                               check=False)
        return done.returncode == 0 and NAMES.gate in kube.gates(json.loads(done.stdout))

    try:
        kube.poll("the webhook gates governed pods", gated, timeout_seconds=60, interval_seconds=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nwebhook:\n{steward.webhook.log_tail()}\ndescheduler:\n"
                             f"{steward.descheduler.log_tail()}") from None


# --- the scenario ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Unit:
    """What one arrival creates: a bare pod, a ReplicaSet, or a gang's members."""

    name: str
    kind: str  # bare | rs | gang | one | prefer | claim
    at: float  # seconds into the run
    manifests: list[dict[str, Any]]  # as created
    replicas: int = 1

    def written(self, pod_name: str) -> dict[str, Any]:
        """The pod as its creator wrote it (a ReplicaSet's: its template)."""
        if self.kind == "rs":
            template = self.manifests[0]["spec"]["template"]
            return {"apiVersion": "v1", "kind": "Pod", "metadata": copy.deepcopy(template["metadata"]),
                    "spec": copy.deepcopy(template["spec"])}
        return copy.deepcopy(next(m for m in self.manifests if m["metadata"]["name"] == pod_name))

    @property
    def bare(self) -> bool:
        return self.kind != "rs"


@dataclasses.dataclass
class Scenario:
    seed: int
    pool: str
    nodes: list[dict[str, Any]]
    volumes: list[dict[str, Any]]  # PersistentVolumes and their claims
    guards: list[dict[str, Any]]
    units: list[Unit]
    departures: list[float]
    disruptions: list[tuple[float, str]]  # (at, cordon | delete | uncordon)

    def describe(self) -> str:
        shapes = ", ".join(
            f"{n['metadata']['name'].rsplit('-', 1)[1]}:{n['status']['capacity'].get(gpu.FULL_GPU)}g"
            f"{n['metadata']['labels'].get(NAMES.nvlink_domains, '?')}d/{n['metadata']['labels'][ZONE]}"
            for n in self.nodes)
        kinds = collections.Counter(u.kind for u in self.units)
        return (f"nodes [{shapes}]; {len(self.guards)} guards; units {dict(sorted(kinds.items()))}; "
                f"{len(self.departures)} departures; disruptions {[d for _, d in self.disruptions]}")


def _node(rng: random.Random, name: str, pool: str) -> dict[str, Any]:
    gpus = rng.choice((2, 4, 8, 8, 8))
    domains = rng.choice((1, 2)) if gpus > 2 else 1
    node = localcluster.gpu_node(name, gpus=gpus, domains=domains, product="NVIDIA-H100-80GB-HBM3", names=NAMES,
                                 cpu="32", memory="256Gi", pods=30)
    if rng.random() < 0.3:  # a node nobody labelled for us: no NVLink labels, no NVIDIA feature discovery
        labels = node["metadata"]["labels"]
        for key in [k for k in labels if k.startswith(("nvidia.com/", NAMES.prefix))]:
            del labels[key]
        node["metadata"]["annotations"].pop(NAMES.nvlink_topology, None)
    node["metadata"]["labels"].update({POOL: pool, ZONE: rng.choice("ab")})
    node["spec"]["taints"] = [TAINT]
    return node


def _pod(name: str, namespace: str, pool: str, unit: str, *, gpus: int, app: str, port: int | None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = kube.pod(name, namespace=namespace, gpus=gpus, labels={"app": app, UNIT: unit, **(labels or {})},
                    node_selector={POOL: pool})
    body["spec"]["tolerations"] = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    if port:
        body["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": port}]
    return body


def _volumes(rng: random.Random, nodes: list[dict[str, Any]], namespace: str, seed: int) -> list[dict[str, Any]]:
    """Two local PersistentVolumes (one node each) and two zonal ones (zone a, zone b), each pre-bound to a claim."""
    out = []
    for i in range(4):
        name = f"e2e-closed-loop-{seed}-{i}"
        if i < 2:
            where = str(rng.choice(nodes)["metadata"]["name"])
            source: dict[str, Any] = {"local": {"path": "/mnt/disk"}}
            term, labels = kube.requirement(HOSTNAME, "In", where), {}
        else:
            where = "ab"[i - 2]
            source = {"hostPath": {"path": "/var/disk"}}
            term, labels = kube.requirement(ZONE, "In", where), {ZONE: where}
        out.append({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": labels},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                             "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS, **source,
                             "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [term]}]}},
                             "claimRef": {"namespace": namespace, "name": f"claim-{i}"}}})
        out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": f"claim-{i}", "namespace": namespace},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                             "storageClassName": STORAGE_CLASS, "volumeName": name}})
    return out


KINDS = ("bare", "bare", "bare", "rs", "gang", "gang", "one", "one", "one", "prefer", "prefer", "prefer", "claim")


def scenario(seed: int, namespace: str) -> Scenario:
    rng = random.Random(seed)
    pool = f"closed-loop-{seed}"
    nodes = [_node(rng, f"cl{seed % 1000}-{i}", pool) for i in range(rng.randint(5, 6))]
    volumes = _volumes(rng, nodes, namespace, seed)
    guards = []
    for i in range(2):
        guard = _pod(f"guard-{i}", namespace, pool, f"guard-{i}", gpus=0, app="guard", port=None)
        guard["spec"]["nodeSelector"][HOSTNAME] = str(rng.choice(nodes)["metadata"]["name"])
        guard["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": rng.choice((HOSTNAME, HOSTNAME, ZONE)),
            "labelSelector": {"matchLabels": {"app": rng.choice(APPS)}}}]}}
        guards.append(guard)
    units: list[Unit] = []
    claims = list(range(4))
    rng.shuffle(claims)
    at = 0.0
    for i in range(rng.randint(15, 18)):
        at = min(at + rng.choice((0.0, 0.0, 1.0, 2.0)), ARRIVAL_SECONDS)  # bursts: several arrivals at once
        kind = rng.choice(KINDS)
        if kind == "claim" and not claims:
            kind = "one"
        name, app = f"u{i:02d}-{kind}", rng.choice(APPS)
        port = rng.choice((None, None, None, 8080, 8080, 8081))

        def pod(pod_name: str, gpus: int, labels: dict[str, str] | None = None, *, name: str = name, app: str = app,
                port: int | None = port) -> dict[str, Any]:
            return _pod(pod_name, namespace, pool, name, gpus=gpus, app=app, port=port, labels=labels)

        if kind == "bare":
            manifests = [pod(name, rng.choice((2, 2, 4, 8)))]
        elif kind == "one":
            manifests = [pod(name, 1)]
        elif kind == "prefer":
            manifests = [pod(name, rng.choice((2, 4)), {NAMES.placement: "prefer"})]
        elif kind == "claim":
            manifests = [pod(name, rng.choice((1, 2, 4)))]
            manifests[0]["spec"]["volumes"] = [{"name": "data",
                                                "persistentVolumeClaim": {"claimName": f"claim-{claims.pop()}"}}]
        elif kind == "gang":
            size, gpus = rng.choice((2, 2, 3)), rng.choice((2, 2, 4))
            labels = {NAMES.gang_name: name, NAMES.gang_size: str(size)}
            manifests = [pod(f"{name}-{m}", gpus, labels) for m in range(size)]
        else:
            replicas = rng.choice((1, 1, 2))
            template = pod("x", rng.choice((2, 4)))
            manifests = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                          "metadata": {"name": name, "namespace": namespace},
                          "spec": {"replicas": replicas, "selector": {"matchLabels": {UNIT: name}},
                                   "template": {"metadata": {"labels": template["metadata"]["labels"]},
                                                "spec": template["spec"]}}}]
            units.append(Unit(name, kind, at, manifests, replicas))
            continue
        units.append(Unit(name, kind, at, manifests, len(manifests)))
    departures = sorted(rng.uniform(ARRIVAL_SECONDS, RUN_SECONDS) for _ in range(rng.randint(8, 10)))
    first = rng.uniform(ARRIVAL_SECONDS + 2, ARRIVAL_SECONDS + 8)
    disruptions = [(first, "cordon"), (first + rng.uniform(4, 8), "delete"), (RUN_SECONDS - 2, "uncordon")]
    return Scenario(seed, pool, nodes, volumes, guards, units, departures, disruptions)


# --- watching the run ----------------------------------------------------------------------------------------------


def nominated_of(pod: dict[str, Any]) -> tuple[str, float | None] | None:
    """(node it was nominated to, released at) of a pod our release nominated that waits to be bound; None when it
    is no such pod."""
    meta, spec = pod["metadata"], pod["spec"]
    raw = (meta.get("annotations") or {}).get(NAMES.release)
    record = outcomes.read(raw) if raw is not None else None
    if (record is None or record.node is None or spec.get("nodeName") or meta.get("deletionTimestamp")
            or NAMES.gate in kube.gates(pod)):
        return None
    return record.node, record.at


@dataclasses.dataclass
class Run:
    cluster: localcluster.LocalCluster
    namespace: str
    scenario: Scenario
    steward: Steward
    rng: random.Random
    started: float = 0.0
    pods: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    live_nodes: list[str] = dataclasses.field(default_factory=list)
    cordoned: list[str] = dataclasses.field(default_factory=list)
    deleted_nodes: set[str] = dataclasses.field(default_factory=set)
    created: list[Unit] = dataclasses.field(default_factory=list)
    departed: set[str] = dataclasses.field(default_factory=set)  # pods the test deleted (finished)
    lost_with_node: set[str] = dataclasses.field(default_factory=set)  # pods bound to a node the test deleted
    waits: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)  # (pod, uid) -> longest wait
    violations: list[str] = dataclasses.field(default_factory=list)
    part_running: list[str] = dataclasses.field(default_factory=list)  # gangs part-running past the bound
    flagged: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    log: list[str] = dataclasses.field(default_factory=list)
    finishing: list[tuple[float, str, list[str]]] = dataclasses.field(default_factory=list)
    changed_at: float = 0.0
    fingerprint: frozenset[tuple[str, str, str, str]] = frozenset()

    def in_pod_group(self) -> int:
        """Gangs whose every present member names its gang's own PodGroup (bound all-or-nothing by kube-scheduler)."""
        return sum(1 for u in self.created if u.kind == "gang" and (members := _unit_pods(self, u))
                   and all(gangs.named_pod_group(p, names=NAMES) for p in members.values()))

    def now(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        self.log.append(f"t={self.now():5.1f}s {text}")

    def observe(self) -> None:
        """Read the namespace's pods; record every nominated pod's wait; flag any pod that carries a pin (release
        adds none)."""
        self.pods = kube.pods(self.cluster, self.namespace)
        wall = time.time()
        for name, pod in self.pods.items():
            uid = pod["metadata"]["uid"]
            if snapshot.pinned_node(pod) is not None and NAMES.release in (pod["metadata"].get("annotations") or {}) \
                    and (name, uid) not in self.flagged:
                self.flagged.add((name, uid))
                self.violations.append(f"{name} carries a required metadata.name term after its release: a pin"
                                       f"\n{self.evidence(name)}")
            nominated = nominated_of(pod)
            released = nominated[1] if nominated is not None else None
            if released is None:
                continue
            self.waits[(name, uid)] = max(self.waits.get((name, uid), 0.0), wall - released)
        fingerprint = frozenset((n, p["metadata"]["uid"], p["spec"].get("nodeName") or "", ",".join(kube.gates(p)))
                                for n, p in self.pods.items())
        if fingerprint != self.fingerprint:
            self.fingerprint, self.changed_at = fingerprint, self.now()

    def waiting_nominated(self) -> dict[str, list[str]]:
        """node -> the pods our release nominated to it that wait to be bound."""
        out: dict[str, list[str]] = {}
        for name, pod in self.pods.items():
            nominated = nominated_of(pod)
            if nominated is not None:
                out.setdefault(nominated[0], []).append(name)
        return out

    def evidence(self, name: str) -> str:
        pod = self.pods.get(name) or kube.pods(self.cluster, self.namespace).get(name) or {}
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        conditions = [{k: c.get(k) for k in ("type", "status", "reason", "message")}
                      for c in (pod.get("status") or {}).get("conditions") or ()]
        told = [f"{e.get('reason')}: {e.get('message')}" for e in kube.events(self.cluster, self.namespace)
                if e["involvedObject"].get("name") == name]
        said = [line for line in self.steward.descheduler.log_tail(400).splitlines() if name in line][-8:]
        return json.dumps({"node": spec.get("nodeName"), "gates": kube.gates(pod),
                           "nominated": (pod.get("status") or {}).get("nominatedNodeName"),
                           "pin": snapshot.pinned_node(pod),
                           "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                           if k.startswith(NAMES.prefix)},
                           "conditions": conditions, "events": told, "descheduler log": said}, indent=1)

    # --- actions ---

    def create(self, unit: Unit) -> None:
        self.cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                     "items": unit.manifests}))
        self.created.append(unit)

    def depart(self) -> None:
        """A bare pod (or a whole gang) that runs is about to finish. A backlog arrives first: `BACKLOG` pods of a
        higher class (`URGENT_CLASS`, which never preempts) that fit nowhere, then a never-gated racer of that class for
        the finishing pod's GPUs; kube-scheduler finds no room for them. `RACER_LEAD_SECONDS` later the pod finishes
        (deleted): kube-scheduler takes the backlog and the racer first (their class is higher), while our descheduler
        may nominate a gated pod to the room that appeared: the race, the racer binding a moment after the snapshot the
        nomination was planned on (the released pod then binds elsewhere, or waits). The backlog is deleted again once
        the room is taken."""
        running: dict[str, int] = {}  # unit -> GPUs of its largest pod
        finishing = {unit for _, unit, _ in self.finishing}
        for pod in self.pods.values():
            unit = pod["metadata"]["labels"].get(UNIT, "")
            if (pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp") and unit not in finishing
                    and unit.split("-")[-1] in ("bare", "one", "prefer", "claim", "gang")):
                running[unit] = max(running.get(unit, 0), gpu.pod_request(pod).full)
        # Room for a gated pod or gang that waits (all of it on one node), so that our descheduler pins there.
        waiting: dict[str, int] = {}
        for pod in self.pods.values():
            if NAMES.gate in kube.gates(pod):
                unit = pod["metadata"]["labels"].get(UNIT, "")
                waiting[unit] = waiting.get(unit, 0) + gpu.pod_request(pod).full
        gated = sorted(waiting.values())
        fitting = sorted(u for u, g in running.items() if gated and g >= gated[0])
        if not running:
            return
        unit = self.rng.choice(fitting or sorted(running))
        names = sorted(n for n, p in self.pods.items() if p["metadata"]["labels"].get(UNIT) == unit)
        gpus = running[unit]
        backlog = []
        for i in range(BACKLOG):
            hog = _pod(f"backlog-{len(self.created):02d}-{i}", self.namespace, self.scenario.pool, "backlog", gpus=0,
                       app="backlog", port=None)
            hog["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"  # more than any node has
            hog["spec"]["priorityClassName"] = URGENT_CLASS
            backlog.append(hog)
        self.cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                     "items": backlog}))
        name = f"r{len(self.created):02d}-{'prefer' if gpus > 1 else 'one'}"
        racer = _pod(name, self.namespace, self.scenario.pool, name, gpus=gpus, app=self.rng.choice(APPS),
                     port=None, labels={NAMES.placement: "prefer"} if gpus > 1 else None)
        racer["spec"]["priorityClassName"] = URGENT_CLASS
        self.create(Unit(name, "prefer" if gpus > 1 else "one", self.now(), [racer]))
        self.say(f"racer {name} ({gpus} GPUs, never gated) arrives; {unit} finishes in {RACER_LEAD_SECONDS:g}s; "
                 f"gated units waiting (GPUs): {gated or 'none'}")
        self.finishing.append((self.now() + RACER_LEAD_SECONDS, unit, names))
        self.finishing.append((self.now() + RACER_LEAD_SECONDS + 2, "backlog", [h["metadata"]["name"]
                                                                                for h in backlog]))

    def finish(self) -> None:
        for due, unit, names in [f for f in self.finishing if f[0] <= self.now()]:
            self.finishing.remove((due, unit, names))
            self.departed |= set(names)
            self.cluster.kubectl("delete", "pod", *names, "-n", self.namespace, "--ignore-not-found", "--wait=false")
            if unit != "backlog":
                self.say(f"{unit} finished ({', '.join(names)})")

    def target(self, choices: list[str]) -> str | None:
        """The node a nominated, unbound pod waits for when there is one (the race this test is about), else any."""
        if not choices:
            return None
        waiting = self.waiting_nominated()
        aimed = [n for n in choices if n in waiting]
        return self.rng.choice(aimed or choices)

    def disrupt(self, what: str) -> None:
        if what == "uncordon":
            for cordoned in self.cordoned:
                self.cluster.kubectl("uncordon", cordoned, check=False)
                self.say(f"uncordoned {cordoned}")
            self.cordoned.clear()
            return
        schedulable = [n for n in self.live_nodes if n not in self.cordoned]
        node = self.target(schedulable if len(schedulable) > 3 else [])
        if node is None:
            self.say(f"{what}: no node to spare")
            return
        nominated = self.waiting_nominated().get(node, [])
        if what == "cordon":
            self.cluster.kubectl("cordon", node)
            self.cordoned.append(node)
        else:
            bound = {n for n, p in self.pods.items() if p["spec"].get("nodeName") == node}
            self.lost_with_node |= bound
            self.cluster.kubectl("delete", "node", node, "--wait=false")
            self.live_nodes.remove(node)
            self.deleted_nodes.add(node)
        self.say(f"{what} {node}; nominated pods waiting for it: {nominated or 'none'}")


def _setup(run: Run) -> None:
    cluster, scenario = run.cluster, run.scenario
    cluster.add_nodes(scenario.nodes)
    run.live_nodes = [n["metadata"]["name"] for n in scenario.nodes]
    cluster.apply(scenario.volumes)
    for claim in (v["metadata"]["name"] for v in scenario.volumes if v["kind"] == "PersistentVolumeClaim"):
        cluster.kubectl("wait", "--for=jsonpath={.status.phase}=Bound", f"pvc/{claim}", "-n", run.namespace,
                        "--timeout=60s")
    cluster.apply(scenario.guards)
    kube.poll("guards bound", lambda: all(p["spec"].get("nodeName") for p in kube.pods(cluster, run.namespace)
                                          .values()) or None)


def _drive(run: Run) -> None:
    """Arrivals, departures and disruptions on schedule, observing the pods between them; then until quiet."""
    events: list[tuple[float, str, Unit | None, float]] = sorted(
        [(u.at, "create", u, u.at) for u in run.scenario.units]
        + [(t, "depart", None, t) for t in run.scenario.departures]
        + [(t, what, None, t) for t, what in run.scenario.disruptions], key=lambda e: e[0])
    run.started = time.monotonic()
    last = events[-1][0]
    while events:
        run.observe()
        while events and events[0][0] <= run.now():
            _, what, unit, due = events.pop(0)
            if unit is not None:
                run.create(unit)
            elif what == "depart":
                run.depart()
            elif what != "uncordon" and not run.waiting_nominated() and run.now() < due + POSTPONE_SECONDS:
                events.append((run.now() + 1, what, None, due))  # wait for a nominated pod to aim at
                events.sort(key=lambda e: e[0])
            else:
                run.disrupt(what)
        run.finish()
        time.sleep(0.3)
    while run.finishing:
        run.observe()
        run.finish()
        time.sleep(0.3)
    end = max(run.now(), last) + SETTLE_SECONDS
    while run.now() < end:
        run.observe()
        if not run.waiting_nominated() and run.now() - run.changed_at >= QUIET_SECONDS:
            break
        time.sleep(0.5)
    run.say(f"settled: {sum(1 for p in run.pods.values() if p['spec'].get('nodeName'))} pods bound, "
            f"{sum(1 for p in run.pods.values() if not p['spec'].get('nodeName'))} not")


# --- the oracles ---------------------------------------------------------------------------------------------------


def _probe(unit: Unit, pod_name: str, namespace: str, index: int) -> dict[str, Any]:
    """The pod as its creator wrote it, for kube-scheduler alone: our webhook skips it, no gang labels of ours, no
    preemption (filters only)."""
    body = unit.written(pod_name)
    labels = {k: v for k, v in (body["metadata"].get("labels") or {}).items()
              if k not in (NAMES.gang_name, NAMES.gang_size)}
    body["metadata"] = {"name": f"probe-{index:02d}-{pod_name}"[:63], "namespace": namespace,
                        "labels": {**labels, UNIT: "probe", NAMES.skip: "true"}}
    body["spec"]["priorityClassName"] = PROBE_CLASS
    return body


def _unit_pods(run: Run, unit: Unit) -> dict[str, dict[str, Any]]:
    return {n: p for n, p in run.pods.items() if (p["metadata"].get("labels") or {}).get(UNIT) == unit.name
            and not p["metadata"].get("deletionTimestamp")}


def created(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["creationTimestamp"])  # RFC 3339, UTC: ordered as text


def _judge(run: Run) -> list[str]:
    """The end state (oracle 1: lost pods, gangs part-running) and the stock scheduler's verdict on every pod left
    Pending (oracle 2)."""
    problems: list[str] = []

    def missing() -> set[str]:
        run.observe()
        expected = {m["metadata"]["name"] for u in run.created if u.bare for m in u.manifests}
        present = {n for n, p in run.pods.items() if not p["metadata"].get("deletionTimestamp")}
        return expected - run.departed - run.lost_with_node - present

    with contextlib.suppress(AssertionError):  # the last departures' deletions seen by the watch: a moment
        kube.poll("every bare pod present", lambda: not missing() or None, timeout_seconds=15, interval_seconds=1)
    gone = missing()
    for unit in run.created:
        present = _unit_pods(run, unit)
        if unit.bare:
            for name in sorted(gone & {m["metadata"]["name"] for m in unit.manifests}):
                problems.append(f"{name} ({unit.kind}) is gone: neither the test nor a node deletion deleted it\n"
                                f"{run.evidence(name)}")
        elif len(present) < unit.replicas - sum(1 for n in run.lost_with_node if n.startswith(unit.name)):
            problems.append(f"ReplicaSet {unit.name} has {len(present)} of {unit.replicas} pods")
        if unit.kind == "gang" and not set(unit_names := [m["metadata"]["name"] for m in unit.manifests]) & (
                run.departed | run.lost_with_node):
            bound = [n for n in unit_names if (present.get(n) or {}).get("spec", {}).get("nodeName")]
            rest = sorted(set(unit_names) - set(bound))
            held = [n for n in rest if n not in present or NAMES.gate in kube.gates(present[n])]
            if bound and held:
                problems.append(f"gang {unit.name} part-running: {bound} bound, {rest} not, {held} absent or held "
                                "by our gate\n" + "\n".join(run.evidence(n) for n in rest))
            elif bound and rest and max(created(present[n]) for n in bound) > min(created(present[n]) for n in rest):
                problems.append(f"gang {unit.name} started part-way: {bound} bound, {rest} not, and a bound member "
                                "is no older than the rest (created again and started without its gang)\n"
                                + "\n".join(run.evidence(n) for n in unit_names))
            elif bound and rest and all(gangs.named_pod_group(present[n], names=NAMES) for n in unit_names):
                # Its own PodGroup (descheduler.gangs.native_binding, on where v1beta1 is served, as here):
                # kube-scheduler binds the gang all-or-nothing, so part-running is a failure (issue 28's 0).
                run.part_running.append(unit.name)
                problems.append(f"gang {unit.name} part-running past the bound in its own gang PodGroup: {bound} "
                                f"bound, {rest} Pending\n" + "\n".join(run.evidence(n) for n in unit_names))
            elif bound and rest:
                # Released whole without a PodGroup of ours (the mechanism off or not served), part of it bound and the
                # rest Pending past the bound (a node taken, cordoned or deleted between nomination and binding: a
                # nomination alone does not make binding all-or-nothing). Never repaired by deleting; it must be told
                # on every pending member. Counted and printed.
                run.part_running.append(unit.name)
                told = {e["involvedObject"].get("name") for e in kube.events(run.cluster, run.namespace)
                        if e["reason"] == outcomes.EVENTS[outcomes.Cause.GANG_NOT_BOUND][1]}
                if untold := [n for n in rest if n not in told]:
                    problems.append(f"gang {unit.name} part-running past the bound: {bound} bound, {rest} Pending, "
                                    f"and {untold} not told (GangNotBoundInTime)\n"
                                    + "\n".join(run.evidence(n) for n in unit_names))
    probes = 0
    for unit in run.created:
        run.observe()
        broken = sorted(n for n in run.lost_with_node if n.startswith(f"{unit.name}-"))  # members, replicas
        if broken and unit.kind == "gang":
            run.say(f"{unit.name}: not judged by the stock scheduler, members lost with their node: {broken}")
            continue
        pending = sorted(n for n, p in _unit_pods(run, unit).items() if not p["spec"].get("nodeName"))
        if not pending:
            continue
        bodies = [_probe(unit, name, run.namespace, probes + i) for i, name in enumerate(pending)]
        probes += len(bodies)
        verdicts = kube.scheduler_verdicts(run.cluster, bodies)
        run.say(f"stock scheduler on {unit.name}'s pending {pending}: {verdicts}")
        assert None not in verdicts.values(), f"the API server refused a probe of {unit.name}: {verdicts}"
        if all(verdicts.values()):
            problems.append(f"{unit.name} ({unit.kind}): {pending} left Pending, but kube-scheduler binds the pod as "
                            f"written: {verdicts}\n" + "\n".join(run.evidence(n) for n in pending))
    return problems


def _told(run: Run) -> list[str]:
    reasons = {reason for _, reason in outcomes.EVENTS.values()}
    return [f"{e['reason']} {e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: {e['message']}"
            for e in kube.events(run.cluster, run.namespace) if e["reason"] in reasons]


@pytest.fixture
def proof_namespace(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    """A namespace our test webhook sees and the session's webhook does not."""
    name = f"e2e-cl-{int(time.time()) % 100000}"
    control_plane.apply([{"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": name, "labels": {PROOF_LABEL: "true", conftest.BYPASS_LABEL: "true"}}}])
    control_plane.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s")
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("seed", SEEDS)
def test_no_release_strands_a_pod_and_every_pod_the_stock_scheduler_could_place_is_placed(
    control_plane: localcluster.LocalCluster, steward: Steward, proof_namespace: str, seed: int
) -> None:
    cluster, ns = control_plane, proof_namespace
    _wait_gating(cluster, steward, ns)
    plan = scenario(seed, ns)
    run = Run(cluster, ns, plan, steward, random.Random(seed + 1))
    before = steward.outcomes()
    try:
        _setup(run)
        _drive(run)
        problems = run.violations + _judge(run)
        after = steward.outcomes()
        reported = {k: after[k] - before[k] for k in after if after[k] - before[k]}
        longest = max(run.waits.values(), default=0.0)
        late = sum(1 for w in run.waits.values() if w > BIND_BOUND_SECONDS)
        report = "\n".join([
            f"seed {seed}: {plan.describe()}",
            f"gangs part-running past the bound: {len(run.part_running)} {run.part_running}",
            f"gangs in their own PodGroup: {run.in_pod_group()} of {sum(1 for u in run.created if u.kind == 'gang')}",
            f"nominated pods seen waiting: {len(run.waits)}, past the bound: {late}, longest {longest:.1f}s; "
            f"release outcomes (cause): {reported or 'none'}",
            *run.log, *_told(run)])
        print(report)
        assert not problems, report + "\n\n" + "\n\n".join(problems)
    finally:
        cluster.kubectl("delete", "replicasets,pods", "--all", "-n", ns, "--grace-period=0", "--wait=false",
                        check=False)
        cluster.kubectl("delete", "node", *run.live_nodes, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "pv", *(v["metadata"]["name"] for v in plan.volumes
                                           if v["kind"] == "PersistentVolume"), "--wait=false", check=False)
