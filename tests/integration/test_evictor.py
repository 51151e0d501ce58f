"""Evictions, Events, cooldowns and the leader Lease against a fake API server (aiohttp) that answers
with the real status codes: 201 evicted, 429 PDB, 404 gone, 409 conflict / UID precondition, 500, to real
evictions and to their server-side dry runs (`?dryRun=All`) alike; pods are read live before their eviction (GET),
as the API server has them. That the real API server answers a dry run as it would the eviction is proven in
tests/e2e/test_reclaim_transaction_e2e.py."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import prometheus_client
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from common import events, prometheus, settings, settings_loader, snapshot, snapshot_build, source
from descheduler import cooldowns, evictor, leader, reclaim
from descheduler.reclaim import idle_history, utilisation_promql
from descheduler.reclaim import loop as reclaim_loop
from tests import builders
from tests.support.prometheus import DcgmStandIn, PrometheusServer, Series, StartPrometheus, StoreAt
from tests.support.slowproxy import SlowProxy

NOW = 1_800_000_000.0
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


@dataclasses.dataclass
class FakeApi:
    policy_versions: list[str] = dataclasses.field(default_factory=lambda: ["v1", "v1beta1"])
    eviction_status: dict[str, int] = dataclasses.field(default_factory=dict)  # pod name -> status
    evictions: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # real ones
    dry_runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # ?dryRun=All: judged, nothing evicted
    real_status: dict[str, int] = dataclasses.field(default_factory=dict)  # pod name -> status of the real call only
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    leases: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    version: int = 0
    pods: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # name -> live pod (default: `live`)
    reads: list[str] = dataclasses.field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/apis/policy", self.discovery)
        app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/eviction", self.evict)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}", self.get_pod)
        app.router.add_post("/api/v1/namespaces/{namespace}/events", self.event)
        app.router.add_get(LEASES + "/{name}", self.get_lease)
        app.router.add_post(LEASES, self.create_lease)
        app.router.add_put(LEASES + "/{name}", self.replace_lease)
        return app

    @staticmethod
    def status(code: int, reason: str, message: str) -> web.Response:
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                                  "message": message, "code": code}, status=code)

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroup", "name": "policy", "versions": [
            {"groupVersion": f"policy/{v}", "version": v} for v in self.policy_versions]})

    async def get_pod(self, request: web.Request) -> web.Response:
        name, namespace = request.match_info["name"], request.match_info["namespace"]
        self.reads.append(name)
        pod = self.pods.get(name, live(name, namespace=namespace))
        if pod.get("gone"):
            return self.status(404, "NotFound", f'pods "{name}" not found')
        return web.json_response(pod)

    async def evict(self, request: web.Request) -> web.Response:
        body = await request.json()
        dry = request.query.get("dryRun") == "All"
        (self.dry_runs if dry else self.evictions).append({"path": request.path, **body})
        name = request.match_info["name"]
        code = self.eviction_status.get(name, 201) if dry else self.real_status.get(
            name, self.eviction_status.get(name, 201))
        if code == 429:
            return self.status(429, "TooManyRequests",
                               "Cannot evict pod as it would violate the pod's disruption budget.")
        if code == 404:
            return self.status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        if code == 409:
            return self.status(409, "Conflict", "Precondition failed: UID in precondition: x, UID in object: y")
        if code != 201:
            return self.status(code, "InternalError", "etcdserver: request timed out")
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201},
                                 status=201)

    async def event(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.events.append(body)
        return web.json_response(body, status=201)

    async def get_lease(self, request: web.Request) -> web.Response:
        lease = self.leases.get(request.match_info["name"])
        if lease is None:
            return self.status(404, "NotFound", "leases not found")
        return web.json_response(lease)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.leases[body["metadata"]["name"]] = body
        return body

    async def create_lease(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["metadata"]["name"] in self.leases:
            return self.status(409, "AlreadyExists", "leases already exists")
        return web.json_response(self._store(body), status=201)

    async def replace_lease(self, request: web.Request) -> web.Response:
        body = await request.json()
        current = self.leases.get(request.match_info["name"])
        if current is None:
            return self.status(404, "NotFound", "leases not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return self.status(409, "Conflict", "the object has been modified")
        return web.json_response(self._store(body))


def live(name: str, *, namespace: str = "team-a", annotations: dict[str, str] | None = None,
         uid: str | None = None) -> dict[str, Any]:
    """The pod as the API server has it: running, owned by a Job, resourceVersion 7."""
    def mutate(body: dict[str, Any]) -> None:
        body["metadata"].update(resourceVersion="7", uid=uid or f"uid-{name}",
                                ownerReferences=[{"kind": "Job", "name": name, "controller": True}])

    return builders.pod(name, namespace=namespace, gpus=1, node="n1", phase="Running", annotations=annotations,
                        mutate=mutate)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    api = FakeApi()
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    api_client = client.ApiClient(configuration)
    try:
        yield api, api_client
    finally:
        await api_client.close()
        await runner.cleanup()


def eviction(name: str, *, node: str = "n1", unit: str | None = None, namespace: str = "team-a",
             preemptor: str = "team-b/want") -> reclaim.Eviction:
    return reclaim.Eviction(
        pod=f"{namespace}/{name}", uid=f"uid-{name}", node=node, unit=unit or f"{namespace}/{name}",
        preemptor=preemptor, utilization=2.1, threshold=10.0, window_seconds=3600,
        workload=None, reason="GPU utilisation 2.1% < 10% over 3600s; reclaimed for team-b/want (priority 10000)",
    )


CONFIG = settings_loader.load()


def api_evictor(api_client: client.ApiClient, config: settings.Settings = CONFIG) -> evictor.Evictor:
    return evictor.Evictor(evictor.ApiEvictionClient(api_client, timeout_seconds=5),
                           config=config.descheduler.reclaim, names=config.names)


@pytest.mark.parametrize(
    ("status", "result", "detail"),
    [
        pytest.param(201, evictor.Result.EVICTED, "reclaimed for team-b/want", id="201-evicted"),
        pytest.param(429, evictor.Result.BLOCKED, "a PodDisruptionBudget blocks the eviction", id="429-pdb"),
        pytest.param(404, evictor.Result.GONE, "already gone", id="404-gone"),
        pytest.param(409, evictor.Result.CHANGED, "the pod changed or was replaced since it was read (precondition "
                     "failed)", id="409-precondition"),
        pytest.param(500, evictor.Result.FAILED, "retried after 60s", id="500-failed"),
    ],
)
async def test_status_codes(
    fake: tuple[FakeApi, client.ApiClient], status: int, result: evictor.Result, detail: str
) -> None:
    """Each answer, to the server-side dry run that comes first: only a dry run that passes is followed by the
    real eviction (the same body, preconditions included)."""
    api, api_client = fake
    api.eviction_status["p"] = status
    the_evictor = api_evictor(api_client)
    [outcome] = await the_evictor.evict_plan([eviction("p")], now=NOW)
    assert outcome.result is result
    assert detail in outcome.detail
    body = {
        "path": "/api/v1/namespaces/team-a/pods/p/eviction", "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "p", "namespace": "team-a"},
        "deleteOptions": {"preconditions": {"uid": "uid-p", "resourceVersion": "7"}},
    }
    assert api.dry_runs == [body]
    assert api.evictions == ([body] if status == 201 else [])
    assert api.reads == ["p"]


async def test_failure_backs_off_before_calling_again(fake: tuple[FakeApi, client.ApiClient]) -> None:
    api, api_client = fake
    api.eviction_status["p"] = 500
    the_evictor = api_evictor(api_client)
    await the_evictor.evict_plan([eviction("p")], now=NOW)
    [again] = await the_evictor.evict_plan([eviction("p")], now=NOW + 30)
    assert (again.result, again.detail) == (evictor.Result.BACKOFF, "1 failed attempt(s); next try in 30s")
    api.eviction_status["p"] = 201
    [later] = await the_evictor.evict_plan([eviction("p")], now=NOW + 61)
    assert later.result is evictor.Result.EVICTED
    assert (len(api.dry_runs), len(api.evictions)) == (2, 1)


async def test_v1beta1_when_discovery_lacks_v1(fake: tuple[FakeApi, client.ApiClient]) -> None:
    api, api_client = fake
    api.policy_versions = ["v1beta1"]
    the_evictor = api_evictor(api_client)
    await the_evictor.evict_plan([eviction("p")], now=NOW)
    assert [e["apiVersion"] for e in api.evictions] == ["policy/v1beta1"]


async def test_limits_checked_before_any_call_and_gangs_stop_together(
    fake: tuple[FakeApi, client.ApiClient],
) -> None:
    api, api_client = fake
    api.eviction_status["g-0"] = 429
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"limits": {"per_node": 1}}}})
    the_evictor = api_evictor(api_client, config)
    plan = [eviction("a", preemptor="team-b/w1"), eviction("b", preemptor="team-b/w2"),
            eviction("g-0", node="n2", unit="gang:team-a/g", preemptor="team-b/w3"),
            eviction("g-1", node="n3", unit="gang:team-a/g", preemptor="team-b/w3")]
    outcomes = await the_evictor.evict_plan(plan, now=NOW)
    assert [(o.eviction.pod, o.result, o.detail) for o in outcomes][1:] == [
        ("team-a/b", evictor.Result.LIMITED, "per-node limit of 1 eviction decisions reached on n1"),
        ("team-a/g-0", evictor.Result.BLOCKED,
         "in the server-side dry run, a PodDisruptionBudget blocks the eviction: HTTP 429: Cannot evict pod as it "
         "would violate the pod's disruption budget."),
        ("team-a/g-1", evictor.Result.SKIPPED, "gang member team-a/g-0 was not evicted: none of its victims evicted"),
    ]
    assert [e["metadata"]["name"] for e in api.dry_runs] == ["a", "g-0"]
    assert [e["metadata"]["name"] for e in api.evictions] == ["a"]


async def test_a_gang_is_one_decision_for_the_limits(fake: tuple[FakeApi, client.ApiClient]) -> None:
    """Charging pod by pod, a limit of 1 would stop a gang after its first member: a split gang."""
    _, api_client = fake
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"limits": {"per_node": 1, "per_cycle": 1}}}})
    the_evictor = api_evictor(api_client, config)
    gang = [eviction(f"g-{i}", unit="gang:team-a/g") for i in range(4)]
    outcomes = await the_evictor.evict_plan([*gang, eviction("a", preemptor="team-b/other")], now=NOW)
    assert [(o.eviction.pod, o.result) for o in outcomes] == [
        *((f"team-a/g-{i}", evictor.Result.EVICTED) for i in range(4)), ("team-a/a", evictor.Result.LIMITED)]
    assert outcomes[-1].detail == "per-cycle limit of 1 eviction decisions reached"


def _cluster(config: settings.Settings, *, learning: str | None = None, gpus: int = 1,
             window: int = 3600) -> source.StaticSource:
    """An idle pod of `gpus` GPUs filling its node, a pending pod of as many, its class idle after `window` s.
    `learning`: the batch class's learned-idle-window annotation (None: absent)."""
    p = "reclaim-idle-resource.scheduling.x-k8s.io/"
    batch = {f"{p}resource-idle-seconds": str(window)}
    if learning is not None:
        batch[config.names.learned_idle_window] = learning

    def running(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName="batch", priority=1000)
        body["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "nb", "controller": True}]

    def unschedulable(body: dict[str, Any]) -> None:
        body["spec"]["priority"] = 10000
        body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]

    cluster = snapshot_build.build(
        nodes=[builders.gpu_node("n1", gpus=gpus)],
        pods=[builders.pod("idle", namespace="team-a", gpus=gpus, node="n1", phase="Running", mutate=running,
                           created="2020-01-01T00:00:00Z"),
              builders.pod("want", namespace="team-b", gpus=gpus, mutate=unschedulable)],
        priority_classes=[
            builders.priority_class("batch", 1000, annotations=batch),
            builders.priority_class("broken", 1, annotations={f"{p}resource-idle-seconds": "soon"}),
        ],
        names=config.names, taken_at=NOW,
    )
    return source.StaticSource(cluster)


def idle_pod() -> DcgmStandIn:
    """A Prometheus stand-in answering as DCGM would for one idle pod (the real one is in
    test_reclaim_prometheus.py); here the API side is under test."""
    return DcgmStandIn({("team-a", "idle", "n1"): 1.0}, now=NOW)


@pytest.mark.parametrize("dry_run", [pytest.param(False, id="real"), pytest.param(True, id="dry-run")])
async def test_cycle_evicts_posts_events_and_persists_cooldowns(
    fake: tuple[FakeApi, client.ApiClient], dry_run: bool
) -> None:
    api, api_client = fake
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"dry_run": dry_run}}})
    client_ = evictor.DryRunClient() if dry_run else evictor.ApiEvictionClient(api_client, timeout_seconds=5)
    loop = reclaim_loop.ReclaimLoop(config=config, cluster=_cluster(config), prometheus=idle_pod(),
                                    evictions=client_, api=api_client, clock=lambda: NOW)
    cycle = await loop.cycle()
    assert [(o.eviction.pod, o.result.value) for o in cycle.outcomes] == [
        ("team-a/idle", "would-evict" if dry_run else "evicted")]
    assert len(api.evictions) == (0 if dry_run else 1)
    told = {(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["type"], e["reason"]): e["message"]
            for e in api.events}
    verb = "Would evict (dry-run)" if dry_run else "Evicted"
    assert told == {
        ("PriorityClass", "broken", "Warning", "ReclaimPolicyInvalid"):
            f"PriorityClass broken not reclaimable: {p_key('resource-idle-seconds')}='soon' is not an integer",
        ("Pod", "idle", "Normal", "IdleGPUReclaimWouldEvict" if dry_run else "IdleGPUReclaimed"):
            f"{verb}: peak GPU utilisation 1.0% < 5% over 3600s; reclaimed for team-b/want (priority 10000)",
        ("Pod", "want", "Normal", "GPUReclaimTriggered"):
            f"{verb} 1 idle GPU pod(s) for this pod (priority 10000): team-a/idle",
    }
    stored = cooldowns.decode(
        (api.leases.get("gpu-steward-reclaim-cooldowns") or {}).get("metadata", {}).get("annotations", {})
        .get(config.names.cooldown))[0]
    if dry_run:
        assert stored.until == {}  # a dry-run writes nothing
    else:
        assert stored.until == {"preemptor:team-b/want": NOW + 180, "node:n1": NOW + 300,
                                "workload:team-a/Job/nb": NOW + 900}
        # A new leader (a fresh loop) reads them back: the same pod is not hit again.
        again = reclaim_loop.ReclaimLoop(config=config, cluster=_cluster(config), prometheus=idle_pod(),
                                         evictions=client_, api=api_client, clock=lambda: NOW + 5)
        second = await again.cycle()
        assert second.plan.evictions == ()
        assert {s.pod: s.reason for s in second.plan.spared}["team-a/idle"] == "workload cooldown for 895s more"
        assert sum(e["reason"] == "ReclaimPolicyInvalid" for e in api.events) == 2  # once per process


BATCH_PROBLEM = ("PriorityClass batch: gpu-steward.io/learned-idle-window={!r} is not true/false; learned idle "
                 "windows off")


@pytest.mark.parametrize(
    ("learning", "on", "problem"),
    [
        pytest.param(None, False, None, id="absent-off"),
        pytest.param("false", False, None, id="false-off"),
        pytest.param("maybe", False, BATCH_PROBLEM.format("maybe"), id="unreadable-off-said-and-counted"),
        pytest.param("1.0", False, BATCH_PROBLEM.format("1.0"), id="unreadable-number-off-said-and-counted"),
        # The one flag parser's spellings of true (common/label_values.py), as for every gpu-steward flag.
        pytest.param("TRUE", True, None, id="upper-case-true-on"),
        pytest.param("yes", True, None, id="yes-on"),
        pytest.param("", True, None, id="empty-present-means-on"),
    ],
)
async def test_the_learned_window_opt_in_off_is_the_fixed_window_cycle_exactly(
    fake: tuple[FakeApi, client.ApiClient], learning: str | None, on: bool, problem: str | None
) -> None:
    """Off (absent, false or unreadable): the same cycle, the same queries, as with no learner at all (the code
    before learned windows). Unreadable: also one Warning Event on the class and its count per class. On: the
    history is read (7 d, 30 min a cycle: not read yet in the first, so the tier window, said)."""
    api, api_client = fake
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"dry_run": True}}})
    registry = prometheus_client.CollectorRegistry()
    dcgm = idle_pod()
    reclaim = reclaim_loop.ReclaimLoop(config=config, cluster=_cluster(config, learning=learning), prometheus=dcgm,
                                       evictions=evictor.DryRunClient(), api=api_client, clock=lambda: NOW,
                                       registry=registry)
    cycle = await reclaim.cycle()
    await reclaim.learner.settle()  # the history refresh it started beside the cycles
    await reclaim.cycle()  # reported once per process, counted every cycle
    await reclaim.learner.settle()

    async def no_learner(cluster: snapshot.Snapshot, screened: Any, **_: Any) -> tuple[dict[str, Any], dict[str, str]]:
        return dict(screened), {}

    before = idle_pod()
    previous = reclaim_loop.ReclaimLoop(config=config, cluster=_cluster(config, learning=learning), prometheus=before,
                                        evictions=evictor.DryRunClient(), api=None, clock=lambda: NOW)
    previous.learner.screen = no_learner  # type: ignore[method-assign]
    expected = await previous.cycle()
    history_queries = [q for q in dcgm.asked if q == idle_history.query(config=config.prometheus, step_seconds=300)]
    told = [e["message"] for e in api.events if e["reason"] == "ReclaimPolicyInvalid"
            and e["involvedObject"]["name"] == "batch"]
    assert told == ([problem] if problem else [])
    assert registry.get_sample_value("gpu_steward_reclaim_policy_problems", {"priority_class": "batch"}) == (
        1 if problem else None)
    assert registry.get_sample_value("gpu_steward_reclaim_policy_problems", {"priority_class": "broken"}) == 1
    [eviction] = cycle.plan.evictions
    if on:
        assert len(history_queries) == 2  # one chunk a cycle, read beside it
        assert eviction.reason == ("peak GPU utilisation 1.0% < 5% over 3600s; history not read (yet): tier window; "
                                   "reclaimed for team-b/want (priority 10000)")
        # ... and so is the dry-run eviction Event on the pod
        assert [e["message"] for e in api.events if e["reason"] == "IdleGPUReclaimWouldEvict"] == [
            f"Would evict (dry-run): {eviction.reason}"]  # once: the second cycle sees it leaving
    else:
        assert history_queries == []
        assert cycle.plan == expected.plan
        assert dcgm.asked[:len(before.asked)] == before.asked


def p_key(name: str) -> str:
    return f"reclaim-idle-resource.scheduling.x-k8s.io/{name}"


async def test_event_never_raises_when_the_server_refuses() -> None:
    configuration = client.Configuration(host="http://127.0.0.1:9")  # nothing listens on the discard port
    async with client.ApiClient(configuration) as api_client:
        ok = await events.post(api_client, regarding=events.ObjectRef.pod("a/b"), type="Normal", reason="R",
                               message="m", request_timeout=2)
    assert ok is False


async def test_lease_leader_election(fake: tuple[FakeApi, client.ApiClient]) -> None:
    api, api_client = fake
    clock = {"now": NOW}
    cfg = settings_loader.load(overrides={"descheduler": {"leader_election": {"lease_namespace": "gs"}}})
    first = leader.Elector(api_client, config=cfg, clock=lambda: clock["now"], wall=lambda: clock["now"])
    second = leader.Elector(api_client, config=cfg, clock=lambda: clock["now"], wall=lambda: clock["now"])
    assert await first.try_acquire() == (True, "the Lease has no holder")
    held, why = await second.try_acquire()
    assert (held, why) == (False, f"held by {first.identity} for 15s more")
    assert (await first.try_acquire())[0]  # renew
    clock["now"] += 16  # the holder stopped renewing
    assert await second.try_acquire() == (True, f"holder {first.identity} has not renewed the Lease for 16s")
    lease = api.leases["gpu-steward-descheduler"]["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == (second.identity, 1)
    await second.release()
    assert api.leases["gpu-steward-descheduler"]["spec"]["holderIdentity"] == ""
    assert (await first.try_acquire())[0]



# --- Evictions as a transaction, protections re-checked on the live pod (issue 21) --------------------------


@pytest.mark.parametrize(
    ("pod", "result", "detail", "called"),
    [
        # Why: the plan was made on a snapshot from before the pod opted out; it was evicted anyway.
        pytest.param(live("p", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
                     evictor.Result.PROTECTED,
                     'protected on the live pod: cluster-autoscaler.kubernetes.io/safe-to-evict: "false"', False,
                     id="why-opted-out-since-the-snapshot"),
        pytest.param(live("p", annotations={"gpu-steward.io/skip": "true"}), evictor.Result.PROTECTED,
                     "protected on the live pod: opted out by gpu-steward.io/skip='true'", False,
                     id="skip-annotation-since-the-snapshot"),
        pytest.param(live("p", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}),
                     evictor.Result.EVICTED, "reclaimed for team-b/want", True,
                     id="boundary-safe-to-evict-true-may-go"),
        pytest.param({**live("p"), "metadata": {**live("p")["metadata"], "deletionTimestamp": "2030-01-01T00:00:00Z"}},
                     evictor.Result.PROTECTED, "protected on the live pod: already terminating", False,
                     id="terminating-since-the-snapshot"),
        pytest.param(live("p", uid="uid-new"), evictor.Result.GONE,
                     "the pod was replaced (UID uid-new, judged uid-p)", False, id="replaced-under-the-same-name"),
        pytest.param({"gone": True}, evictor.Result.GONE, "already gone", False, id="deleted-since-the-snapshot"),
    ],
)
async def test_protections_are_checked_again_on_the_live_pod(
    fake: tuple[FakeApi, client.ApiClient], pod: dict[str, Any], result: evictor.Result, detail: str, called: bool
) -> None:
    api, api_client = fake
    api.pods["p"] = pod
    the_evictor = api_evictor(api_client)
    [outcome] = await the_evictor.evict_plan([eviction("p")], now=NOW)
    assert (outcome.result, api.reads) == (result, ["p"])
    assert detail in outcome.detail
    assert len(api.evictions) == (1 if called else 0)


@pytest.mark.parametrize(
    ("statuses", "real", "results", "calls", "partial", "detail"),
    [
        # Why (issue 29): a budget created since the plan refused the second victim after the first was evicted.
        pytest.param({"b": 429}, {}, [evictor.Result.SKIPPED, evictor.Result.BLOCKED], [], (),
                     "victim team-a/b of the same demand team-b/want was not evicted (its own checks passed): none "
                     "of its victims evicted", id="why-second-victim-refused-in-the-dry-run-none-evicted"),
        pytest.param({"a": 429}, {}, [evictor.Result.BLOCKED, evictor.Result.SKIPPED], [], (),
                     "victim team-a/a of the same demand team-b/want was not evicted: none of its victims evicted",
                     id="first-victim-refused-the-second-is-not-evicted"),
        pytest.param({"b": 500}, {}, [evictor.Result.SKIPPED, evictor.Result.FAILED], [], (),
                     "in the server-side dry run, HTTP 500", id="a-5xx-in-the-dry-run-evicts-none"),
        pytest.param({"b": 409}, {}, [evictor.Result.SKIPPED, evictor.Result.CHANGED], [], (),
                     "in the server-side dry run, the pod changed", id="a-409-in-the-dry-run-evicts-none"),
        pytest.param({"a": 404}, {}, [evictor.Result.GONE, evictor.Result.SKIPPED], [], (),
                     "victim team-a/a of the same demand team-b/want was not evicted: none of its victims evicted",
                     id="a-victim-gone-since-the-plan-evicts-none-the-next-cycle-plans-afresh"),
        pytest.param({}, {}, [evictor.Result.EVICTED, evictor.Result.EVICTED], ["a", "b"], (), "reclaimed for",
                     id="every-victim-evicted"),
        # A refusal that comes anyway after a passed dry run (a race): said as served in part.
        pytest.param({}, {"b": 429}, [evictor.Result.EVICTED, evictor.Result.BLOCKED], ["a", "b"], ("team-a/a",),
                     "1 victim(s) of team-b/want already evicted (team-a/a): it is served in part",
                     id="boundary-a-refusal-after-the-dry-run-is-said"),
    ],
)
async def test_a_demands_victims_go_all_or_none(
    fake: tuple[FakeApi, client.ApiClient], statuses: dict[str, int], real: dict[str, int],
    results: list[evictor.Result], calls: list[str], partial: tuple[str, ...], detail: str,
) -> None:
    api, api_client = fake
    api.eviction_status.update(statuses)
    api.real_status.update(real)
    the_evictor = api_evictor(api_client)
    outcomes = await the_evictor.evict_plan([eviction("a"), eviction("b", node="n2")], now=NOW)
    assert [o.result for o in outcomes] == results
    assert [e["metadata"]["name"] for e in api.evictions] == calls
    assert detail in " | ".join(o.detail for o in outcomes)
    assert outcomes[-1].partial == partial
    assert len(api.dry_runs) == (1 if "a" in statuses else 2)  # a refused first victim: the second is never asked


def gang(*, launcher_status: int = 201) -> list[reclaim.Eviction]:
    """A gang of two GPU workers and a GPU-less launcher, in plan order (GPU members first)."""
    workers = [eviction(f"worker-{i}", unit="gang:team-a/job") for i in range(2)]
    return [*workers, dataclasses.replace(eviction("launcher", unit="gang:team-a/job"), utilization=None,
                                          threshold=None, window_seconds=None)]


@pytest.mark.parametrize(
    ("statuses", "real", "calls", "results"),
    [
        # Why (issue 29): the launcher, evicted last, was refused and left the workers gone: the gang split.
        pytest.param({"launcher": 429}, {}, [], {"launcher": "blocked", "worker-0": "skipped", "worker-1": "skipped"},
                     id="why-launcher-refused-in-the-dry-run-workers-untouched"),
        pytest.param({}, {"launcher": 429}, ["launcher"],
                     {"launcher": "blocked", "worker-0": "skipped", "worker-1": "skipped"},
                     id="launcher-refused-after-its-dry-run-still-first-so-workers-untouched"),
        pytest.param({}, {}, ["launcher", "worker-0", "worker-1"],
                     {"launcher": "evicted", "worker-0": "evicted", "worker-1": "evicted"},
                     id="companions-go-first-then-workers-in-plan-order"),
    ],
)
async def test_a_gangs_companion_goes_first_and_its_refusal_leaves_the_workers(
    fake: tuple[FakeApi, client.ApiClient], statuses: dict[str, int], real: dict[str, int], calls: list[str],
    results: dict[str, str],
) -> None:
    api, api_client = fake
    api.eviction_status.update(statuses)
    api.real_status.update(real)
    outcomes = await api_evictor(api_client).evict_plan(gang(), now=NOW)
    assert [e["metadata"]["name"] for e in api.evictions] == calls
    assert {o.eviction.pod.split("/")[1]: o.result.value for o in outcomes} == results
    assert sorted(e["metadata"]["name"] for e in api.dry_runs) == ["launcher", "worker-0", "worker-1"]


def idle_pods(pods: dict[str, str]) -> DcgmStandIn:
    """DCGM as for `idle_pod`, for several idle pods of team-a on their nodes (name -> node)."""
    return DcgmStandIn({("team-a", name, node): 1.0 for name, node in pods.items()}, now=NOW)


def _two_candidates(config: settings.Settings, *, gpus: int = 1, nodes: int = 2,
                    idle: Sequence[str] = ("a", "b")) -> source.StaticSource:
    """Idle 1-GPU pods a and b (on n1 and n2, or all of `idle` on n1 when `nodes` is 1) and a pending pod `want`."""
    p = "reclaim-idle-resource.scheduling.x-k8s.io/"

    def running(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName="batch", priority=1000)
        body["metadata"]["ownerReferences"] = [{"kind": "Job", "name": body["metadata"]["name"], "controller": True}]

    def unschedulable(body: dict[str, Any]) -> None:
        body["spec"]["priority"] = 10000
        body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]

    where = {n: "n2" if nodes == 2 and n == "b" else "n1" for n in idle}
    cluster = snapshot_build.build(
        nodes=[builders.gpu_node(f"n{i + 1}", gpus=len(idle) // nodes) for i in range(nodes)],
        pods=[*(builders.pod(n, namespace="team-a", gpus=1, node=where[n], phase="Running", mutate=running,
                             created="2020-01-01T00:00:00Z") for n in idle),
              builders.pod("want", namespace="team-b", gpus=gpus, mutate=unschedulable)],
        priority_classes=[builders.priority_class("batch", 1000, annotations={f"{p}resource-idle-seconds": "3600"})],
        names=config.names, taken_at=NOW,
    )
    return source.StaticSource(cluster)


async def test_a_refused_victim_cools_down_and_the_next_candidate_is_tried_in_the_same_cycle(
    fake: tuple[FakeApi, client.ApiClient], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why: a victim a PodDisruptionBudget protects was picked every cycle; its equally idle neighbour never."""
    api, api_client = fake
    plans: list[reclaim.Plan] = []
    planner = reclaim.plan

    def counted(**kwargs: Any) -> reclaim.Plan:
        plans.append(planner(**kwargs))
        return plans[-1]

    monkeypatch.setattr(reclaim, "plan", counted)
    api.eviction_status["a"] = 429
    api.pods["b"] = live("b")
    config = settings_loader.load()
    clock = {"now": NOW}
    loop = reclaim_loop.ReclaimLoop(
        config=config, cluster=_two_candidates(config), prometheus=idle_pods({"a": "n1", "b": "n2"}),
        evictions=evictor.ApiEvictionClient(api_client, timeout_seconds=5), api=api_client,
        clock=lambda: clock["now"])
    cycle = await loop.cycle()
    assert [(o.eviction.pod, o.result) for o in cycle.outcomes] == [
        ("team-a/a", evictor.Result.BLOCKED), ("team-a/b", evictor.Result.EVICTED)]
    assert [e["metadata"]["name"] for e in api.dry_runs] == ["a", "b"]
    assert [e["metadata"]["name"] for e in api.evictions] == ["b"]
    assert [e.pod for p in cycle.replans for e in p.evictions] == ["team-a/b"]
    assert len(plans) == 2, "planned again once: no new refusal, no third plan"
    assert {s.pod: s.reason for s in cycle.replans[0].spared}["team-a/a"].startswith(
        "eviction refused earlier this cycle: in the server-side dry run, a PodDisruptionBudget blocks the eviction")
    stored = cooldowns.decode(api.leases["gpu-steward-reclaim-cooldowns"]["metadata"]["annotations"]
                              [config.names.cooldown])[0]
    assert stored.until["victim:team-a/a"] == NOW + 180
    # The next cycle (a new leader reading the Lease) does not try the refused pod again.
    clock["now"] = NOW + 60
    again = reclaim_loop.ReclaimLoop(
        config=config, cluster=_two_candidates(config), prometheus=idle_pods({"a": "n1", "b": "n2"}),
        evictions=evictor.ApiEvictionClient(api_client, timeout_seconds=5), api=api_client,
        clock=lambda: clock["now"])
    second = await again.cycle()
    assert {s.pod: s.reason for s in second.plan.spared}["team-a/a"] == "refused-eviction cooldown for 120s more"


def _two_victims_for_one_demand(api_client: client.ApiClient,
                                registry: prometheus_client.CollectorRegistry) -> reclaim_loop.ReclaimLoop:
    """A loop whose one demand (a 2-GPU pod) needs both idle victims a and b on n1, evicted through `api_client`."""
    config = settings_loader.load()
    return reclaim_loop.ReclaimLoop(
        config=config, cluster=_two_candidates(config, gpus=2, nodes=1), prometheus=idle_pods({"a": "n1", "b": "n1"}),
        evictions=evictor.ApiEvictionClient(api_client, timeout_seconds=5), api=api_client, clock=lambda: NOW,
        registry=registry)


async def test_a_demand_served_in_part_is_said_counted_and_not_repeated(
    fake: tuple[FakeApi, client.ApiClient],
) -> None:
    """Both victims on one node for a 2-GPU pod; the second is refused after the first went (both passed their dry
    runs: a budget created between the two real calls)."""
    api, api_client = fake
    api.real_status["b"] = 429
    registry = prometheus_client.CollectorRegistry()
    loop = _two_victims_for_one_demand(api_client, registry)
    cycle = await loop.cycle()
    assert [(o.eviction.pod, o.result, o.partial) for o in cycle.outcomes] == [
        ("team-a/a", evictor.Result.EVICTED, ()), ("team-a/b", evictor.Result.BLOCKED, ("team-a/a",))]
    assert cycle.replans == ()  # no other candidate: nothing more to try
    assert registry.get_sample_value("gpu_steward_reclaim_partial_demands_total") == 1
    warned = [e for e in api.events if e["reason"] == reclaim_loop.PARTIAL]
    assert [(e["involvedObject"]["name"], e["type"]) for e in warned] == [("want", "Warning")]
    assert warned[0]["message"].startswith("Served in part: team-a/b not evicted (a PodDisruptionBudget blocks")
    # Not repeated: the next cycle keeps a for the demand and does not hit b again.
    second = await loop.cycle()
    assert second.outcomes == ()
    assert {s.pod: s.reason for s in second.plan.spared} == {
        "team-a/a": "already leaving: evicted for team-b/want",
        "team-a/b": "refused-eviction cooldown for 180s more"}


async def test_a_budget_created_since_the_plan_refuses_the_dry_run_and_none_is_evicted(
    fake: tuple[FakeApi, client.ApiClient],
) -> None:
    """Why (issue 29): a 429 on the second victim (a budget created since the plan) left the first evicted for a
    pod that still cannot run. Both victims on one node for a 2-GPU pod; the second one's dry run is refused."""
    api, api_client = fake
    api.eviction_status["b"] = 429
    registry = prometheus_client.CollectorRegistry()
    loop = _two_victims_for_one_demand(api_client, registry)
    cycle = await loop.cycle()
    assert [(o.eviction.pod, o.result, o.partial) for o in cycle.outcomes] == [
        ("team-a/a", evictor.Result.SKIPPED, ()), ("team-a/b", evictor.Result.BLOCKED, ())]
    assert api.evictions == []
    assert registry.get_sample_value("gpu_steward_reclaim_partial_demands_total") == 0
    assert registry.get_sample_value("gpu_steward_reclaim_evictions_total",
                                     {"result": "skipped", "reason": "on-demand"}) == 1
    told = sorted((e["involvedObject"]["name"], e["reason"], e["message"]) for e in api.events
                  if e["involvedObject"]["kind"] == "Pod")
    assert told == [
        ("a", reclaim_loop.SKIPPED, "Not evicted: victim team-a/b of the same demand team-b/want was not evicted "
                                    "(its own checks passed): none of its victims evicted"),
        ("b", "EvictionBlocked", "Not evicted: in the server-side dry run, a PodDisruptionBudget blocks the eviction: "
                                 "HTTP 429: Cannot evict pod as it would violate the pod's disruption budget."),
    ]


async def test_a_victim_skipped_with_its_refused_transaction_may_go_in_the_next_plans(
    fake: tuple[FakeApi, client.ApiClient],
) -> None:
    """Three idle 1-GPU pods on one node, a pending 2-GPU pod: the plan takes a and b; b's dry run is refused, so
    a is skipped, not called. The plan made again without b takes a and c: both go together. (Had a counted as
    tried, c alone would have gone: a demand served in half.)"""
    api, api_client = fake
    api.eviction_status["b"] = 429
    config = settings_loader.load()
    loop = reclaim_loop.ReclaimLoop(
        config=config, cluster=_two_candidates(config, gpus=2, nodes=1, idle=("a", "b", "c")),
        prometheus=idle_pods({"a": "n1", "b": "n1", "c": "n1"}),
        evictions=evictor.ApiEvictionClient(api_client, timeout_seconds=5), api=api_client, clock=lambda: NOW)
    cycle = await loop.cycle()
    assert [(o.eviction.pod, o.result) for o in cycle.outcomes] == [
        ("team-a/a", evictor.Result.SKIPPED), ("team-a/b", evictor.Result.BLOCKED),
        ("team-a/a", evictor.Result.EVICTED), ("team-a/c", evictor.Result.EVICTED)]
    assert [e["metadata"]["name"] for e in api.evictions] == ["a", "c"]
    assert [o.partial for o in cycle.outcomes] == [(), (), (), ()]


async def test_a_victim_protected_since_the_snapshot_is_said_and_the_next_candidate_is_tried(
    fake: tuple[FakeApi, client.ApiClient],
) -> None:
    api, api_client = fake
    api.pods["a"] = live("a", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"})
    config = settings_loader.load()
    loop = reclaim_loop.ReclaimLoop(
        config=config, cluster=_two_candidates(config), prometheus=idle_pods({"a": "n1", "b": "n2"}),
        evictions=evictor.ApiEvictionClient(api_client, timeout_seconds=5), api=api_client, clock=lambda: NOW)
    cycle = await loop.cycle()
    assert [(o.eviction.pod, o.result) for o in cycle.outcomes] == [
        ("team-a/a", evictor.Result.PROTECTED), ("team-a/b", evictor.Result.EVICTED)]
    assert [e["metadata"]["name"] for e in api.evictions] == ["b"]
    skipped = [(e["involvedObject"]["name"], e["type"], e["message"]) for e in api.events
               if e["reason"] == reclaim_loop.SKIPPED]
    assert skipped == [("a", "Normal", 'Not evicted: protected on the live pod: '
                                       'cluster-autoscaler.kubernetes.io/safe-to-evict: "false"')]


# --- The re-check right before an eviction, against a real Prometheus, behind a slow API (issue 29) -------------


AHEAD = 600  # the history is written up to this many seconds after the measurement
BUSY_AFTER = 15.0  # seconds after the measurement, the victim's second GPU turns busy (the next sample)


def turning_busy(*, busy: bool) -> list[Series]:
    """A 2-GPU pod idle (1 %) for two hours up to the measurement; its second GPU at 95 % from BUSY_AFTER s later
    (when `busy`), sampled every 15 s up to 10 min after it."""
    def samples(index: int) -> list[tuple[float, float]]:  # (seconds before AHEAD s after the measurement, value)
        return [(float(AHEAD - after), 95.0 if busy and index == 1 and after >= BUSY_AFTER else 1.0)
                for after in range(-7200, AHEAD + 1, 15)]

    return [Series("DCGM_FI_DEV_GPU_UTIL", {"gpu": str(i), "UUID": f"GPU-n1-{i}", "Hostname": "n1",
                                            "namespace": "team-a", "pod": "idle", "container": "main"}, samples(i))
            for i in range(2)]


async def _behind_a_slow_api(api_client: client.ApiClient, server: PrometheusServer,
                             cluster: Callable[[settings.Settings], source.StaticSource], *, measured_at: float,
                             registry: prometheus_client.CollectorRegistry) -> tuple[reclaim_loop.Cycle, StoreAt]:
    """One cycle of a loop reading `server` at a store time that starts at `measured_at` and moves 8 s on with each
    API call (an API server answering in 8 s), evicting through that API."""
    store = [measured_at]
    config = settings_loader.load(overrides={"prometheus": {"url": server.url}})
    dcgm = StoreAt(prometheus.Client(config.prometheus), store)

    def slow(method: str, path: str) -> None:
        store[0] += 8.0

    async with SlowProxy(upstream=str(api_client.configuration.host), delay_seconds=0.05, on_request=slow) as proxy:
        async with client.ApiClient(client.Configuration(host=proxy.url)) as slow_api:
            loop = reclaim_loop.ReclaimLoop(
                config=config, cluster=cluster(config), prometheus=dcgm,
                evictions=evictor.ApiEvictionClient(slow_api, timeout_seconds=5), api=api_client,
                clock=lambda: store[0], registry=registry)
            return await loop.cycle(), dcgm


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("busy", "result", "evicted"),
    [
        # Why (issue 29): with an API answering in 8 s, a pod was evicted 18 s after it turned busy.
        pytest.param(True, evictor.Result.NOT_IDLE, [], id="why-turned-busy-while-the-api-was-slow-not-evicted"),
        pytest.param(False, evictor.Result.EVICTED, ["idle"], id="still-idle-evicted"),
    ],
)
async def test_a_victim_turning_busy_behind_a_slow_api_is_not_evicted(
    fake: tuple[FakeApi, client.ApiClient], prometheus_factory: StartPrometheus, busy: bool,
    result: evictor.Result, evicted: list[str],
) -> None:
    api, api_client = fake
    measured_at = float(int(time.time()) // 300 * 300)  # on the part grid, in the past
    registry = prometheus_client.CollectorRegistry()
    cycle, dcgm = await _behind_a_slow_api(api_client, prometheus_factory(turning_busy(busy=busy),
                                                                         now=measured_at + AHEAD),
                                           lambda config: _cluster(config, gpus=2, window=600),
                                           measured_at=measured_at, registry=registry)
    assert [(o.eviction.pod, o.result) for o in cycle.outcomes] == [("team-a/idle", result)]
    assert [e["metadata"]["name"] for e in api.evictions] == evicted
    rechecks = [(at, q) for at, q in dcgm.asked if utilisation_promql.RECHECK in q]
    assert len(rechecks) == 1 and rechecks[0][0] >= measured_at + BUSY_AFTER  # the store moved on meanwhile
    verdict = "not-idle" if busy else "idle"
    assert registry.get_sample_value("gpu_steward_reclaim_rechecks_total", {"verdict": verdict}) == 1
    skipped = [e["message"] for e in api.events if e["reason"] == reclaim_loop.SKIPPED]
    if busy:
        assert skipped == ["Not evicted: not idle right before its eviction: re-check: busy again, device GPU-n1-1 "
                           "reads 95.0% >= 5% at its newest sample"]
    else:
        assert skipped == []


def two_turning_busy(*, busy: bool) -> list[Series]:
    """Idle 1-GPU pods a (GPU 0) and b (GPU 1) on n1, as `turning_busy`: b's GPU at 95 % from BUSY_AFTER s after the
    measurement (when `busy`)."""
    def samples(busy_after: bool) -> list[tuple[float, float]]:
        return [(float(AHEAD - after), 95.0 if busy_after and after >= BUSY_AFTER else 1.0)
                for after in range(-7200, AHEAD + 1, 15)]

    return [Series("DCGM_FI_DEV_GPU_UTIL", {"gpu": str(i), "UUID": f"GPU-n1-{i}", "Hostname": "n1",
                                            "namespace": "team-a", "pod": name, "container": "main"},
                   samples(busy and name == "b"))
            for i, name in enumerate(("a", "b"))]


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("busy", "results", "evicted", "rechecked", "verdicts"),
    [
        # One query reads both victims after the last dry run: b turned busy meanwhile, so neither goes.
        pytest.param(True, [evictor.Result.SKIPPED, evictor.Result.NOT_IDLE], [], ['pod=~"a|b"'],
                     {"idle": 1, "not-idle": 1}, id="second-victim-turned-busy-one-query-none-evicted"),
        # Both idle: one query for both before the first eviction, then b alone again right before its own call.
        pytest.param(False, [evictor.Result.EVICTED, evictor.Result.EVICTED], ["a", "b"], ['pod=~"a|b"', 'pod="b"'],
                     {"idle": 3}, id="both-idle-one-query-then-each-later-call-read-again"),
    ],
)
async def test_a_demands_victims_are_rechecked_in_one_query_behind_a_slow_api(
    fake: tuple[FakeApi, client.ApiClient], prometheus_factory: StartPrometheus, busy: bool,
    results: list[evictor.Result], evicted: list[str], rechecked: list[str], verdicts: dict[str, int],
) -> None:
    """A 2-GPU pending pod needs both idle 1-GPU pods of n1: one transaction. Each API call takes 8 s of the store's
    time, so by the re-check (after two live reads and two dry runs) b's busy samples are in the store."""
    api, api_client = fake
    measured_at = float(int(time.time()) // 300 * 300)
    registry = prometheus_client.CollectorRegistry()
    cycle, dcgm = await _behind_a_slow_api(api_client, prometheus_factory(two_turning_busy(busy=busy),
                                                                         now=measured_at + AHEAD),
                                           lambda config: _two_candidates(config, gpus=2, nodes=1),
                                           measured_at=measured_at, registry=registry)
    assert [(o.eviction.pod, o.result) for o in cycle.outcomes] == [
        ("team-a/a", results[0]), ("team-a/b", results[1])]
    assert [e["metadata"]["name"] for e in api.evictions] == evicted
    rechecks = [q for _, q in dcgm.asked if utilisation_promql.RECHECK in q]
    assert [next(m for m in ('pod=~"a|b"', 'pod="a"', 'pod="b"') if m in q) for q in rechecks] == rechecked
    told = {v: registry.get_sample_value("gpu_steward_reclaim_rechecks_total", {"verdict": v})
            for v in ("idle", "not-idle", "failed")}
    assert {v: n for v, n in told.items() if n} == verdicts
