"""The gang controller against an API server: nominations, un-gating, outcomes, Events, resync, restart.

`FakeApiServer` is an aiohttp server speaking the few pod/event endpoints the controller uses, and
enforcing the pod-update rules kube-apiserver 1.36.3 applies to gated pods (ported from
`pkg/apis/core/validation/validation.go`: `validateOnlyDeletedSchedulingGates`,
`validateNodeAffinityMutation`, `validateNodeSelectorTermHasOnlyAdditions`), so a patch the real
server would refuse fails here too; its `pods/status` answers a merge patch whose resourceVersion is stale with a
conflict, as kube-apiserver does, and keeps everything but the status. It has no DELETE and no eviction route: the
controller never deletes, evicts or re-creates a pod. `create_gang`, `gang_pods` and `assert_all_or_nothing` take
only an API client: the real-apiserver e2e test can reuse them as they are.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import jsonpatch
import prometheus_client
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from common import dra, kube, settings, snapshot, snapshot_build, timestamps
from descheduler.release import controller, outcomes, planning
from tests import builders

NAMES = settings.Names()
GATE = NAMES.gate
KUEUE_GATE = "kueue.x-k8s.io/admission"
NAMESPACE = "team"
TIMEOUT = 10  # bound of every wait below (a hang fails the test instead of blocking it)
Json = dict[str, Any]


# --- helpers reusable against a real API server -------------------------------------------------


def gang_member(name: str, *, gang: str, size: int, gpus: int, namespace: str, gated: bool) -> Json:
    """A gang member pod as a user writes it; `gated=True` adds our gate (no webhook in front)."""
    labels = {NAMES.gang_name: gang, NAMES.gang_size: str(size)}
    pod = builders.pod(name, namespace=namespace, gpus=gpus, labels=labels)
    for field in ("uid", "creationTimestamp"):
        del pod["metadata"][field]  # the API server sets them
    del pod["status"]
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


async def create_gang(
    api: client.ApiClient,
    *,
    name: str = "train",
    size: int = 8,
    gpus: int = 1,
    namespace: str = NAMESPACE,
    gated: bool = True,
    request_timeout: float = TIMEOUT,
    members: int | None = None,
) -> list[Json]:
    """Create `members` (default: all `size`) members of gang `name`; returns them as the API server stored them."""
    created = []
    for i in range(size if members is None else members):
        body = gang_member(f"{name}-{i}", gang=name, size=size, gpus=gpus, namespace=namespace, gated=gated)
        created.append(
            await kube.request(
                api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=body, timeout_seconds=request_timeout
            )
        )
    return created


async def gang_pods(api: client.ApiClient, *, name: str = "train", namespace: str = NAMESPACE) -> list[Json]:
    listed = await kube.get(api, f"/api/v1/namespaces/{namespace}/pods", timeout_seconds=TIMEOUT)
    return sorted(
        (p for p in listed.get("items") or [] if (p["metadata"].get("labels") or {}).get(NAMES.gang_name) == name),
        key=lambda p: str(p["metadata"]["name"]),
    )


def gates_of(pod: Mapping[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def nominated(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("nominatedNodeName")


def assert_all_or_nothing(pods: Sequence[Mapping[str, Any]]) -> None:
    """Every member still gated by us, or none: never a partly released gang."""
    gated = [GATE in gates_of(p) for p in pods]
    assert all(gated) or not any(gated), f"partly released: {gated}"


# --- the fake API server -------------------------------------------------------------------------


def _gated_update_error(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """What kube-apiserver says about this pod update (only the rules that matter here), or None."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    old_gates, new_gates = gates_of(old), gates_of(new)
    if any(g not in old_gates for g in new_gates):
        return "spec.schedulingGates: only deletion is allowed"
    if old_gates:
        old_terms = _terms(old_spec)
        new_terms = _terms(new_spec)
        if old_terms:
            if len(new_terms) != len(old_terms):
                return "no additions/deletions to non-empty NodeSelectorTerms list are allowed"
            for was, now in zip(old_terms, new_terms, strict=True):
                if not _only_additions(was, now):
                    return "nodeSelectorTerms: only additions are allowed (no mutations or deletions)"
    else:
        if (old_spec.get("affinity") or {}) != (new_spec.get("affinity") or {}):
            return "spec: Forbidden: pod updates may not change fields other than ..."
    unchanged = {k: v for k, v in new_spec.items() if k not in ("affinity", "schedulingGates", "nodeSelector")}
    if unchanged != {k: v for k, v in old_spec.items() if k not in ("affinity", "schedulingGates", "nodeSelector")}:
        return "spec: Forbidden: pod updates may not change fields other than ..."
    return None


def _terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def _only_additions(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    fields = ("matchExpressions", "matchFields")
    if not any(old.get(f) for f in fields) and any(new.get(f) for f in fields):
        return False
    for field in fields:
        was, now = list(old.get(field) or []), list(new.get(field) or [])
        if was and now[: len(was)] != was:
            return False
    return True


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


class FakeApiServer:
    def __init__(self) -> None:
        self.pods: dict[str, Json] = {}  # namespace/name -> pod
        self.events: list[Json] = []
        self.patches: list[tuple[str, str]] = []  # (pod key, "nominate" | "ungate" | "pin" | "mark"), in order
        self.failing: set[tuple[str, str]] = set()  # (pod key, kind) answered with HTTP 500
        self.events_refused = False  # every Event answered with HTTP 500
        self.events_held = asyncio.Event()  # cleared: every Event's answer waits until it is set
        self.events_held.set()
        self.events_asked = 0  # Event requests received, answered or not
        self.changed: Callable[[], None] = lambda: None  # the feeder's notification
        self.touched = asyncio.Event()  # set on every write, for tests that wait for an outcome
        self._version = 0
        self.app = web.Application()
        self.app.router.add_post("/api/v1/namespaces/{ns}/pods", self._create)
        self.app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list)
        self.app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch)
        self.app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}/status", self._patch_status)
        self.app.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        self.pod_groups: dict[str, Json] = {}  # namespace/name -> PodGroup
        self.pod_group_refusal: int | None = None  # the status every PodGroup create is answered with (None: 201)
        self.app.router.add_post("/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", self._create_pod_group)
        self.app.router.add_get("/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups/{name}", self._pod_group)
        self.claims: dict[str, Json] = {}  # namespace/name -> ResourceClaim
        self.templates: dict[str, Json] = {}  # namespace/name -> ResourceClaimTemplate
        resource = "/apis/resource.k8s.io/v1/namespaces/{ns}"
        self.app.router.add_get(resource + "/resourceclaims/{name}", self._claim)
        self.app.router.add_get(resource + "/resourceclaimtemplates/{name}", self._template)
        self.app.router.add_post(resource + "/resourceclaims", self._create_claim)

    async def _claim(self, request: web.Request) -> web.Response:
        found = self.claims.get(f"{request.match_info['ns']}/{request.match_info['name']}")
        return web.json_response(found or {"kind": "Status", "code": 404}, status=200 if found else 404)

    async def _template(self, request: web.Request) -> web.Response:
        found = self.templates.get(f"{request.match_info['ns']}/{request.match_info['name']}")
        return web.json_response(found or {"kind": "Status", "code": 404}, status=200 if found else 404)

    async def _create_claim(self, request: web.Request) -> web.Response:
        """A claim's create; a server-side dry run (`dryRun=All`) stores nothing."""
        body = await request.json()
        key = f"{request.match_info['ns']}/{body['metadata']['name']}"
        dry = request.query.get("dryRun") == "All"
        self.patches.append((key, "claim-dry-run" if dry else "claim"))
        if key in self.claims:
            return web.json_response({"kind": "Status", "code": 409}, status=409)
        if not dry:
            self.claims[key] = body
        return web.json_response(body, status=201)

    async def _create_pod_group(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = f"{request.match_info['ns']}/{body['metadata']['name']}"
        self.patches.append((key, "pod-group"))
        if self.pod_group_refusal is not None or key in self.pod_groups:
            status = self.pod_group_refusal or 409
            return web.json_response({"kind": "Status", "code": status}, status=status)
        self.pod_groups[key] = body
        return web.json_response(body, status=201)

    async def _pod_group(self, request: web.Request) -> web.Response:
        return web.json_response(self.pod_groups[f"{request.match_info['ns']}/{request.match_info['name']}"])

    def _stamp(self, pod: Json) -> None:
        self._version += 1
        pod["metadata"]["resourceVersion"] = str(self._version)

    def put(self, pod: Json, *, notify: bool = True) -> None:
        meta = pod["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self._stamp(pod)
        self.pods[f"{meta['namespace']}/{meta['name']}"] = pod
        if notify:
            self.changed()

    async def _create(self, request: web.Request) -> web.Response:
        pod = await request.json()
        pod["metadata"]["namespace"] = request.match_info["ns"]
        self.put(pod)
        return web.json_response(pod, status=201)

    async def _list(self, request: web.Request) -> web.Response:
        items = [p for p in self.pods.values() if p["metadata"]["namespace"] == request.match_info["ns"]]
        return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": str(self._version)},
                                  "items": items})

    async def _patch(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        body = await request.json()
        if key not in self.pods:
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        old = self.pods[key]
        kind = _patch_kind(body)
        self.patches.append((key, kind))
        self.touched.set()
        if (key, kind) in self.failing:
            return web.json_response({"kind": "Status", "code": 500, "message": "injected"}, status=500)
        try:
            if request.content_type == "application/json-patch+json":
                new = jsonpatch.apply_patch(old, body)
            elif request.content_type == "application/merge-patch+json":
                new = _merge(old, body)
            else:
                return web.json_response({"kind": "Status", "code": 415}, status=415)
        except jsonpatch.JsonPatchException as exc:
            return web.json_response({"kind": "Status", "code": 422, "message": str(exc)}, status=422)
        error = _gated_update_error(old, new)
        if error:
            return web.json_response({"kind": "Status", "code": 422, "message": error}, status=422)
        self._stamp(new)
        self.pods[key] = new
        self.changed()
        return web.json_response(new)

    async def _patch_status(self, request: web.Request) -> web.Response:
        """`pods/status`: a merge patch; its resourceVersion, when given, must be the stored one (else 409); only the
        status is taken from it."""
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        body = await request.json()
        if key not in self.pods:
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        self.patches.append((key, "nominate"))
        self.touched.set()
        if (key, "nominate") in self.failing:
            return web.json_response({"kind": "Status", "code": 500, "message": "injected"}, status=500)
        if request.content_type != "application/merge-patch+json":
            return web.json_response({"kind": "Status", "code": 415}, status=415)
        old = self.pods[key]
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != old["metadata"]["resourceVersion"]:
            return web.json_response({"kind": "Status", "code": 409, "message": "the object has been modified"},
                                     status=409)
        new = copy.deepcopy(old)
        new["status"] = _merge(old.get("status") or {}, body.get("status") or {})
        self._stamp(new)
        self.pods[key] = new
        self.changed()
        return web.json_response(new)

    async def _event(self, request: web.Request) -> web.Response:
        event = await request.json()
        self.events_asked += 1
        self.touched.set()
        await self.events_held.wait()
        if self.events_refused:
            return web.json_response({"kind": "Status", "code": 500, "message": "injected"}, status=500)
        self.events.append(event)
        self.touched.set()
        return web.json_response(event, status=201)

    def reasons(self, pod: str) -> list[str]:
        return [e["reason"] for e in self.events if e["involvedObject"]["name"] == pod]


def _patch_kind(body: Any) -> str:
    if isinstance(body, dict):
        return "mark"
    # The release record (an annotation) rides along with every un-gating: not a kind of its own.
    paths = [op["path"] for op in body if op["op"] != "test" and not op["path"].startswith("/metadata/annotations")]
    gates = [p.startswith("/spec/schedulingGates") for p in paths]
    return "ungate" if all(gates) else "release" if any(gates) else "pin"


class StoreSource:
    """A snapshot source reading the fake server's store directly: an always-current feeder."""

    def __init__(self, server: FakeApiServer, nodes: Sequence[Json], *, clock: Callable[[], float]) -> None:
        self._server, self._nodes, self._clock = server, list(nodes), clock

    @property
    def snapshot(self) -> snapshot.Snapshot:
        pods = copy.deepcopy(list(self._server.pods.values()))
        return snapshot_build.build(nodes=self._nodes, pods=pods, names=NAMES, taken_at=self._clock())

    @property
    def synced(self) -> bool:
        return True

    def unbuilt(self) -> dict[str, Json]:
        return {}  # always current


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApiServer, client.ApiClient]]:
    server = FakeApiServer()
    runner = web.AppRunner(server.app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
        try:
            yield server, api
        finally:
            await api.close()
    finally:
        await runner.cleanup()


NODES = [builders.gpu_node(f"gpu-{i}", gpus=8, domains=[range(4), range(4, 8)]) for i in range(2)]


def config(**gangs: Any) -> settings.Settings:
    return settings.Settings(descheduler=settings.Descheduler(gangs=settings.Gangs(**gangs)))


def make_controller(
    server: FakeApiServer, api: client.ApiClient, cfg: settings.Settings, *, clock: Callable[[], float] = time.time
) -> controller.Controller:
    return controller.Controller(
        config=cfg, source=StoreSource(server, NODES, clock=clock), api=api,
        metrics=controller.Metrics(prometheus_client.CollectorRegistry()),
    )


@contextlib.asynccontextmanager
async def running(
    server: FakeApiServer, api: client.ApiClient, cfg: settings.Settings, *, notify: bool
) -> AsyncIterator[prometheus_client.CollectorRegistry]:
    """The controller's loop as the descheduler runs it; `notify=False`: every pod event is missed."""
    changes = asyncio.Event()
    if notify:
        server.changed = changes.set
    registry = prometheus_client.CollectorRegistry()
    task = asyncio.create_task(controller.run(
        config=cfg, source=StoreSource(server, NODES, clock=time.time), api=api, changes=changes,
        metrics=controller.Metrics(registry)))
    try:
        yield registry
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def one_pass(ctl: controller.Controller, *, now: float) -> planning.ReleasePlan | None:
    """A release pass and then its Events (posted off the pass: `Controller.settle`)."""
    plan = await ctl.reconcile(now=now)
    await ctl.settle()
    return plan


async def until(server: FakeApiServer, condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not condition():
            server.touched.clear()
            await server.touched.wait()


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("notify", [pytest.param(True, id="on-pod-events"), pytest.param(False, id="on-resync-only")])
async def test_eight_member_gang_is_nominated_then_released_together(
    fake: tuple[FakeApiServer, client.ApiClient], notify: bool
) -> None:
    server, api = fake
    cfg = config(resync_seconds=0.2 if not notify else 60)
    async with running(server, api, cfg, notify=notify) as registry:
        await create_gang(api, size=8, gpus=1)
        await until(server, lambda: sum(e["reason"] == planning.RELEASED for e in server.events) == 8)
        pods = await gang_pods(api)
    assert [gates_of(p) for p in pods] == [[]] * 8
    assert_all_or_nothing(pods)
    nodes = {nominated(p) for p in pods}
    assert len(nodes) == 1 and nodes <= {"gpu-0", "gpu-1"}, "one node holds the whole gang (8 GPUs)"
    assert all("affinity" not in p["spec"] for p in pods), "no node term: nominated, never pinned"
    kinds = [kind for _, kind in server.patches]
    assert kinds == ["nominate"] * 8 + ["ungate"] * 8, "every member nominated before any is un-gated"
    # Woken by each creation, the controller saw the gang incomplete, but members created in a burst are not told
    # they wait for each other (descheduler.gangs.incomplete_event_grace_seconds): one Event each, the release.
    assert all(server.reasons(p["metadata"]["name"]) == [planning.RELEASED] for p in pods)
    assert registry.get_sample_value("gpu_steward_gang_releases_total", {"kind": "released"}) == 1
    assert registry.get_sample_value("gpu_steward_gang_wait_seconds_count") == 1


async def test_failure_while_nominating_releases_none_and_the_next_pass_keeps_the_nominations(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    await create_gang(api, size=4, gpus=2)
    server.failing = {(f"{NAMESPACE}/train-2", "nominate")}
    ctl = make_controller(server, api, config())
    await one_pass(ctl, now=time.time())
    pods = await gang_pods(api)
    assert [gates_of(p) for p in pods] == [[GATE]] * 4
    assert [k for _, k in server.patches] == ["nominate"] * 4, "every nomination tried (concurrently), none un-gated"
    first = {p["metadata"]["name"]: nominated(p) for p in pods}
    assert first["train-2"] is None and len({first[n] for n in first if n != "train-2"}) == 1
    server.failing = set()
    del server.patches[:]
    await one_pass(ctl, now=time.time())
    pods = await gang_pods(api)
    assert [gates_of(p) for p in pods] == [[]] * 4
    assert {p["metadata"]["name"]: nominated(p) for p in pods if p["metadata"]["name"] != "train-2"} == {
        n: node for n, node in first.items() if n != "train-2"}, "the nominations set are kept, never re-sent"
    assert [k for _, k in server.patches] == ["nominate"] + ["ungate"] * 4, "only the missing one nominated"


async def test_a_gang_naming_its_own_pod_group_is_released_only_once_the_pod_group_is_made(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """Un-gated while its PodGroup is missing, a member would wait in kube-scheduler's queue for ever: a refused
    create (here 403, the RBAC missing) nominates and un-gates none; the next pass makes it, then releases; a
    PodGroup that exists already (409) is used as it is."""
    server, api = fake
    for pod in await create_gang(api, size=3, gpus=2):
        pod["spec"]["schedulingGroup"] = {"podGroupName": "gpu-steward-train"}  # as our webhook names it
        server.put(pod)
    server.pod_group_refusal = 403
    ctl = make_controller(server, api, config())
    await one_pass(ctl, now=time.time())
    assert [gates_of(p) for p in await gang_pods(api)] == [[GATE]] * 3
    assert [k for _, k in server.patches] == ["pod-group"], "nothing nominated or un-gated"

    server.pod_group_refusal = None
    del server.patches[:]
    await one_pass(ctl, now=time.time())
    pods = await gang_pods(api)
    assert [gates_of(p) for p in pods] == [[]] * 3
    assert [k for _, k in server.patches] == ["pod-group"] + ["nominate"] * 3 + ["ungate"] * 3
    made = server.pod_groups[f"{NAMESPACE}/gpu-steward-train"]
    assert made["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}}
    assert [o["name"] for o in made["metadata"]["ownerReferences"]] == ["train-0", "train-1", "train-2"]


async def test_a_pod_group_that_exists_already_is_used_and_the_gang_released(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    server.pod_groups[f"{NAMESPACE}/gpu-steward-train"] = {"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}
    for pod in await create_gang(api, size=2, gpus=2):
        pod["spec"]["schedulingGroup"] = {"podGroupName": "gpu-steward-train"}
        server.put(pod)
    await one_pass(make_controller(server, api, config()), now=time.time())
    assert [gates_of(p) for p in await gang_pods(api)] == [[]] * 2
    assert [k for _, k in server.patches] == ["pod-group"] + ["nominate"] * 2 + ["ungate"] * 2


async def test_restart_mid_release_resumes_from_the_cluster(fake: tuple[FakeApiServer, client.ApiClient]) -> None:
    server, api = fake
    await create_gang(api, size=4, gpus=2)
    server.failing = {(f"{NAMESPACE}/train-2", "ungate")}
    await one_pass(make_controller(server, api, config()), now=time.time())
    assert [gates_of(p) for p in await gang_pods(api)] == [[], [], [GATE], []]
    server.failing = set()
    fresh = make_controller(server, api, config())  # a new process: nothing remembered
    plan = await one_pass(fresh, now=time.time())
    assert plan is not None and [(d.action, d.event_reason) for d in plan.decisions] == [
        (planning.Action.RESUME, planning.RELEASED)
    ]
    assert [gates_of(p) for p in await gang_pods(api)] == [[]] * 4


async def test_invalid_member_released_alone_and_other_gates_kept(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    pod = gang_member("odd", gang="odd", size=2, gpus=1, namespace=NAMESPACE, gated=True)
    pod["metadata"]["labels"][NAMES.gang_size] = "two"
    pod["spec"]["schedulingGates"].insert(0, {"name": KUEUE_GATE})
    server.put(pod)
    await one_pass(make_controller(server, api, config()), now=time.time())
    stored = server.pods[f"{NAMESPACE}/odd"]
    assert gates_of(stored) == [KUEUE_GATE]
    assert nominated(stored) is None, "released alone: no nomination"
    [event] = server.events
    assert (event["type"], event["reason"]) == ("Warning", planning.INVALID)
    assert "'two' is not a positive integer" in event["message"]


async def test_waiting_and_timeout_events_are_posted_once(fake: tuple[FakeApiServer, client.ApiClient]) -> None:
    server, api = fake
    for i in range(2):
        pod = gang_member(f"part-{i}", gang="part", size=3, gpus=1, namespace=NAMESPACE, gated=True)
        pod["metadata"]["creationTimestamp"] = "2026-11-21T10:00:00Z"
        server.put(pod)
    created = timestamps.epoch("2026-11-21T10:00:00Z")
    assert created is not None
    clock = [created]
    ctl = make_controller(server, api, config(timeout_seconds=600), clock=lambda: clock[0])
    for clock[0] in (created + 60, created + 120, created + 700, created + 800):
        assert await one_pass(ctl, now=clock[0]) is not None
    reasons = server.reasons("part-0")
    assert reasons == [planning.WAITING, planning.INCOMPLETE]
    assert all(gates_of(p) == [GATE] for p in await gang_pods(api, name="part"))


ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
PIN_N1 = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
TERMS = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"


@pytest.mark.parametrize(
    ("patch", "status"),
    [
        pytest.param([{"op": "add", "path": f"{TERMS}/1/matchFields", "value": [PIN_N1]}], 200, id="append-accepted"),
        pytest.param([{"op": "add", "path": f"{TERMS}/0/matchFields", "value": [PIN_N1]}], 422,
                     id="filling-an-empty-term-rejected"),
        pytest.param([{"op": "add", "path": f"{TERMS}/-", "value": {"matchFields": [PIN_N1]}}], 422,
                     id="adding-a-term-rejected"),
        pytest.param([{"op": "remove", "path": f"{TERMS}/1/matchExpressions/0"}], 422, id="removing-rejected"),
        pytest.param([{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "x.io/y"}}], 422,
                     id="adding-a-gate-rejected"),
    ],
)
async def test_fake_server_enforces_the_gated_pod_rules(
    fake: tuple[FakeApiServer, client.ApiClient], patch: list[Json], status: int
) -> None:
    """The rules the fake enforces must bite, or the tests above would prove nothing about the API."""
    server, api = fake
    pod = gang_member("w", gang="g", size=2, gpus=1, namespace=NAMESPACE, gated=True)
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}, {"matchExpressions": [ZONE]}]}}}
    server.put(pod)
    try:
        await kube.request(api, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/w", body=patch,
                           content_type=controller.JSON_PATCH, timeout_seconds=TIMEOUT)
        answered = 200
    except kube.ApiError as exc:
        answered = exc.status
    assert answered == status


async def test_gang_with_a_launcher_without_gpus_waits_for_it_then_is_released_together(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """An MPI job: 4 GPU workers and a launcher without GPUs, all counted in the gang size (5)."""
    server, api = fake
    await create_gang(api, name="mpi", size=5, gpus=2, members=4)
    ctl = make_controller(server, api, config())
    plan = await one_pass(ctl, now=time.time())
    assert plan is not None and [(d.action, d.message) for d in plan.decisions] == [
        (planning.Action.WAIT, planning.to_do("4 of 5 members present", planning.TO_DO[planning.Waiting.INCOMPLETE]))]
    assert [k for _, k in server.patches] == [], "the workers are held for their launcher"

    launcher = gang_member("mpi-launcher", gang="mpi", size=5, gpus=0, namespace=NAMESPACE, gated=True)
    await kube.request(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=launcher, timeout_seconds=TIMEOUT)
    await one_pass(ctl, now=time.time())

    pods = {p["metadata"]["name"]: p for p in await gang_pods(api, name="mpi")}
    assert [gates_of(p) for p in pods.values()] == [[]] * 5
    assert [nominated(p) for p in pods.values()] == ["gpu-0"] * 4 + [None]
    assert "affinity" not in pods["mpi-launcher"]["spec"], "a pod without GPUs is never held on a GPU node"
    kinds = [(key.split("/")[1], kind) for key, kind in server.patches if kind != "mark"]
    assert sorted(kinds[:4]) == [(f"mpi-{i}", "nominate") for i in range(4)], "every worker nominated first"
    assert sorted(kinds[4:]) == [(name, "ungate") for name in ("mpi-0", "mpi-1", "mpi-2", "mpi-3", "mpi-launcher")]
    [released] = {e["message"] for e in server.events if e["reason"] == planning.RELEASED}
    assert released.endswith("; un-gated with them, not nominated (no GPU): team/mpi-launcher")
    assert server.reasons("mpi-launcher") == [planning.RELEASED]


def single(name: str, *, gpus: int) -> Json:
    """A pod the webhook gated for placement at release: our gate, no gang."""
    pod = builders.pod(name, namespace=NAMESPACE, gpus=gpus)
    for field in ("uid", "creationTimestamp"):
        del pod["metadata"][field]
    del pod["status"]
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


class FrozenSource(StoreSource):
    """A feeder whose watch is behind: it keeps serving the snapshot of the moment it was frozen."""

    def __init__(self, server: FakeApiServer, nodes: Sequence[Json], *, clock: Callable[[], float]) -> None:
        super().__init__(server, nodes, clock=clock)
        self.frozen = super().snapshot

    @property
    def snapshot(self) -> snapshot.Snapshot:
        return dataclasses.replace(self.frozen, taken_at=self._clock())


async def test_single_pods_are_nominated_and_released_never_twice_while_the_snapshot_lags(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """20 single 1-GPU pods, 16 GPUs. The snapshot never shows a release (a lagging watch): the controller's own
    record of what it released (`assumed`) must keep it from promising a GPU twice, pass after pass."""
    server, api = fake
    for i in range(20):
        server.put(single(f"solo-{i:02d}", gpus=1), notify=False)
    ctl = controller.Controller(
        config=config(), source=FrozenSource(server, NODES, clock=time.time), api=api,
        metrics=controller.Metrics(prometheus_client.CollectorRegistry()))
    for _ in range(3):
        await one_pass(ctl, now=time.time())
    released = [p for p in server.pods.values() if not gates_of(p)]
    assert len(released) == 16
    assert collections.Counter(kind for _, kind in server.patches) == {"nominate": 16, "ungate": 16}, (
        "no pod released twice")
    per_node = collections.Counter(nominated(p) for p in released)
    assert per_node == {"gpu-0": 8, "gpu-1": 8}
    told = collections.Counter(e["reason"] for e in server.events)
    assert told == {planning.RELEASED: 16, planning.WAITING: 4}, "one Event per release; the 4 that wait are told"
    for pod in released:
        record = outcomes.read(pod["metadata"]["annotations"][NAMES.release])
        node = nominated(pod)
        assert record.at is not None, "when it was released: what the observation pass counts from"
        assert (record.node, record.one_domain) == (node, True), "where it was nominated: what is checked"
        assert record.why.startswith(f"placed on {node}: NVLink score ")
        [event] = [e["message"] for e in server.events if e["involvedObject"]["name"] == pod["metadata"]["name"]]
        assert re.fullmatch(f"placed on {node}: NVLink score [0-9.]+; [0-7] GPUs left free there", event), (
            "the Event is short: where, the score, what is left")


async def test_a_pass_ends_once_its_patches_return_while_its_events_are_still_being_posted(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """The next pass releases the pods that came meanwhile: it must not wait for the API server to take an Event."""
    server, api = fake
    server.put(single("first", gpus=1))
    server.events_held.clear()
    ctl = make_controller(server, api, config())
    async with asyncio.timeout(TIMEOUT):  # with the Event on the pass's path this pass never returns
        await ctl.reconcile(now=time.time())
        assert gates_of(server.pods[f"{NAMESPACE}/first"]) == [], "released"
        server.put(single("second", gpus=1))
        await ctl.reconcile(now=time.time())
    assert gates_of(server.pods[f"{NAMESPACE}/second"]) == [], "released while the first Event is still unanswered"
    await until(server, lambda: server.events_asked == 2)
    assert server.events == []
    server.events_held.set()
    await ctl.settle()
    assert server.reasons("first") == server.reasons("second") == [planning.RELEASED]


async def test_an_event_the_api_server_did_not_take_is_told_again_by_a_later_pass(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """Waiting is told once per change of what a pod waits for, and a release outcome once: each only once taken."""
    server, api = fake
    incomplete = gang_member("part-0", gang="part", size=2, gpus=1, namespace=NAMESPACE, gated=True)
    incomplete["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    server.put(incomplete)
    server.put(released("moved", planned="gpu-0", node="gpu-1",
                        at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    ctl = make_controller(server, api, config(incomplete_event_grace_seconds=30))
    server.events_refused = True
    await one_pass(ctl, now=time.time())
    assert server.events_asked == 2 and server.events == []
    server.events_refused = False
    for _ in range(2):
        await one_pass(ctl, now=time.time())
    assert sorted((e["involvedObject"]["name"], e["reason"]) for e in server.events) == [
        ("moved", "PlacedElsewhere"), ("part-0", planning.WAITING)], "told again once taken, then not again"


async def test_stopping_the_loop_does_not_wait_for_an_event_the_api_server_never_answers(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    server.events_held.clear()
    async with asyncio.timeout(TIMEOUT):  # cancelled (SIGTERM), the loop gives the Event its grace, then returns
        async with running(server, api, config(), notify=True):
            server.put(single("solo", gpus=1))
            await until(server, lambda: server.events_asked == 1)
    assert gates_of(server.pods[f"{NAMESPACE}/solo"]) == [] and server.events == []
    server.events_held.set()


async def test_single_pod_that_cannot_be_placed_is_released_without_a_nomination_after_its_max_wait(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    server.put(single("huge", gpus=16))  # no node has 16 GPUs
    ctl = make_controller(server, api, config(max_wait_seconds=60))
    await one_pass(ctl, now=time.time())
    assert gates_of(server.pods[f"{NAMESPACE}/huge"]) == [GATE], "waits within its bound"
    await one_pass(ctl, now=time.time() + 61)
    stored = server.pods[f"{NAMESPACE}/huge"]
    assert gates_of(stored) == [] and nominated(stored) is None
    assert server.reasons("huge")[-1] == planning.UNPLACED


class RacingSource(StoreSource):
    """A feeder whose watch delivers a binding right after the plan was read: `racer` (a never-gated pod) is bound to
    gpu-0 once the first snapshot has been served."""

    def __init__(self, server: FakeApiServer, nodes: Sequence[Json], *, racer: Json) -> None:
        super().__init__(server, nodes, clock=time.time)
        self.racer, self.reads = racer, 0

    @property
    def snapshot(self) -> snapshot.Snapshot:
        seen = super().snapshot
        self.reads += 1
        if self.reads == 1:
            self._server.put(copy.deepcopy(self.racer), notify=False)
        return seen


class UnbuiltSource(FrozenSource):
    """A feeder whose snapshot does not show the binding of `racer` yet, while its watch has delivered it
    (`unbuilt`): what the check right before the nomination must see, a rebuild sooner."""

    def __init__(self, server: FakeApiServer, nodes: Sequence[Json], *, racer: Json) -> None:
        super().__init__(server, nodes, clock=time.time)
        self.racer = racer

    def unbuilt(self) -> dict[str, Json]:
        return {f"{self.racer['metadata']['namespace']}/{self.racer['metadata']['name']}": self.racer}


def with_host_port(pod: Json, port: int) -> Json:
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    return pod


def racer(gpus: int, *, host_port: int | None = None) -> Json:
    pod = builders.pod("racer", namespace="other", gpus=gpus, node="gpu-0", phase="Running")
    return pod if host_port is None else with_host_port(pod, host_port)


@pytest.mark.parametrize(
    ("gated", "racer_pod", "held_back"),
    [
        pytest.param(single("solo", gpus=8), racer(1), True, id="gpus-short/match"),
        pytest.param(single("solo", gpus=4), racer(4), False, id="racer-fits-what-the-plan-left/no-match"),
        pytest.param(with_host_port(single("solo", gpus=2), 8080), racer(1, host_port=8080), True,
                     id="host-port-taken/match"),
        pytest.param(with_host_port(single("solo", gpus=2), 8080), racer(1, host_port=9090), False,
                     id="another-host-port/no-match"),
    ],
)
async def test_a_binding_the_snapshot_does_not_show_yet_holds_the_release_back(
    fake: tuple[FakeApiServer, client.ApiClient], gated: Json, racer_pod: Json, held_back: bool,
) -> None:
    """The plan's snapshot was built before kube-scheduler bound `racer` to the one node; the watch has delivered
    it. Nominated anyway, `solo` would go to a node that cannot take it (with nothing else free: Unschedulable)."""
    server, api = fake
    server.put(gated, notify=False)
    source = UnbuiltSource(server, NODES[:1], racer=racer_pod)
    server.put(copy.deepcopy(racer_pod), notify=False)  # in the API server, not in the frozen snapshot
    registry = prometheus_client.CollectorRegistry()
    ctl = controller.Controller(config=config(), source=source, api=api, metrics=controller.Metrics(registry))
    await one_pass(ctl, now=time.time())
    stored = server.pods[f"{NAMESPACE}/solo"]
    assert registry.get_sample_value("gpu_steward_release_overtaken_total") == (1 if held_back else 0)
    if held_back:
        assert server.patches == [], "nothing nominated, nothing un-gated"
        assert gates_of(stored) == [GATE]
    else:
        assert gates_of(stored) == [] and nominated(stored) == "gpu-0"


@pytest.mark.parametrize(
    ("gated", "racing_gpus", "held_back"),
    [
        pytest.param([single("solo", gpus=8)], 1, True, id="single-pod-node-taken/match"),
        pytest.param([single("solo", gpus=4)], 4, False, id="single-pod-racer-fits-what-the-plan-left/no-match"),
        pytest.param([gang_member(f"g-{i}", gang="g", size=2, gpus=4, namespace=NAMESPACE, gated=True)
                      for i in range(2)], 1, True, id="gang-held-back-as-a-unit-none-nominated"),
    ],
)
async def test_a_release_whose_node_was_taken_since_the_plan_is_held_back_and_planned_afresh(
    fake: tuple[FakeApiServer, client.ApiClient], gated: list[Json], racing_gpus: int, held_back: bool,
) -> None:
    server, api = fake
    for pod in gated:
        server.put(pod, notify=False)
    registry = prometheus_client.CollectorRegistry()
    ctl = controller.Controller(config=config(), source=RacingSource(server, NODES[:1], racer=racer(racing_gpus)),
                                api=api, metrics=controller.Metrics(registry))
    await one_pass(ctl, now=time.time())
    names = [p["metadata"]["name"] for p in gated]
    stored = [server.pods[f"{NAMESPACE}/{n}"] for n in names]
    if held_back:
        assert server.patches == [], "nothing nominated, nothing un-gated"
        assert all(gates_of(p) == [GATE] for p in stored)
        assert registry.get_sample_value("gpu_steward_release_overtaken_total") == 1
        await one_pass(ctl, now=time.time())  # the next pass plans on what the node holds now: no room, it waits
        assert {kind for _, kind in server.patches} <= {"mark"}, "still nothing nominated or un-gated"
        assert all(server.reasons(n) == [planning.WAITING] for n in names)
    else:
        assert [gates_of(p) for p in stored] == [[]] and nominated(stored[0]) == "gpu-0"
        assert registry.get_sample_value("gpu_steward_release_overtaken_total") == 0


async def test_gang_only_preemption_can_place_nominates_where_room_is_free_and_leaves_the_rest_to_preemption(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    low = builders.pod("low", namespace="other", gpus=4, node="gpu-0", phase="Running")  # priority 0
    server.put(low, notify=False)
    for i in range(2):
        member = gang_member(f"g-{i}", gang="g", size=2, gpus=4, namespace=NAMESPACE, gated=True)
        member["spec"]["priority"] = 1000
        server.put(member, notify=False)
    registry = prometheus_client.CollectorRegistry()
    ctl = controller.Controller(config=config(), source=StoreSource(server, NODES[:1], clock=time.time), api=api,
                                metrics=controller.Metrics(registry))
    await one_pass(ctl, now=time.time())
    pods = await gang_pods(api, name="g")
    assert sorted((gates_of(p), nominated(p) or "") for p in pods) == [([], ""), ([], "gpu-0")], (
        "the member with free room nominated there; the one that needs a preemption left to kube-scheduler")
    assert [kind for _, kind in server.patches] == ["nominate", "ungate", "ungate"]
    assert all(server.reasons(p["metadata"]["name"]) == [planning.PREEMPTING] for p in pods)
    assert registry.get_sample_value("gpu_steward_gang_releases_total", {"kind": "preempting"}) == 1


async def test_a_gang_only_preemption_can_place_gets_its_claims_of_their_own_first_with_the_templates_request(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """A preempting release plans no NVLink domain for a member kube-scheduler will place by preemption: each
    member's claim of its own is made from its template's request as it is (dry run, then create), every claim
    before the first gate is lifted."""
    server, api = fake
    server.put(builders.pod("low", namespace="other", gpus=4, node="gpu-0", phase="Running"), notify=False)
    server.templates[f"{NAMESPACE}/t4"] = builders.claim_template("t4", namespace=NAMESPACE,
                                                                 spec=builders.claim_spec(4))
    for i in range(2):
        member = gang_member(f"g-{i}", gang="g", size=2, gpus=4, namespace=NAMESPACE, gated=True)
        member["spec"]["priority"] = 1000
        record = dra.Record("gpus", f"g-{i}-gpus-0a1b2c3d", "t4")
        member["metadata"].setdefault("annotations", {})[NAMES.domain_claim] = record.text()
        member["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": record.claim}]
        server.put(member, notify=False)
    ctl = controller.Controller(config=config(), source=StoreSource(server, NODES[:1], clock=time.time), api=api,
                                metrics=controller.Metrics(prometheus_client.CollectorRegistry()))
    await one_pass(ctl, now=time.time())
    kinds = [kind for _, kind in server.patches]
    assert sorted(kinds) == sorted(["nominate", *["claim-dry-run", "claim"] * 2, "ungate", "ungate"]), kinds
    assert max(i for i, k in enumerate(kinds) if k.startswith("claim")) < kinds.index("ungate"), kinds
    for i in range(2):
        claim = server.claims[f"{NAMESPACE}/g-{i}-gpus-0a1b2c3d"]
        assert claim["spec"] == builders.claim_spec(4), "no domain planned: the template's request as it is"
    assert all(server.reasons(f"g-{i}") == [planning.PREEMPTING] for i in range(2))


async def test_a_nomination_someone_else_set_is_kept_and_the_pod_released_without_ours(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """Native topology-aware scheduling (or any controller) nominated the gated pod first: never overwritten."""
    server, api = fake
    pod = single("theirs", gpus=2)
    pod["status"] = {"phase": "Pending", "nominatedNodeName": "gpu-1"}
    server.put(pod)
    await one_pass(make_controller(server, api, config()), now=time.time())
    stored = server.pods[f"{NAMESPACE}/theirs"]
    assert gates_of(stored) == [] and nominated(stored) == "gpu-1"
    assert [kind for _, kind in server.patches] == ["ungate"], "no nomination sent"
    record = outcomes.read(stored["metadata"]["annotations"][NAMES.release])
    assert record.node is None and "nominated already, kept: team/theirs (to gpu-1)" in record.why


async def test_a_pod_changed_since_the_plan_is_not_nominated_on_stale_facts(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """The nomination carries the resourceVersion the plan read: a pod changed since answers 409, nothing is
    un-gated, and the next pass (on a fresh snapshot) releases it."""
    server, api = fake
    server.put(single("solo", gpus=2), notify=False)
    source = FrozenSource(server, NODES, clock=time.time)
    server.put(copy.deepcopy(server.pods[f"{NAMESPACE}/solo"]), notify=False)  # a new resourceVersion
    ctl = controller.Controller(config=config(), source=source, api=api,
                                metrics=controller.Metrics(prometheus_client.CollectorRegistry()))
    await one_pass(ctl, now=time.time())
    assert gates_of(server.pods[f"{NAMESPACE}/solo"]) == [GATE] and nominated(server.pods[f"{NAMESPACE}/solo"]) is None
    assert [kind for _, kind in server.patches] == ["nominate"]
    source.frozen = StoreSource(server, NODES, clock=time.time).snapshot
    await one_pass(ctl, now=time.time())
    assert gates_of(server.pods[f"{NAMESPACE}/solo"]) == [] and nominated(server.pods[f"{NAMESPACE}/solo"])


def released(name: str, *, planned: str | None, node: str | None, at: str, gang: str | None = None,
             size: int = 2) -> Json:
    """A pod our release un-gated at `at`, nominated to `planned`, bound to `node` (None: still Pending)."""
    pod = (gang_member(name, gang=gang, size=size, gpus=4, namespace=NAMESPACE, gated=False) if gang
           else builders.pod(name, namespace=NAMESPACE, gpus=4))
    pod["metadata"]["annotations"] = {NAMES.release: outcomes.record(at=at, node=planned, one_domain=True,
                                                                    why="placed")}
    pod["spec"].pop("schedulingGates", None)
    pod["status"] = {"phase": "Running" if node else "Pending"}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


async def test_outcomes_are_told_once_each_with_an_event_and_a_metric_and_nothing_is_deleted(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    long_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
    just_now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for pod in (released("moved", planned="gpu-0", node="gpu-1", at=just_now),
                released("landed", planned="gpu-0", node="gpu-0", at=just_now),
                released("late", planned="gpu-1", node=None, at=long_ago),
                released("g-0", planned="gpu-0", node="gpu-0", at=long_ago, gang="g"),
                released("g-1", planned="gpu-0", node=None, at=long_ago, gang="g")):
        server.put(pod, notify=False)
    before = copy.deepcopy(server.pods)
    registry = prometheus_client.CollectorRegistry()
    ctl = controller.Controller(config=config(bind_bound_seconds=120), source=StoreSource(server, NODES,
                                clock=time.time), api=api, metrics=controller.Metrics(registry))
    for _ in range(2):
        await one_pass(ctl, now=time.time())
    told = {(e["involvedObject"]["name"], e["type"], e["reason"]) for e in server.events}
    assert told == {("moved", "Normal", "PlacedElsewhere"), ("late", "Warning", "NotBoundInTime"),
                    ("g-0", "Warning", "GangNotBoundInTime"), ("g-1", "Warning", "GangNotBoundInTime")}
    assert len(server.events) == 4, "each told once, not on every pass"
    counts = {cause.value: registry.get_sample_value("gpu_steward_release_outcomes_total", {"cause": cause.value})
              for cause in outcomes.Cause}
    assert counts == {"placed-elsewhere": 1, "split-domains": None, "not-bound": 1, "gang-not-bound": 2,
                      "gang-spread": None}
    assert server.pods == before and server.patches == [], "observed only: no pod changed, deleted or re-created"


def with_own_claim(name: str, *, gpus: int) -> Json:
    """A gated single pod whose claim entry our webhook pointed at a claim of its own (`common.domain_claim`)."""
    pod = single(name, gpus=gpus)
    record = dra.Record("gpus", f"{name}-gpus-0a1b2c3d", "t4")
    pod["metadata"].setdefault("annotations", {})[NAMES.domain_claim] = record.text()
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": record.claim}]
    return pod


async def test_a_pods_claim_of_its_own_is_made_before_its_gate_is_lifted(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    """Un-gated before its claim exists, a pod waits for ever with no gate (docs/placement.md): while its template is
    missing nothing is lifted; once it is there the claim is made (dry run, then create) from it, owned by the pod,
    and only then is the gate removed. A restart after the create finds the claim and uses it as it is."""
    server, api = fake
    server.put(with_own_claim("own", gpus=16))  # fits no node: released unplaced at its bound, the template's request
    ctl = make_controller(server, api, config(max_wait_seconds=60))
    await one_pass(ctl, now=time.time() + 61)
    assert gates_of(server.pods[f"{NAMESPACE}/own"]) == [GATE], "template missing: nothing lifted"
    assert [k for _, k in server.patches] == []

    server.templates[f"{NAMESPACE}/t4"] = builders.claim_template("t4", namespace=NAMESPACE,
                                                                 spec=builders.claim_spec(4))
    await one_pass(ctl, now=time.time() + 62)
    stored = server.pods[f"{NAMESPACE}/own"]
    assert gates_of(stored) == []
    assert [k for _, k in server.patches] == ["claim-dry-run", "claim", "ungate"]
    assert server.reasons("own") == [planning.UNPLACED]
    claim = server.claims[f"{NAMESPACE}/own-gpus-0a1b2c3d"]
    assert (claim["metadata"]["ownerReferences"][0]["uid"], claim["spec"]) == (
        stored["metadata"]["uid"], builders.claim_spec(4))

    del server.patches[:]
    server.put(with_own_claim("again", gpus=16))
    server.claims[f"{NAMESPACE}/again-gpus-0a1b2c3d"] = {"metadata": {
        "name": "again-gpus-0a1b2c3d", "ownerReferences": [{"kind": "Pod", "name": "again", "uid": "uid-again"}]}}
    await one_pass(make_controller(server, api, config(max_wait_seconds=60)), now=time.time() + 61)
    assert gates_of(server.pods[f"{NAMESPACE}/again"]) == []
    assert [k for _, k in server.patches] == ["ungate"], "the claim made before the restart is used as it is"
