"""Evictions, Events, cooldowns and the leader Lease against a fake API server (aiohttp) that answers
with the real status codes: 201 evicted, 429 PDB, 404 gone, 409 conflict / UID precondition, 500."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from common import events, settings, settings_loader, snapshot, source
from descheduler import cooldowns, evictor, leader, reclaim, reclaim_loop
from tests import builders

NOW = 1_800_000_000.0
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


@dataclasses.dataclass
class FakeApi:
    policy_versions: list[str] = dataclasses.field(default_factory=lambda: ["v1", "v1beta1"])
    eviction_status: dict[str, int] = dataclasses.field(default_factory=dict)  # pod name -> status
    evictions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    leases: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    version: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/apis/policy", self.discovery)
        app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/eviction", self.evict)
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

    async def evict(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.evictions.append({"path": request.path, **body})
        code = self.eviction_status.get(request.match_info["name"], 201)
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


def eviction(name: str, *, node: str = "n1", unit: str | None = None, namespace: str = "team-a") -> reclaim.Eviction:
    return reclaim.Eviction(
        pod=f"{namespace}/{name}", uid=f"uid-{name}", node=node, unit=unit or f"{namespace}/{name}",
        preemptor="team-b/want", preemptor_priority=10000, utilization=2.1, threshold=10.0, window_seconds=3600,
        workload=None, reason="GPU utilisation 2.1% < 10% over 3600s; reclaimed for team-b/want (priority 10000)",
    )


CONFIG = settings_loader.load()


@pytest.mark.parametrize(
    ("status", "result", "detail"),
    [
        pytest.param(201, evictor.Result.EVICTED, "reclaimed for team-b/want", id="201-evicted"),
        pytest.param(429, evictor.Result.BLOCKED, "a PodDisruptionBudget blocks the eviction", id="429-pdb"),
        pytest.param(404, evictor.Result.GONE, "already gone", id="404-gone"),
        pytest.param(409, evictor.Result.GONE, "the pod was replaced (UID precondition failed)", id="409-uid"),
        pytest.param(500, evictor.Result.FAILED, "retried after 60s", id="500-failed"),
    ],
)
async def test_status_codes(
    fake: tuple[FakeApi, client.ApiClient], status: int, result: evictor.Result, detail: str
) -> None:
    api, api_client = fake
    api.eviction_status["p"] = status
    the_evictor = evictor.Evictor(evictor.ApiEvictionClient(api_client, timeout_seconds=5),
                                  config=CONFIG.descheduler.reclaim)
    [outcome] = await the_evictor.evict_plan([eviction("p")], now=NOW)
    assert outcome.result is result
    assert detail in outcome.detail
    assert api.evictions == [{
        "path": "/api/v1/namespaces/team-a/pods/p/eviction", "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "p", "namespace": "team-a"}, "deleteOptions": {"preconditions": {"uid": "uid-p"}},
    }]


async def test_failure_backs_off_before_calling_again(fake: tuple[FakeApi, client.ApiClient]) -> None:
    api, api_client = fake
    api.eviction_status["p"] = 500
    the_evictor = evictor.Evictor(evictor.ApiEvictionClient(api_client, timeout_seconds=5),
                                  config=CONFIG.descheduler.reclaim)
    await the_evictor.evict_plan([eviction("p")], now=NOW)
    [again] = await the_evictor.evict_plan([eviction("p")], now=NOW + 30)
    assert (again.result, again.detail) == (evictor.Result.BACKOFF, "1 failed attempt(s); next try in 30s")
    api.eviction_status["p"] = 201
    [later] = await the_evictor.evict_plan([eviction("p")], now=NOW + 61)
    assert later.result is evictor.Result.EVICTED
    assert len(api.evictions) == 2


async def test_v1beta1_when_discovery_lacks_v1(fake: tuple[FakeApi, client.ApiClient]) -> None:
    api, api_client = fake
    api.policy_versions = ["v1beta1"]
    the_evictor = evictor.Evictor(evictor.ApiEvictionClient(api_client, timeout_seconds=5),
                                  config=CONFIG.descheduler.reclaim)
    await the_evictor.evict_plan([eviction("p")], now=NOW)
    assert [e["apiVersion"] for e in api.evictions] == ["policy/v1beta1"]


async def test_limits_checked_before_any_call_and_gangs_stop_together(
    fake: tuple[FakeApi, client.ApiClient],
) -> None:
    api, api_client = fake
    api.eviction_status["g-0"] = 429
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"limits": {"per_node": 1}}}})
    the_evictor = evictor.Evictor(evictor.ApiEvictionClient(api_client, timeout_seconds=5),
                                  config=config.descheduler.reclaim)
    plan = [eviction("a"), eviction("b"), eviction("g-0", node="n2", unit="gang:team-a/g"),
            eviction("g-1", node="n3", unit="gang:team-a/g")]
    outcomes = await the_evictor.evict_plan(plan, now=NOW)
    assert [(o.eviction.pod, o.result, o.detail) for o in outcomes][1:] == [
        ("team-a/b", evictor.Result.LIMITED, "per-node limit of 1 eviction decisions reached on n1"),
        ("team-a/g-0", evictor.Result.BLOCKED,
         "a PodDisruptionBudget blocks the eviction: HTTP 429: Cannot evict pod as it would violate the pod's "
         "disruption budget."),
        ("team-a/g-1", evictor.Result.SKIPPED, "gang member team-a/g-0 was not evicted"),
    ]
    assert [e["metadata"]["name"] for e in api.evictions] == ["a", "g-0"]


async def test_a_gang_is_one_decision_for_the_limits(fake: tuple[FakeApi, client.ApiClient]) -> None:
    """Charging pod by pod, a limit of 1 would stop a gang after its first member: a split gang."""
    _, api_client = fake
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"limits": {"per_node": 1, "per_cycle": 1}}}})
    the_evictor = evictor.Evictor(evictor.ApiEvictionClient(api_client, timeout_seconds=5),
                                  config=config.descheduler.reclaim)
    gang = [eviction(f"g-{i}", unit="gang:team-a/g") for i in range(4)]
    outcomes = await the_evictor.evict_plan([*gang, eviction("a")], now=NOW)
    assert [(o.eviction.pod, o.result) for o in outcomes] == [
        *((f"team-a/g-{i}", evictor.Result.EVICTED) for i in range(4)), ("team-a/a", evictor.Result.LIMITED)]
    assert outcomes[-1].detail == "per-cycle limit of 1 eviction decisions reached"


def _cluster(config: settings.Settings) -> source.StaticSource:
    p = "reclaim-idle-resource.scheduling.x-k8s.io/"

    def running(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName="batch", priority=1000)
        body["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "nb", "controller": True}]

    def unschedulable(body: dict[str, Any]) -> None:
        body["spec"]["priority"] = 10000
        body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]

    cluster = snapshot.build(
        nodes=[builders.gpu_node("n1", gpus=1)],
        pods=[builders.pod("idle", namespace="team-a", gpus=1, node="n1", phase="Running", mutate=running,
                           created="2020-01-01T00:00:00Z"),
              builders.pod("want", namespace="team-b", gpus=1, mutate=unschedulable)],
        priority_classes=[
            builders.priority_class("batch", 1000, annotations={f"{p}resource-idle-seconds": "3600"}),
            builders.priority_class("broken", 1, annotations={f"{p}resource-idle-seconds": "soon"}),
        ],
        names=config.names, taken_at=NOW,
    )
    return source.StaticSource(cluster)


class IdleFor:
    """A Prometheus stand-in answering as DCGM would for one idle pod (the real one is in
    test_reclaim_prometheus.py); here the API side is under test."""

    async def query(self, promql: str, *, time: float | None = None) -> list[dict[str, Any]]:
        stats = {"util": 1.0, "samples": 60.0, "devices": 1.0, "valid": 1.0, "last": NOW - 10, "lag": -1.0, "gap": 1.0}
        return [{"metric": {"gs_namespace": "team-a", "gs_pod": "idle", "gs_host": "n1", "gs_stat": f"gpu_{k}"},
                 "value": [NOW, str(v)]} for k, v in stats.items()]


@pytest.mark.parametrize("dry_run", [pytest.param(False, id="real"), pytest.param(True, id="dry-run")])
async def test_cycle_evicts_posts_events_and_persists_cooldowns(
    fake: tuple[FakeApi, client.ApiClient], dry_run: bool
) -> None:
    api, api_client = fake
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"dry_run": dry_run}}})
    client_ = evictor.DryRunClient() if dry_run else evictor.ApiEvictionClient(api_client, timeout_seconds=5)
    loop = reclaim_loop.ReclaimLoop(config=config, cluster=_cluster(config), prometheus=IdleFor(),
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
        again = reclaim_loop.ReclaimLoop(config=config, cluster=_cluster(config), prometheus=IdleFor(),
                                         evictions=client_, api=api_client, clock=lambda: NOW + 5)
        second = await again.cycle()
        assert second.plan.evictions == ()
        assert {s.pod: s.reason for s in second.plan.spared}["team-a/idle"] == "workload cooldown for 895s more"
        assert sum(e["reason"] == "ReclaimPolicyInvalid" for e in api.events) == 2  # once per process


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

