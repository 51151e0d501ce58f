"""The demo (`scripts/demo`): the product on a local cluster, next to the same workload without it.

Two runs, one after the other, each on a fresh local control plane (kube-apiserver, scheduler,
controller-manager, etcd, kwok GPU nodes of the brief's classes: an 8-GPU node with two NVLink
domains of 4, 4-GPU nodes with pairs, 2-GPU nodes):

1. **default Kubernetes** — the workload alone;
2. **gpu-steward** — our webhook registered with the API server, our descheduler (gang release +
   idle reclaim) running, a real Prometheus scraping the device stand-in's DCGM series.

The workload, in order: an inference service (critical, 2 x 1 GPU), a notebook (1 GPU, idle from
the start), a batch job (scavenger, 2 x 1 GPU), two training gangs (2 x 2 GPUs and 2 x 4 GPUs);
then the batch job finishes, experiments fill the free GPUs, and an urgent training pod arrives
on a full cluster. GPU indices inside each node come from `gpu_steward_lab.devicesim` — the same
policy in both runs, so only the node choice differs. The demo narrates tiers, placements, NVLink
domains, gang releases and the reclaim, prints a comparison, writes a PNG of GPU occupancy per
node, and stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import pathlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from common import feeder, kube, settings, snapshot, snapshot_build
from gpu_steward_lab import devicesim, localcluster, localprometheus, localsteward, occupancy_picture

NODES = "1x8g2d,2x4g2d,2x2g"  # 20 GPUs
NAMESPACE = "ml"
IDLE_WINDOW_SECONDS = 30
SCRAPE_SECONDS = 2
RECLAIM_PREFIX = "reclaim-idle-resource.scheduling.x-k8s.io/"

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    gpus: int  # per pod
    pods: int
    tier: str
    utilisation: str  # simulated GPU utilisation, percent
    kind: str = "Pod"  # Pod | Deployment | Job | Gang
    about: str = ""


PLACEMENT_PHASE = (
    Workload("inference", 1, 2, "critical", "55", "Deployment", "inference service under an SLA"),
    Workload("notebook", 1, 1, "normal", "0", "Pod", "a notebook left open (idle)"),
    Workload("batch", 1, 2, "scavenger", "90", "Job", "batch job that soaks up spare GPUs"),
    Workload("train-4", 2, 2, "normal", "95", "Gang", "training gang of 4 GPUs (2 x 2)"),
    Workload("train-8", 4, 2, "normal", "95", "Gang", "training gang of 8 GPUs (2 x 4)"),
)
URGENT = Workload("train-urgent", 1, 1, "normal", "90", "Pod", "urgent training pod on a full cluster")


def _container(w: Workload) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "registry.local/cuda-app:12",
        "resources": {"limits": {"nvidia.com/gpu": str(w.gpus), "cpu": str(4 * w.gpus), "memory": f"{16 * w.gpus}Gi"}},
    }


def _pod_metadata(w: Workload, *, member: int | None = None) -> dict[str, Any]:
    labels = {"app": w.name, "gpu-steward.io/tier": w.tier}
    if w.kind == "Gang":
        labels |= {"gpu-steward.io/gang-name": w.name, "gpu-steward.io/gang-size": str(w.pods)}
    meta: dict[str, Any] = {"labels": labels, "annotations": {devicesim.UTILISATION_ANNOTATION: w.utilisation}}
    if member is not None:
        meta["name"] = f"{w.name}-{member}"
    return meta


def manifests(w: Workload, *, replicas: int | None = None) -> list[dict[str, Any]]:
    spec = {"containers": [_container(w)], "terminationGracePeriodSeconds": 0}
    count = w.pods if replicas is None else replicas
    if w.kind in ("Pod", "Gang"):
        names = [w.name] if w.kind == "Pod" else [f"{w.name}-{i}" for i in range(count)]
        out = []
        for i, name in enumerate(names):
            meta = _pod_metadata(w, member=i if w.kind == "Gang" else None)
            meta["name"] = name
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, "namespace": NAMESPACE}, "spec": spec})
        return out
    template = {"metadata": _pod_metadata(w), "spec": spec}
    if w.kind == "Deployment":
        body: dict[str, Any] = {"replicas": count, "selector": {"matchLabels": {"app": w.name}}, "template": template}
        api = "apps/v1"
    else:
        template["spec"] = {**spec, "restartPolicy": "Never"}
        body = {"parallelism": count, "completions": count, "template": template}
        api = "batch/v1"
    return [{"apiVersion": api, "kind": w.kind, "metadata": {"name": w.name, "namespace": NAMESPACE}, "spec": body}]


def priority_classes(config: settings.Settings) -> list[dict[str, Any]]:
    """The tier classes as the Helm chart makes them, with reclaim windows shortened for the demo."""
    out = []
    for tier in settings.Tier:
        cls = config.tiers.for_tier(tier)
        annotations = {}
        if tier is not settings.Tier.CRITICAL:  # production inference is never reclaimed
            annotations = {
                f"{RECLAIM_PREFIX}minimum-preemptable-priority": str(cls.value),
                f"{RECLAIM_PREFIX}toleration-seconds": "0",
                f"{RECLAIM_PREFIX}resource-idle-seconds": str(IDLE_WINDOW_SECONDS),
                f"{RECLAIM_PREFIX}resource-idle-usage-threshold": "5",
            }
        out.append({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": cls.name, "annotations": annotations},
            "value": cls.value, "preemptionPolicy": cls.preemption_policy,
            "description": f"gpu-steward tier {tier.value}",
        })
    return out


# --- observing a run ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodView:
    key: str
    app: str
    node: str | None
    phase: str
    gpus: int
    indices: tuple[int, ...]
    domains: int  # NVLink domains its GPUs span (0: not running)
    gated: bool
    priority_class: str | None


@dataclasses.dataclass(frozen=True)
class ClusterView:
    pods: tuple[PodView, ...]
    nodes: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]  # node, its NVLink domains
    owner: Mapping[str, Mapping[int, str]]  # node -> GPU index -> app


def observe(
    cluster: localcluster.LocalCluster, names: settings.Names, assignments: devicesim.Assignments
) -> ClusterView:
    document = cluster.kubectl_json("get", "nodes,pods,priorityclasses,namespaces", "-A")
    snap = snapshot_build.from_list(document, names=names, taken_at=None)
    assignments.update(snap)
    views = []
    owner: dict[str, dict[int, str]] = {}
    for name in snap.nodes:
        owner[name] = {}
        for key, indices in assignments.by_node.get(name, {}).items():
            for index in indices:
                owner[name][index] = snap.pods[key].labels.get("app", key)
    for pod in sorted(snap.pods.values(), key=lambda p: p.key):
        if pod.namespace != NAMESPACE:
            continue
        indices = assignments.by_node.get(pod.node_name or "", {}).get(pod.key, ())
        node = snap.nodes.get(pod.node_name or "")
        domains = node.topology.domains if node else ()
        spanned = sum(1 for d in domains if set(d) & set(indices))
        views.append(PodView(pod.key, pod.labels.get("app", ""), pod.node_name, pod.phase, pod.request.full,
                             indices, spanned, bool(pod.scheduling_gates), pod.priority_class_name))
    nodes = tuple((n, snap.nodes[n].topology.domains) for n in sorted(snap.nodes))
    return ClusterView(tuple(views), nodes, owner)


def _wait(what: str, check: Callable[[], bool], *, timeout: float, say: Say, interval: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    say(f"   ... {what}: not after {timeout:.0f} s")
    return False


def _scheduled(cluster: localcluster.LocalCluster, app: str, count: int) -> bool:
    pods = cluster.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"app={app}")["items"]
    bound = [p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]
    return len(bound) >= count


def _describe_pods(view: ClusterView, app: str, say: Say) -> None:
    for pod in view.pods:
        if pod.app != app:
            continue
        where = f"{pod.node} GPUs {list(pod.indices)}" if pod.node else "not scheduled"
        if pod.phase in snapshot.TERMINAL_PHASES:
            where = f"{pod.node}, {pod.phase} (kwok completes Job pods at once)"
        span = f", {pod.domains} NVLink domain{'s' if pod.domains != 1 else ''}" if pod.node and pod.gpus > 1 else ""
        tier = f" [{pod.priority_class}]" if pod.priority_class else ""
        say(f"   {pod.key}{tier}: {where}{span}")


# --- one run --------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    label: str
    after_placement: ClusterView | None = None
    after_reclaim: ClusterView | None = None
    urgent_scheduled_after: float | None = None
    events: list[str] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def _gpu_steward(
    cluster: localcluster.LocalCluster, workdir: pathlib.Path, *, prometheus_url: str, say: Say
) -> Iterator[None]:
    """Our webhook (registered with the API server) and descheduler as real processes."""
    with localsteward.webhook(cluster, workdir, config=steward_settings(prometheus_url), descheduler=True):
        say("   webhook registered with the API server (failurePolicy Ignore, timeout 3 s)")
        say(f"   tiers.label_claims: pods in namespace {NAMESPACE} may claim up to tier critical with the tier label "
            "(by default no pod can promote itself)")
        say("   descheduler leading (placement at release, gang release, idle reclaim; leader election on a Lease)")
        yield


def steward_settings(prometheus_url: str) -> dict[str, Any]:
    """The settings the demo runs gpu-steward with: what the narration announces is what they configure."""
    return {
        # The inference service's tier label claims critical: allowed in the demo's namespace only (a claim
        # the settings do not allow is refused, and the pod runs in the default tier).
        "tiers": {"label_claims": [{"name": "demo-inference", "tier": "critical", "namespaces": [NAMESPACE]}]},
        "prometheus": {"url": prometheus_url, "occupancy_refresh_seconds": SCRAPE_SECONDS},
        "descheduler": {
            "leader_election": {"lease_namespace": "gpu-steward", "lease_duration_seconds": 6,
                                "renew_deadline_seconds": 4, "retry_period_seconds": 1},
            # The notebook is a bare pod, as JupyterHub starts them: allowed to go (off by default).
            "reclaim": {"interval_seconds": 5, "max_sample_age_seconds": 20,
                        "conventions": {"evict_bare_pods": True}},
            "gangs": {"resync_seconds": 2},
        },
    }


async def _serve_devices(cluster: localcluster.LocalCluster, config: settings.Settings, port: int,
                         stop: asyncio.Event) -> None:
    api = await kube.api_client(config.kubernetes.model_copy(update={"kubeconfig": cluster.kubeconfig}))
    try:
        live = feeder.Feeder(config=config, api=api, prometheus=None)
        async with asyncio.TaskGroup() as group:
            feed = group.create_task(live.run())
            await devicesim.serve(cluster_source=live, host="127.0.0.1", port=port, stop=stop)
            feed.cancel()
    finally:
        await api.close()


@contextlib.contextmanager
def _device_stand_in(cluster: localcluster.LocalCluster, config: settings.Settings) -> Iterator[int]:
    """The device plugin + dcgm-exporter stand-in, served from a thread with its own event loop."""
    port = localcluster.free_port()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            loop.run_until_complete(_serve_devices(cluster, config, port, stop))
        except BaseException as exc:  # reported to the demo's thread below
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="devicesim", daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=15)
        if failure:
            logging.getLogger(__name__).warning("device stand-in stopped with %r", failure[0])


def run_once(*, label: str, bin_dir: pathlib.Path, steward: bool, workdir: pathlib.Path, say: Say,
             keep: bool = False) -> RunResult:
    config = settings.Settings(kubernetes=settings.Kubernetes(watch_timeout_seconds=60))
    result = RunResult(label)
    cluster = localcluster.LocalCluster(bin_dir, progress=lambda m: None)
    say(f"\n=== {label} ===")
    started = time.monotonic()
    cluster.start()
    try:
        say(f"   control plane up in {time.monotonic() - started:.1f} s; adding kwok GPU nodes {NODES}")
        cluster.add_nodes(localcluster.gpu_nodes(NODES, names=config.names, name_prefix="gpu"))
        cluster.kubectl("create", "namespace", NAMESPACE)
        cluster.kubectl("create", "namespace", "gpu-steward")
        assignments = devicesim.Assignments()
        with contextlib.ExitStack() as stack:
            if steward:
                cluster.apply(priority_classes(config))
                devices_port = stack.enter_context(_device_stand_in(cluster, config))
                prom = localprometheus.start_prometheus(workdir / "prometheus", [],
                                                        scrape_targets=[f"127.0.0.1:{devices_port}"],
                                                        scrape_interval=f"{SCRAPE_SECONDS}s")
                stack.callback(prom.stop)
                say(f"   Prometheus {prom.url} scraping the DCGM stand-in every {SCRAPE_SECONDS} s")
                stack.enter_context(_gpu_steward(cluster, workdir, prometheus_url=prom.url, say=say))
            _placement_phase(cluster, config, assignments, result, steward=steward, say=say)
            _reclaim_phase(cluster, config, assignments, result, steward=steward, say=say)
            result.events = _events(cluster)
    finally:
        if keep:
            say(f"   --keep: cluster {cluster.name} left running; kubeconfig {cluster.kubeconfig}")
            say(f"   stop it with: KWOK_WORKDIR={cluster.workdir} {bin_dir}/kwokctl delete cluster "
                f"--name {cluster.name}")
        else:
            cluster.stop()
    return result


def _placement_phase(cluster: localcluster.LocalCluster, config: settings.Settings,
                     assignments: devicesim.Assignments, result: RunResult, *, steward: bool, say: Say) -> None:
    for w in PLACEMENT_PHASE:
        # Without gpu-steward the tier label is only a label: nothing reads it.
        tier = f"tier label {w.tier}" + ("" if steward else ", read by nothing")
        say(f"-> {w.name}: {w.about} ({w.pods} x {w.gpus} GPU, {tier})")
        cluster.apply(manifests(w))
        _wait(f"{w.name} scheduled", functools.partial(_scheduled, cluster, w.name, w.pods), timeout=60, say=say)
        view = observe(cluster, config.names, assignments)
        if w.kind == "Gang" and steward:
            say("   gated at creation by the webhook, released together by the gang controller")
        _describe_pods(view, w.name, say)
    time.sleep(SCRAPE_SECONDS)
    result.after_placement = observe(cluster, config.names, assignments)


def _reclaim_phase(cluster: localcluster.LocalCluster, config: settings.Settings,
                   assignments: devicesim.Assignments, result: RunResult, *, steward: bool, say: Say) -> None:
    say("-> batch job done; experiments fill every free GPU")
    cluster.kubectl("delete", "job", "batch", "-n", NAMESPACE, "--wait=true", "--cascade=foreground")
    view = observe(cluster, config.names, assignments)
    used = sum(p.gpus for p in view.pods if p.node and p.phase not in snapshot.TERMINAL_PHASES)
    free = sum(sum(len(d) for d in domains) for _, domains in view.nodes) - used
    experiments = Workload("experiments", 1, free, "normal", "70", "Deployment", "")
    if free:
        cluster.apply(manifests(experiments))
        _wait("experiments scheduled", lambda: _scheduled(cluster, "experiments", free), timeout=60, say=say)
    say(f"   cluster full: {free} experiment pods started; the notebook has been idle (0 %) since it started")
    say(f"-> {URGENT.name}: {URGENT.about} (1 GPU, tier normal: the scheduler cannot preempt equal priority)")
    cluster.apply(manifests(URGENT))
    started = time.monotonic()
    timeout = 120 if steward else 30
    if _wait(f"{URGENT.name} scheduled", lambda: _scheduled(cluster, URGENT.name, 1), timeout=timeout, say=say):
        result.urgent_scheduled_after = time.monotonic() - started
        say(f"   {URGENT.name} scheduled after {result.urgent_scheduled_after:.0f} s")
    else:
        say(f"   {URGENT.name} still Pending: nothing frees the idle notebook's GPU")
    result.after_reclaim = observe(cluster, config.names, assignments)


def _events(cluster: localcluster.LocalCluster) -> list[str]:
    items = cluster.kubectl_json("get", "events", "-A", "--sort-by=.metadata.creationTimestamp")["items"]
    ours = []
    for event in items:
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
        if "gpu-steward" in source:
            obj = event.get("involvedObject") or {}
            ours.append(f"{event.get('type')} {event.get('reason')} {obj.get('namespace', '')}/{obj.get('name')}: "
                        f"{event.get('message')}")
    return ours


# --- the comparison --------------------------------------------------------------------------------


def _partial_gangs(view: ClusterView | None) -> list[str]:
    gangs = {w.name: w.pods for w in PLACEMENT_PHASE if w.kind == "Gang"}
    running = {name: sum(1 for p in (view.pods if view else ()) if p.app == name and p.node) for name in gangs}
    return [f"{name} ({running[name]}/{size})" for name, size in gangs.items() if 0 < running[name] < size]


def summary(runs: Sequence[RunResult]) -> list[str]:
    def multi(view: ClusterView | None) -> list[PodView]:
        return [p for p in (view.pods if view else ()) if p.gpus > 1 and p.node]

    rows = [("", *[r.label for r in runs])]
    rows.append(("multi-GPU pods in one NVLink domain",
                 *[f"{sum(p.domains == 1 for p in multi(r.after_placement))}/{len(multi(r.after_placement))}"
                   for r in runs]))
    rows.append(("mean NVLink domains per multi-GPU pod",
                 *[f"{sum(p.domains for p in multi(r.after_placement)) / max(1, len(multi(r.after_placement))):.2f}"
                   for r in runs]))
    rows.append(("GPU pods left Pending after placement",
                 *[str(sum(1 for p in (r.after_placement.pods if r.after_placement else ()) if not p.node))
                   for r in runs]))
    rows.append(("gangs with only part of them running",
                 *[", ".join(_partial_gangs(r.after_placement)) or "none" for r in runs]))
    rows.append(("urgent pod scheduled",
                 *[f"after {r.urgent_scheduled_after:.0f} s" if r.urgent_scheduled_after is not None else "no (Pending)"
                   for r in runs]))
    width = max(len(row[0]) for row in rows) + 2
    return [row[0].ljust(width) + "".join(cell.ljust(22) for cell in row[1:]) for row in rows]


def run(*, out_dir: pathlib.Path, keep: bool, say: Say) -> int:
    say("gpu-steward demo: preparing the local control plane (built once from Go modules, then cached)")
    bin_dir = localcluster.ensure_binaries(progress=lambda line: say(f"   {line}"))
    out_dir.mkdir(parents=True, exist_ok=True)
    with localcluster.sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="gpu-steward-demo-") as tmp:
        base = run_once(label="default Kubernetes", bin_dir=bin_dir, steward=False,
                        workdir=pathlib.Path(tmp) / "baseline", say=say)
        (pathlib.Path(tmp) / "steward").mkdir()
        ours = run_once(label="with gpu-steward", bin_dir=bin_dir, steward=True,
                        workdir=pathlib.Path(tmp) / "steward", say=say, keep=keep)
    say("\n=== what gpu-steward did (Kubernetes Events) ===")
    for line in ours.events or ["(no events recorded)"]:
        say(f"   {line}")
    say("\n=== comparison ===")
    for line in summary([base, ours]):
        say(f"   {line}")
    picture = out_dir / "gpu-occupancy.png"
    occupancy_picture.write(picture, columns=[
        [(f"{r.label}: {phase}", view)
         for phase, view in (("after placement", r.after_placement), ("after the urgent pod", r.after_reclaim))
         if view is not None]
        for r in (base, ours)
    ])
    (out_dir / "demo-result.json").write_text(json.dumps(
        {r.label: {"urgent_scheduled_after_seconds": r.urgent_scheduled_after, "events": r.events,
                   "placement": [dataclasses.asdict(p) for p in (r.after_placement.pods if r.after_placement else ())]}
         for r in (base, ours)}, indent=2))
    say(f"\npicture: {picture}\nresults: {out_dir / 'demo-result.json'}")
    return 0
