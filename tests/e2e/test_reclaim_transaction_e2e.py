"""Evictions as transactions, re-checked, on the real API server (issue 29 items 4 and 5).

- A fact we rely on: the API server answers a server-side dry run of an eviction (`dryRun=All`) as it would the
  eviction — 429 under a PodDisruptionBudget that allows no disruption, 409 on a failed precondition — and
  evicts nothing.
- A budget created between the plan and the evictions refuses the second victim's dry run: none is evicted
  (today's main evicted the first, then met the 429).
- A gang's GPU-less launcher refused: its workers stay (today's main evicted the workers first).
- A victim turning busy while the API answers slowly, read from a real Prometheus: not evicted.
The evictor and the reclaim loop run in this process against the session's control plane.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes_asyncio import client

from common import kube as api
from common import prometheus, settings, settings_loader, snapshot, source
from descheduler import evictor, policy, reclaim
from descheduler.reclaim import loop as reclaim_loop
from descheduler.reclaim import utilisation_promql
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube
from tests.support import prometheus as prom

pytestmark = [pytest.mark.e2e]

NAMES = settings.Names()
CONFIG = settings_loader.load(overrides={"descheduler": {"reclaim": {"conventions": {"evict_bare_pods": True}}}})
RECLAIMABLE = "e2e-transaction-reclaimable"
THRESHOLD_PERCENT = 5


def start(cluster: localcluster.LocalCluster, namespace: str, pods: list[dict[str, Any]]) -> dict[str, str]:
    """Create `pods`, wait until each runs; name -> UID."""
    for pod in pods:
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    names = {pod["metadata"]["name"] for pod in pods}

    def running() -> bool:
        listed = kube.pods(cluster, namespace)
        return all(listed.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)

    kube.poll(f"{', '.join(sorted(names))} running", running)
    return {name: str(p["metadata"]["uid"]) for name, p in kube.pods(cluster, namespace).items()}


def guard(cluster: localcluster.LocalCluster, namespace: str, name: str, labels: dict[str, str]) -> None:
    """A PodDisruptionBudget allowing no disruption of the pods `labels` select, once its status says so."""
    budget = kube.pod_disruption_budget(name, namespace=namespace, match_labels=labels, min_available=1)
    cluster.kubectl("create", "-f", "-", input=json.dumps(budget))
    cluster.kubectl("wait", "--for=jsonpath={.status.currentHealthy}=1", f"pdb/{name}", "-n", namespace,
                    "--timeout=30s")


def standing(cluster: localcluster.LocalCluster, namespace: str) -> dict[str, bool]:
    """Pod name -> whether it is still there and not terminating."""
    return {name: not p["metadata"].get("deletionTimestamp") for name, p in kube.pods(cluster, namespace).items()}


def victim(namespace: str, name: str, uid: str, *, unit: str | None = None, gpus: bool = True) -> reclaim.Eviction:
    return reclaim.Eviction(
        pod=f"{namespace}/{name}", uid=uid, node="", unit=unit or f"{namespace}/{name}", preemptor=f"{namespace}/want",
        utilization=1.0 if gpus else None, threshold=5.0 if gpus else None,
        window_seconds=600 if gpus else None, workload=None, reason=f"idle; reclaimed for {namespace}/want")


async def test_a_dry_run_eviction_is_answered_as_the_real_one_and_evicts_nothing(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, kube_api: client.ApiClient,
) -> None:
    cluster = gpu_cluster.cluster
    uids = start(cluster, plain_namespace, [kube.pod("guarded", namespace=plain_namespace, labels={"app": "guarded"}),
                                            kube.pod("free", namespace=plain_namespace)])
    guard(cluster, plain_namespace, "guard", {"app": "guarded"})
    evictions = evictor.ApiEvictionClient(kube_api, timeout_seconds=10)

    async def status(name: str, *, dry_run: bool, uid: str | None = None) -> int:
        try:
            await evictions.evict(namespace=plain_namespace, name=name, uid=uid or uids[name], dry_run=dry_run)
        except api.ApiError as exc:
            return exc.status
        return 201

    assert await status("guarded", dry_run=True) == 429
    assert await status("free", dry_run=True) == 201
    assert await status("free", dry_run=True, uid="not-its-uid") == 409  # preconditions judged too
    assert standing(cluster, plain_namespace) == {"guarded": True, "free": True}  # nothing evicted
    budget = cluster.kubectl_json("get", "pdb", "guard", "-n", plain_namespace)["status"]
    assert (budget["disruptionsAllowed"], budget.get("disruptedPods") or {}) == (0, {})
    # ... as the real calls are answered.
    assert await status("guarded", dry_run=False) == 429
    assert await status("free", dry_run=False) == 201
    kube.poll("free evicted", lambda: "free" not in kube.pods(cluster, plain_namespace))
    assert standing(cluster, plain_namespace) == {"guarded": True}


async def test_a_budget_created_between_plan_and_eviction_evicts_none_of_the_demands_victims(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, kube_api: client.ApiClient,
) -> None:
    """Fails on the main of issue 29: the first victim was evicted before the second one's 429."""
    cluster = gpu_cluster.cluster
    uids = start(cluster, plain_namespace, [kube.pod(n, namespace=plain_namespace, labels={"app": n})
                                            for n in ("first", "second")])
    plan = [victim(plain_namespace, "first", uids["first"]), victim(plain_namespace, "second", uids["second"])]
    guard(cluster, plain_namespace, "since-the-plan", {"app": "second"})
    the_evictor = evictor.Evictor(evictor.ApiEvictionClient(kube_api, timeout_seconds=10),
                                  config=CONFIG.descheduler.reclaim, names=NAMES)
    outcomes = await the_evictor.evict_plan(plan, now=time.time())
    assert [(o.eviction.pod.split("/")[1], o.result) for o in outcomes] == [
        ("first", evictor.Result.SKIPPED), ("second", evictor.Result.BLOCKED)]
    assert "in the server-side dry run, a PodDisruptionBudget blocks the eviction" in outcomes[1].detail
    assert standing(cluster, plain_namespace) == {"first": True, "second": True}


async def test_a_gangs_launcher_refused_leaves_its_workers(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, kube_api: client.ApiClient,
) -> None:
    """Fails on the main of issue 29: the workers went first, then the launcher's 429 split the gang."""
    cluster = gpu_cluster.cluster
    uids = start(cluster, plain_namespace, [
        *(kube.pod(f"worker-{i}", namespace=plain_namespace, labels={"role": "worker"}) for i in range(2)),
        kube.pod("launcher", namespace=plain_namespace, labels={"role": "launcher"})])
    unit = f"{reclaim.GANG}{plain_namespace}/job"
    plan = [victim(plain_namespace, "worker-0", uids["worker-0"], unit=unit),
            victim(plain_namespace, "worker-1", uids["worker-1"], unit=unit),
            victim(plain_namespace, "launcher", uids["launcher"], unit=unit, gpus=False)]  # the planner's order
    guard(cluster, plain_namespace, "launcher", {"role": "launcher"})
    the_evictor = evictor.Evictor(evictor.ApiEvictionClient(kube_api, timeout_seconds=10),
                                  config=CONFIG.descheduler.reclaim, names=NAMES)
    outcomes = await the_evictor.evict_plan(plan, now=time.time())
    assert {o.eviction.pod.split("/")[1]: o.result for o in outcomes} == {
        "worker-0": evictor.Result.SKIPPED, "worker-1": evictor.Result.SKIPPED, "launcher": evictor.Result.BLOCKED}
    assert standing(cluster, plain_namespace) == {"worker-0": True, "worker-1": True, "launcher": True}


# --- A victim turning busy while the API answers slowly (real Prometheus) --------------------------------------

AHEAD = 600  # DCGM history written up to this long after the measurement
BUSY_AFTER = 15  # the victim's second GPU reads 95 % from this long after the measurement
API_SECONDS = 8.0  # how long each API call takes, in the store's time


@pytest.fixture
def reclaimable_class(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    pc = kube.priority_class(RECLAIMABLE, value=1000)
    pc["metadata"]["annotations"] = {policy.MIN_PRIORITY: "1000", policy.TOLERATION: "0",
                                     policy.IDLE_SECONDS[0]: "600", policy.THRESHOLD[0]: str(THRESHOLD_PERCENT)}
    control_plane.apply([pc])
    yield RECLAIMABLE
    control_plane.kubectl("delete", "priorityclass", RECLAIMABLE, "--ignore-not-found", check=False)


class SlowApi:
    """The real eviction client; each call takes `API_SECONDS` of the store's time (the store moves on while the
    API answers: an API server answering in 8 s)."""

    def __init__(self, inner: evictor.ApiEvictionClient, store: list[float]) -> None:
        self._inner = inner
        self._store = store
        self.dry_run = False

    async def read(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        self._store[0] += API_SECONDS
        return await self._inner.read(namespace=namespace, name=name)

    async def evict(self, *, namespace: str, name: str, uid: str, resource_version: str | None = None,
                    dry_run: bool = False) -> None:
        self._store[0] += API_SECONDS
        await self._inner.evict(namespace=namespace, name=name, uid=uid, resource_version=resource_version,
                                dry_run=dry_run)


def history(view: kube.GpuView, pod: snapshot.Pod, *, busy: bool) -> list[prom.Series]:
    """DCGM samples of `pod`'s GPUs (indices as the device stand-in gives them) every 15 s, 2 h before the
    measurement to AHEAD s after it: 1 %, its second GPU at 95 % from BUSY_AFTER s after it when `busy`."""
    series = []
    for k, index in enumerate(view.indices(pod)):
        samples = [(float(AHEAD - after), 95.0 if busy and k == 1 and after >= BUSY_AFTER else 1.0)
                   for after in range(-7200, AHEAD + 1, 15)]
        labels = {"gpu": str(index), "UUID": f"GPU-{pod.node_name}-{index}", "Hostname": pod.node_name or "",
                  "namespace": pod.namespace, "pod": pod.name, "container": "main"}
        series.append(prom.Series("DCGM_FI_DEV_GPU_UTIL", labels, samples))
    return series


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("busy", "result"),
    [
        pytest.param(True, evictor.Result.NOT_IDLE, id="why-turned-busy-while-the-api-was-slow-not-evicted"),
        pytest.param(False, evictor.Result.EVICTED, id="still-idle-evicted"),
    ],
)
async def test_a_victim_turning_busy_while_the_api_is_slow_is_not_evicted(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, kube_api: client.ApiClient, reclaimable_class: str,
    prometheus_factory: prom.StartPrometheus, busy: bool, result: evictor.Result,
) -> None:
    """Mode `always` (no pending pod needed): the loop measures the pod idle at the store's time T, then each API
    call (live read, dry run) takes 8 s of the store's time; from T + 15 s its second GPU reads 95 %."""
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    start(cluster, plain_namespace, [kube.pod("idle", namespace=plain_namespace, gpus=2,
                                              priority_class=reclaimable_class)])
    view = kube.GpuView.of(cluster, names=NAMES)
    pod = view.state.pods[f"{plain_namespace}/idle"]
    measured_at = float((int(time.time()) // 300 + 3) * 300)  # on the part grid, > 600 s after it was scheduled
    server = prometheus_factory(history(view, pod, busy=busy), now=measured_at + AHEAD)
    store = [measured_at]
    config = settings_loader.load(overrides={
        "prometheus": {"url": server.url},
        "descheduler": {"reclaim": {"mode": "always", "conventions": {"evict_bare_pods": True}},
                        "leader_election": {"lease_namespace": plain_namespace}},  # its cooldowns, no other test's
    })
    dcgm = prom.StoreAt(prometheus.Client(config.prometheus), store)
    loop = reclaim_loop.ReclaimLoop(
        config=config, cluster=source.StaticSource(view.state), prometheus=dcgm,
        evictions=SlowApi(evictor.ApiEvictionClient(kube_api, timeout_seconds=10), store), api=kube_api,
        clock=lambda: store[0])
    cycle = await loop.cycle()
    assert [(o.eviction.pod, o.result) for o in cycle.outcomes] == [(pod.key, result)], cycle.plan.spared
    [(asked_at, _)] = [(at, q) for at, q in dcgm.asked if utilisation_promql.RECHECK in q]
    assert asked_at >= measured_at + BUSY_AFTER  # the store moved on while the API answered
    if busy:
        assert standing(cluster, plain_namespace) == {"idle": True}
        [told] = kube.poll("EvictionSkipped", lambda: kube.events_about(cluster, plain_namespace, "idle",
                                                                        reason=reclaim_loop.SKIPPED))
        assert told["message"].startswith("Not evicted: not idle right before its eviction: re-check: busy again")
    else:
        kube.poll("idle evicted", lambda: "idle" not in kube.pods(cluster, plain_namespace))
