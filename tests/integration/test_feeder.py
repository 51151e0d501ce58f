"""The Feeder against a fake Kubernetes API server (aiohttp) that lists, pages, watches, replays
history from a resourceVersion, fails on request, and can go down and come back on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import pathlib
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import prometheus_client
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from common import feeder, gangs, kube, prometheus, settings
from tests import builders
from tests.support.prometheus import Series, StartPrometheus

LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpu-steward/leases"  # the default leader Lease's namespace
V1ALPHA2 = "/apis/scheduling.k8s.io/v1alpha2/podgroups"  # Kubernetes 1.36's (v1alpha3 is not served here: 404)
PATHS = {**{kind.name: kind.path for kind in feeder.KINDS}, "leases": LEASES, "podgroups-v1alpha2": V1ALPHA2}
Obj = dict[str, Any]


def key_of(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class FakeApi:
    """Just enough of kube-apiserver for list+watch: paged lists, watches that replay history after
    their resourceVersion, ERROR events, HTTP failures on demand, and a stop/start on one port."""

    def __init__(self) -> None:
        self.revision = 100
        self.objects: dict[str, dict[str, Obj]] = {path: {} for path in PATHS.values()}
        self.history: list[tuple[int, str, Obj]] = []  # (revision, path, event)
        self.watchers: dict[str, list[asyncio.Queue[Obj | bytes | None]]] = {path: [] for path in PATHS.values()}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.fail: dict[str, list[int]] = {path: [] for path in PATHS.values()}  # next responses' statuses
        self.hold: dict[str, asyncio.Event] = {}  # lists of these paths wait for the event
        self.authorizations: set[str | None] = set()
        self.port = 0
        self.runner: web.AppRunner | None = None

    # --- cluster changes ---
    def put(self, kind: str, obj: Obj, *, broadcast: bool = True) -> None:
        path = PATHS[kind]
        self.revision += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.revision)
        event_type = "MODIFIED" if key_of(obj) in self.objects[path] else "ADDED"
        self.objects[path][key_of(obj)] = obj
        if broadcast:
            self._emit(path, {"type": event_type, "object": obj})

    def delete(self, kind: str, obj: Obj) -> None:
        path = PATHS[kind]
        self.revision += 1
        gone = self.objects[path].pop(key_of(obj))
        gone = {**gone, "metadata": {**gone["metadata"], "resourceVersion": str(self.revision)}}
        self._emit(path, {"type": "DELETED", "object": gone})

    def send(self, kind: str, event: Obj | bytes | None) -> None:
        """An event to open watches only (ERROR, BOOKMARK; bytes: a line sent as it is), or None: end them as the
        server would."""
        for queue in self.watchers[PATHS[kind]]:
            queue.put_nowait(event)

    def _emit(self, path: str, event: Obj) -> None:
        self.history.append((self.revision, path, event))
        for queue in self.watchers[path]:
            queue.put_nowait(event)

    def lists(self, kind: str) -> int:
        """Full lists started (first pages)."""
        return sum(1 for p, q in self.requests if p == PATHS[kind] and "watch" not in q and "continue" not in q)

    def watches(self, kind: str) -> list[dict[str, str]]:
        return [q for p, q in self.requests if p == PATHS[kind] and q.get("watch") == "true"]

    def open_watches(self) -> int:
        return sum(len(queues) for queues in self.watchers.values())

    # --- the server ---
    async def start(self) -> None:
        app = web.Application()
        for path in PATHS.values():
            app.router.add_get(path, self._handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path, query = request.path, dict(request.query)
        self.requests.append((path, query))
        self.authorizations.add(request.headers.get("Authorization"))
        if self.fail[path]:
            status = self.fail[path].pop(0)
            return web.json_response({"kind": "Status", "code": status, "message": f"injected {status}"}, status=status)
        if query.get("watch") == "true":
            return await self._watch(request, path, int(query["resourceVersion"]))
        if path in self.hold:
            await self.hold[path].wait()
        items = sorted(self.objects[path].values(), key=key_of)
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or len(items) or 1)
        page = items[start : start + limit]
        more = start + limit < len(items)
        return web.json_response(
            {
                "kind": "List",
                "metadata": {
                    "resourceVersion": str(self.revision),
                    **({"continue": str(start + limit)} if more else {}),
                },
                "items": page,
            }
        )

    async def _watch(self, request: web.Request, path: str, since: int) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        queue: asyncio.Queue[Obj | bytes | None] = asyncio.Queue()
        for revision, event_path, past in self.history:
            if event_path == path and revision > since:
                queue.put_nowait(past)
        self.watchers[path].append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write(event + b"\n" if isinstance(event, bytes) else json.dumps(event).encode() + b"\n")
        finally:
            self.watchers[path].remove(queue)
        return response


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeApi]:
    api = FakeApi()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def api_client(fake_api: FakeApi, tmp_path: pathlib.Path) -> AsyncIterator[client.ApiClient]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{fake_api.port}"}}],
                "users": [{"name": "me", "user": {"token": "s3cret"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    api = await kube.api_client(settings.Kubernetes(kubeconfig=kubeconfig))
    yield api
    await api.close()


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for a condition of the fake server, which has no event to wait on."""
    async with asyncio.timeout(20):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert predicate(), what


@dataclasses.dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


CONFIG = settings.Settings(
    kubernetes=settings.Kubernetes(
        backoff_initial_seconds=0.05,
        backoff_max_seconds=0.2,
        rebuild_interval_seconds=0.01,
        list_page_size=2,
        request_timeout_seconds=5,
    )
)


@dataclasses.dataclass
class Running:
    feeder: feeder.Feeder
    registry: prometheus_client.CollectorRegistry
    clock: Clock
    changed: asyncio.Event

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait (bounded) for a published snapshot that satisfies `predicate`."""
        async with asyncio.timeout(20):
            while not predicate():
                self.changed.clear()
                try:
                    async with asyncio.timeout(0.05):  # some conditions (metrics) change without a rebuild
                        await self.changed.wait()
                except TimeoutError:
                    pass
        assert predicate(), what

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def running(api_client: client.ApiClient) -> AsyncIterator[Running]:
    registry = prometheus_client.CollectorRegistry()
    clock = Clock()
    fed = feeder.Feeder(config=CONFIG, api=api_client, prometheus=None, registry=registry, clock=clock)
    task = asyncio.create_task(fed.run())
    yield Running(fed, registry, clock, fed.subscribe())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def seed(api: FakeApi) -> None:
    api.put("nodes", builders.gpu_node("gpu-1", gpus=8, domains=[[0, 1, 2, 3], [4, 5, 6, 7]]))
    api.put("nodes", builders.gpu_node("gpu-2", gpus=4))
    api.put("nodes", {"metadata": {"name": "cpu-only"}, "status": {"allocatable": {"cpu": "8"}}})
    for i in range(5):  # more than one page
        api.put("pods", builders.pod(f"train-{i}", namespace="team-a", gpus=1, node="gpu-1", phase="Running"))
    api.put("pods", builders.pod("web", namespace="team-a"))  # no GPUs: not stored
    for pc in builders.tier_classes():
        api.put("priorityclasses", pc)
    api.put("namespaces", builders.namespace("team-a", {"team": "a"}))


async def test_initial_list_then_watch_events(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    await running.until(lambda: running.feeder.synced, "synced after the first lists")
    snap = running.feeder.snapshot
    assert sorted(snap.nodes) == ["gpu-1", "gpu-2"]
    assert sorted(snap.pods) == [f"team-a/train-{i}" for i in range(5)]
    assert sorted(snap.priority_classes) == sorted(pc["metadata"]["name"] for pc in builders.tier_classes())
    assert snap.namespaces == {"team-a": {"team": "a"}}
    assert snap.taken_at == 1_000.0
    assert fake_api.authorizations == {"Bearer s3cret"}
    assert fake_api.lists("pods") == 1 and running.metric("gpu_steward_feeder_relists_total", kind="pods") == 1
    pages = [(q["limit"], q.get("continue")) for p, q in fake_api.requests if p == PATHS["pods"] and "watch" not in q]
    assert pages == [("2", None), ("2", "2"), ("2", "4")]

    fake_api.put("pods", builders.pod("infer", namespace="team-b", gpus=2, node="gpu-2", phase="Running"))
    await running.until(lambda: "team-b/infer" in running.feeder.snapshot.pods, "ADDED")
    assert running.feeder.snapshot.nodes["gpu-2"].requested_full == 2

    fake_api.put("pods", builders.pod("infer", namespace="team-b", gpus=2, node="gpu-2", phase="Succeeded"))
    await running.until(lambda: running.feeder.snapshot.nodes["gpu-2"].requested_full == 0, "MODIFIED")
    assert running.feeder.snapshot.pods["team-b/infer"].phase == "Succeeded"

    fake_api.delete("pods", builders.pod("train-0", namespace="team-a"))
    await running.until(lambda: "team-a/train-0" not in running.feeder.snapshot.pods, "DELETED")

    # A gang counts its members without GPUs (an MPI launcher): kept, unlike other pods without GPUs.
    fake_api.put("pods", builders.pod("api", namespace="team-a", node="gpu-2", phase="Running"))
    gang = {"kueue.x-k8s.io/pod-group-name": "mpi"}
    fake_api.put("pods", builders.pod("mpi-launcher", namespace="team-a", labels=gang))
    await running.until(lambda: "team-a/mpi-launcher" in running.feeder.snapshot.pods, "gang member ADDED")
    assert "team-a/api" not in running.feeder.snapshot.pods
    fake_api.put("pods", builders.pod("mpi-launcher", namespace="team-a"))  # labels gone: no longer a member
    await running.until(lambda: "team-a/mpi-launcher" not in running.feeder.snapshot.pods, "gang labels removed")
    fake_api.put("namespaces", builders.namespace("team-b"))
    await running.until(lambda: "team-b" in running.feeder.snapshot.namespaces, "namespace ADDED")


async def test_pods_without_gpus_and_nodes_without_gpus_keep_what_rules_gpu_nodes_out(
        fake_api: FakeApi, running: Running) -> None:
    """A bound pod without GPUs keeps its host ports and required anti-affinity in its slim copy, and a node
    without GPUs its labels: its zone carries a guard's anti-affinity onto the GPU nodes of that zone."""
    seed(fake_api)
    fake_api.put("nodes", {"metadata": {"name": "cpu-only", "labels": {"zone": "a"}},
                           "status": {"allocatable": {"cpu": "8"}}})
    fake_api.put("nodes", builders.gpu_node("gpu-2", gpus=4, labels={"zone": "a"}))

    def guard(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 9100}]
        pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"}}}]}}

    fake_api.put("pods", builders.pod("exporter", namespace="team-a", node="gpu-1", phase="Running", mutate=guard))
    fake_api.put("pods", builders.pod("guard", namespace="team-a", node="cpu-only", phase="Running", mutate=guard))
    await running.until(lambda: running.feeder.synced and bool(running.feeder.snapshot.nodes["gpu-2"].anti_affinity),
                        "the guard's zone reaches gpu-2")
    snap = running.feeder.snapshot
    assert sorted(snap.nodes) == ["gpu-1", "gpu-2"], "a node without GPUs is no GPU node"
    assert snap.nodes["gpu-1"].host_ports == {("0.0.0.0", "TCP", 9100)}
    assert [t.owner for t in snap.nodes["gpu-2"].anti_affinity] == ["team-a/guard"]
    assert snap.nodes["gpu-1"].anti_affinity == (), "gpu-1 has no zone label: the zone terms miss it"
    assert "team-a/exporter" not in snap.pods, "kept slim, not as a GPU pod"


async def test_node_heartbeats_do_not_rebuild(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    await running.until(lambda: running.feeder.synced, "synced")
    rebuilds = running.metric("gpu_steward_feeder_snapshot_rebuilds_total")
    heartbeat = builders.gpu_node("gpu-2", gpus=4)
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-21T10:00:10Z"
    fake_api.put("nodes", heartbeat)
    fake_api.put("nodes", builders.gpu_node("gpu-2", gpus=4, labels={"zone": "b"}))  # this one matters
    await running.until(lambda: running.feeder.snapshot.nodes["gpu-2"].labels.get("zone") == "b", "label change")
    assert running.metric("gpu_steward_feeder_snapshot_rebuilds_total") == rebuilds + 1


class HeldPauses:
    """The publisher's pauses after a rebuild (`Feeder(pause=...)`), each held until the test ends it: what is
    published while one is held was not batched behind it."""

    def __init__(self) -> None:
        self.lengths: list[float] = []
        self._held: list[asyncio.Future[None]] = []

    async def __call__(self, seconds: float) -> None:
        self.lengths.append(seconds)
        self._held.append(asyncio.get_running_loop().create_future())
        await self._held[-1]

    @property
    def holding(self) -> bool:
        return any(not f.done() for f in self._held)

    @property
    def pending(self) -> list[asyncio.Future[None]]:
        """The pauses held right now, oldest first."""
        return [f for f in self._held if not f.done()]

    def end(self) -> None:
        for future in self._held:
            if not future.done():
                future.set_result(None)


@contextlib.asynccontextmanager
async def paused_feeder(fake_api: FakeApi, api_client: client.ApiClient, *,
                        hurry_for_gated: bool = False) -> AsyncIterator[tuple[feeder.Feeder, Running, HeldPauses]]:
    """A running feeder of the seeded cluster whose pauses after a rebuild the test ends (`HeldPauses`)."""
    registry, clock, pauses = prometheus_client.CollectorRegistry(), Clock(), HeldPauses()
    fed = feeder.Feeder(config=CONFIG, api=api_client, prometheus=None, registry=registry, clock=clock, pause=pauses,
                        hurry_for_gated=hurry_for_gated)
    seed(fake_api)
    task = asyncio.create_task(fed.run())
    try:
        yield fed, Running(fed, registry, clock, fed.subscribe()), pauses
    finally:
        pauses.end()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_change_after_a_quiet_spell_is_published_at_once_and_a_burst_in_one_rebuild(
        fake_api: FakeApi, api_client: client.ApiClient) -> None:
    """Leading edge: a lone change (a gated pod) is published without waiting out a pause; the changes that come
    while the pause after that rebuild runs are batched into one rebuild at its end."""
    async with paused_feeder(fake_api, api_client) as (fed, run, pauses):
        await run.until(lambda: fed.synced and pauses.holding, "synced, then pausing")
        pauses.end()
        run.clock.now += 1  # the quiet spell: once the publisher moves taken_at, it waits for the next change
        await run.until(lambda: fed.snapshot.taken_at == run.clock.now and not pauses.holding, "the publisher idle")
        rebuilds = run.metric("gpu_steward_feeder_snapshot_rebuilds_total")
        fake_api.put("pods", builders.pod("lone", namespace="team-a", gpus=2))
        # No pause is ended from here on until the burst is in: a change batched behind one would never show.
        await run.until(lambda: "team-a/lone" in fed.snapshot.pods and pauses.holding, "the lone change published")
        assert pauses.lengths[-1] >= CONFIG.kubernetes.rebuild_interval_seconds, "the pause after it: the interval"
        burst = [f"team-a/burst-{i}" for i in range(3)]
        for key in burst:
            fake_api.put("pods", builders.pod(key.split("/")[1], namespace="team-a", gpus=1))
        await run.until(lambda: set(burst) <= set(fed._stores["pods"]), "the burst received")
        assert not set(burst) & set(fed.snapshot.pods), "published while the pause after a rebuild runs"
        pauses.end()
        await run.until(lambda: set(burst) <= set(fed.snapshot.pods), "the burst published")
        assert run.metric("gpu_steward_feeder_snapshot_rebuilds_total") == rebuilds + 2, "one for the lone, one burst"


def gated(pod: dict[str, Any], *gates: str) -> dict[str, Any]:
    pod["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return pod


OUR_GATE = CONFIG.names.gate


@pytest.mark.parametrize(("old", "new", "expected"), [
    pytest.param(None, gated(builders.pod("p", gpus=2), OUR_GATE), True, id="a-new-pod-with-our-gate"),
    pytest.param(None, gated(builders.pod("p", gpus=2), "kueue.x-k8s.io/admission", OUR_GATE), True,
                 id="ours-behind-another-controllers-gate"),
    pytest.param(builders.pod("p", gpus=2), gated(builders.pod("p", gpus=2), OUR_GATE), True,
                 id="seen-before-without-it"),
    pytest.param(gated(builders.pod("p", gpus=2), OUR_GATE), gated(builders.pod("p", gpus=2, labels={"a": "b"}),
                 OUR_GATE), False, id="seen-again-still-gated"),
    pytest.param(gated(builders.pod("p", gpus=2), OUR_GATE), builders.pod("p", gpus=2), False, id="released"),
    pytest.param(None, builders.pod("p", gpus=2), False, id="a-new-pod-without-a-gate"),
    pytest.param(None, gated(builders.pod("p", gpus=2), "kueue.x-k8s.io/admission"), False,
                 id="only-another-controllers-gate"),
])
def test_which_pods_hurry_the_next_rebuild(old: dict[str, Any] | None, new: dict[str, Any], expected: bool) -> None:
    assert feeder.newly_gated(old, new, names=CONFIG.names) is expected


async def test_a_newly_gated_pod_ends_the_pause_once_it_has_lasted_as_long_as_the_rebuild(
        fake_api: FakeApi, api_client: client.ApiClient) -> None:
    """`hurry_for_gated`: a newly gated pod ends the pause after a rebuild, but not before the floor (as long as the
    rebuild took) has passed; any other change waits out the full pause, and one received beside a gated pod is in
    its rebuild. (Which pods hurry: the table above.)"""
    async with paused_feeder(fake_api, api_client, hurry_for_gated=True) as (fed, run, pauses):
        await run.until(lambda: fed.synced and len(pauses.pending) == 2, "synced, then pausing: the full pause and "
                        "the floor")
        full, floor = pauses.pending
        # The floor is as long as the rebuild took (its measured time: not asserted); the full pause is the interval,
        # or the floor when the rebuild took longer.
        assert pauses.lengths[-2] == max(CONFIG.kubernetes.rebuild_interval_seconds, pauses.lengths[-1])
        fake_api.put("pods", builders.pod("plain", namespace="team-a", gpus=1))
        await run.until(lambda: "team-a/plain" in fed._stores["pods"], "received")
        floor.set_result(None)
        for _ in range(20):  # the steps a hurried pause takes to end: none, since nothing hurried it
            await asyncio.sleep(0)
        assert not full.done() and "team-a/plain" not in fed.snapshot.pods, "no gated pod: the full pause runs"
        fake_api.put("pods", gated(builders.pod("waits", namespace="team-a", gpus=2), OUR_GATE))
        await run.until(lambda: "team-a/waits" in fed.snapshot.pods, "published once a gated pod came")
        assert full.cancelled(), "the full pause was cut short, not waited out"
        assert "team-a/plain" in fed.snapshot.pods, "what came before it is in the same rebuild"
        await run.until(lambda: len(pauses.pending) == 2, "pausing again")
        full, floor = pauses.pending
        fake_api.put("pods", gated(builders.pod("next", namespace="team-a", gpus=2), OUR_GATE))
        await run.until(lambda: "team-a/next" in fed._stores["pods"], "received")
        assert "team-a/next" not in fed.snapshot.pods, "not before the floor has passed"
        floor.set_result(None)
        await run.until(lambda: "team-a/next" in fed.snapshot.pods, "published once the floor passed")
        assert full.cancelled()


PODS = next(kind for kind in feeder.KINDS if kind.name == "pods")


async def test_pods_that_newly_hold_a_node_are_unbuilt_until_a_rebuild_that_copied_them_is_published(
        fake_api: FakeApi, api_client: client.ApiClient) -> None:
    """`unbuilt()`: what release checks right before a nomination. Bound or nominated since the published snapshot's
    copy: in; pending, deleted, or held on the same node as before: out; bound while a rebuild runs: still in after
    that rebuild is published (its copy was taken before)."""
    async with paused_feeder(fake_api, api_client) as (fed, run, pauses):
        await run.until(lambda: fed.synced and pauses.holding, "synced, then pausing")
        assert fed.unbuilt() == {}, "what the list brought is in the snapshot"
        gone = builders.pod("gone", namespace="team-a", gpus=1, node="gpu-2", phase="Running")
        fake_api.put("pods", gone)
        fake_api.delete("pods", gone)
        fake_api.put("pods", builders.pod("waiting", namespace="team-a", gpus=2))
        fake_api.put("pods", builders.pod("bound", namespace="team-a", gpus=2, node="gpu-1", phase="Running"))
        nominated = builders.pod("nominated", namespace="team-a", gpus=1)
        nominated["status"]["nominatedNodeName"] = "gpu-2"
        fake_api.put("pods", nominated)
        fake_api.put("pods", builders.pod("train-0", namespace="team-a", gpus=1, node="gpu-1", phase="Running",
                                          labels={"changed": "yes"}))
        await run.until(lambda: fed._stores["pods"]["team-a/train-0"]["metadata"].get("labels"), "all received")
        assert set(fed.unbuilt()) == {"team-a/bound", "team-a/nominated"}
        assert "team-a/bound" not in fed.snapshot.pods, "the snapshot does not show it yet"

        build, late = fed._builder.build, builders.pod("waiting", namespace="team-a", gpus=2, node="gpu-2",
                                                       phase="Running")

        loop = asyncio.get_running_loop()

        def delivered_while_building(**kwargs: Any) -> Any:
            """In the worker thread, after the copy this build reads: the watch delivers `late` (on the loop)."""
            fed._builder.build = build  # type: ignore[method-assign]
            applied = threading.Event()

            def deliver() -> None:
                fed._apply(PODS, fed._stores["pods"], late, deleted=False)
                applied.set()

            loop.call_soon_threadsafe(deliver)
            applied.wait(timeout=10)
            return build(**kwargs)

        fed._builder.build = delivered_while_building  # type: ignore[method-assign]
        pauses.end()
        await run.until(lambda: "team-a/bound" in fed.snapshot.pods, "the rebuild published")
        assert set(fed.unbuilt()) == {"team-a/waiting"}, "bound while the rebuild ran: not in what it built"
        assert fed.snapshot.pods["team-a/waiting"].node_name is None
        pauses.end()
        await run.until(lambda: fed.snapshot.pods["team-a/waiting"].node_name == "gpu-2", "the next rebuild")
        assert fed.unbuilt() == {}


async def test_a_node_heartbeat_leaves_its_node_as_built(fake_api: FakeApi, running: Running) -> None:
    """The store keeps the object the builder knows while what the snapshot reads is the same: the next rebuild
    (here for a new pod) neither parses nor assembles the node again."""
    seed(fake_api)
    await running.until(lambda: running.feeder.synced, "synced")
    before = running.feeder.snapshot.nodes["gpu-2"]
    heartbeat = builders.gpu_node("gpu-2", gpus=4)
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-21T10:00:10Z"
    fake_api.put("nodes", heartbeat)
    fake_api.put("pods", builders.pod("late", gpus=1))
    await running.until(lambda: "default/late" in running.feeder.snapshot.pods, "the new pod")
    assert running.feeder.snapshot.nodes["gpu-2"] is before


async def test_synced_only_after_every_kind_is_listed(fake_api: FakeApi, api_client: client.ApiClient) -> None:
    seed(fake_api)
    fake_api.hold[PATHS["priorityclasses"]] = asyncio.Event()
    fed = feeder.Feeder(config=CONFIG, api=api_client, prometheus=None)
    changed = fed.subscribe()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(fed.run())
        await eventually(
            lambda: fake_api.lists("pods") + fake_api.lists("nodes") + fake_api.lists("namespaces") == 3, "3 listed"
        )
        await asyncio.sleep(0.1)  # several publish rounds
        assert (fed.synced, fed.snapshot.taken_at, changed.is_set()) == (False, None, False)
        fake_api.hold[PATHS["priorityclasses"]].set()
        async with asyncio.timeout(20):
            await changed.wait()
        assert fed.synced and len(fed.snapshot.priority_classes) == 3
        task.cancel()


async def test_410_gone_event_relists(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    await running.until(lambda: running.feeder.synced, "synced")
    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    # A change the watch missed (compacted away); only a relist can see it.
    fake_api.put(
        "pods", builders.pod("missed", namespace="team-a", gpus=1, node="gpu-2", phase="Running"), broadcast=False
    )
    fake_api.send("pods", {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}})
    await running.until(lambda: "team-a/missed" in running.feeder.snapshot.pods, "relisted after 410 event")
    assert fake_api.lists("pods") == 2
    assert running.metric("gpu_steward_feeder_relists_total", kind="pods") == 2
    assert running.metric("gpu_steward_feeder_errors_total", source="pods") == 0


async def test_a_relist_is_followed_in_unbuilt_like_the_events_it_stands_for(
        fake_api: FakeApi, api_client: client.ApiClient) -> None:
    async with paused_feeder(fake_api, api_client) as (fed, run, pauses):
        await run.until(lambda: fed.synced and pauses.holding, "synced, then pausing")
        await run.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
        fake_api.put("pods", builders.pod("missed", namespace="team-a", gpus=1, node="gpu-2", phase="Running"),
                     broadcast=False)
        fake_api.send("pods", {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}})
        await run.until(lambda: "team-a/missed" in fed._stores["pods"], "relisted")
        assert set(fed.unbuilt()) == {"team-a/missed"}, "bound since the snapshot; the listed others hold as before"
        pauses.end()
        await run.until(lambda: "team-a/missed" in fed.snapshot.pods, "published")
        assert fed.unbuilt() == {}


RECORDED = [line for line in (pathlib.Path(__file__).parent.parent / "fixtures" / "watch" / "pods.jsonl").read_bytes()
            .splitlines() if line.strip()]  # BOOKMARK, ADDED, MODIFIED x3, DELETED from kube-apiserver 1.37


async def test_recorded_watch_lines_reach_the_snapshot_as_json_decodes_them(
        fake_api: FakeApi, running: Running) -> None:
    """Lines as kube-apiserver wrote them (unicode, escapes, a 19-digit string; one with an integer beyond 64 bits)
    give the snapshot the very objects the standard library's json makes of them."""
    seed(fake_api)
    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    big = RECORDED[3].replace(b'"restartCount":0', b'"restartCount":18446744073709551616')

    def holds(want: Obj) -> Callable[[], bool]:
        return lambda: (pod := running.feeder.snapshot.pods.get("default/train-0")) is not None and pod.raw == want

    for line in [*RECORDED[:5], big]:  # BOOKMARK first: it changes no pod
        fake_api.send("pods", line)
        event = json.loads(line)
        if event["type"] != "BOOKMARK":
            await running.until(holds(event["object"]), f"{event['type']} applied")
            assert repr(running.feeder.snapshot.pods["default/train-0"].raw) == repr(event["object"])
    status = running.feeder.snapshot.pods["default/train-0"].raw["status"]
    assert status["containerStatuses"][0]["restartCount"] == 2**64
    fake_api.send("pods", RECORDED[5])
    await running.until(lambda: "default/train-0" not in running.feeder.snapshot.pods, "DELETED applied")
    assert running.metric("gpu_steward_feeder_errors_total", source="pods") == 0


async def test_a_malformed_watch_line_is_an_error_that_rewatches(
        fake_api: FakeApi, running: Running, caplog: pytest.LogCaptureFixture) -> None:
    seed(fake_api)
    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    fake_api.send("pods", RECORDED[3][:1000])  # cut short
    await running.until(lambda: running.metric("gpu_steward_feeder_errors_total", source="pods") == 1, "error")
    await eventually(lambda: len(fake_api.watches("pods")) == 2, "re-watching")
    assert re.search(r"pods: watch event is not JSON: [^:]+: line 1 column \d+ \(char \d+\): "
                     r"b'\{\"type\":\"MODIFIED\",\"object\":\{\"kind\":\"Pod\"", caplog.text), caplog.text
    assert fake_api.lists("pods") == 1
    assert sorted(running.feeder.snapshot.pods) == [f"team-a/train-{i}" for i in range(5)]
    fake_api.send("pods", RECORDED[1])
    await running.until(lambda: "default/train-0" in running.feeder.snapshot.pods, "the next line is read")


async def test_http_410_on_watch_relists(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    fake_api.fail[PATHS["nodes"]] = [410]
    fake_api.send("nodes", None)  # the server ends the watch; the re-watch gets HTTP 410
    await running.until(lambda: fake_api.lists("nodes") == 2, "relisted after HTTP 410")
    assert running.metric("gpu_steward_feeder_watch_restarts_total", kind="nodes") == 1


async def test_watch_end_resumes_from_last_resource_version(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    fake_api.put("namespaces", builders.namespace("team-c"))
    await running.until(lambda: "team-c" in running.feeder.snapshot.namespaces, "event seen")
    fake_api.send("namespaces", None)
    await eventually(lambda: len(fake_api.watches("namespaces")) == 2, "re-watching")
    watches = fake_api.watches("namespaces")
    assert [w["resourceVersion"] for w in watches] == [str(fake_api.revision - 1), str(fake_api.revision)]
    assert fake_api.lists("namespaces") == 1
    assert watches[-1]["allowWatchBookmarks"] == "true" and watches[-1]["timeoutSeconds"] == "300"


async def test_errors_back_off_and_recover(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    fake_api.fail[PATHS["pods"]] = [500, 503]
    await running.until(lambda: running.feeder.synced, "synced despite two failed lists")
    assert running.metric("gpu_steward_feeder_errors_total", source="pods") == 2

    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    await fake_api.stop()  # connection errors from here on
    await running.until(lambda: running.metric("gpu_steward_feeder_errors_total", source="nodes") >= 2, "retrying")
    running.clock.now = 2_000.0
    await running.until(lambda: running.feeder.snapshot.taken_at == 1_000.0, "a dead feed stops aging forward")
    assert running.metric("gpu_steward_feeder_snapshot_age_seconds") == 1_000.0
    fake_api.put("pods", builders.pod("while-down", namespace="team-a", gpus=1, node="gpu-2", phase="Running"))
    await fake_api.start()  # same port
    await running.until(lambda: "team-a/while-down" in running.feeder.snapshot.pods, "caught up after reconnect")
    await running.until(lambda: running.feeder.snapshot.taken_at == 2_000.0, "fresh again")
    assert fake_api.lists("pods") == 3  # two failures and one list: the rest was resumed by watch


async def test_error_event_other_than_410_backs_off_and_rewatches(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    fake_api.send("priorityclasses", {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}})
    await running.until(
        lambda: running.metric("gpu_steward_feeder_errors_total", source="priorityclasses") == 1, "error"
    )
    await eventually(lambda: len(fake_api.watches("priorityclasses")) == 2, "re-watching")
    assert fake_api.lists("priorityclasses") == 1


async def test_cancellation_exits_cleanly(fake_api: FakeApi, api_client: client.ApiClient) -> None:
    seed(fake_api)
    fed = feeder.Feeder(config=CONFIG, api=api_client, prometheus=None)
    task = asyncio.create_task(fed.run())
    await eventually(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("feeder:")] == []
    await eventually(lambda: fake_api.open_watches() == 0, "the server sees every watch connection closed")


def lease(holder: str, renewed: str, **annotations: str) -> Obj:
    """The descheduler's leader Lease; its own timestamps are deliberately far from the feeder's clock."""
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "gpu-steward-descheduler", "namespace": "gpu-steward", "annotations": annotations},
            "spec": {"holderIdentity": holder, "renewTime": f"2001-01-01T00:00:{renewed}.000000Z",
                     "leaseDurationSeconds": 15}}


async def test_controller_lease_is_seen_renewed_when_a_change_is_observed_on_our_clock(
    fake_api: FakeApi, api_client: client.ApiClient
) -> None:
    fake_api.put("leases", lease("replica-a", "00"))
    clock = Clock()
    fed = feeder.Feeder(config=CONFIG, api=api_client, prometheus=None, clock=clock, watch_controller=True)
    task = asyncio.create_task(fed.run())
    try:
        await eventually(lambda: len(fake_api.watches("leases")) == 1, "the Lease watched")
        assert fake_api.watches("leases")[0]["fieldSelector"] == "metadata.name=gpu-steward-descheduler"
        assert fed.controller_seen_at is None  # the first sight of a Lease says nothing about now

        clock.now = 1_010.0
        fake_api.put("leases", lease("replica-a", "02"))  # renewed
        await eventually(lambda: fed.controller_seen_at == 1_010.0, "renewal seen at our time")

        clock.now = 1_020.0
        fake_api.put("leases", lease("replica-a", "02", touched="yes"))  # not a renewal
        fake_api.send("leases", {"type": "ERROR", "object": {"kind": "Status", "code": 410}})  # relist: same Lease
        await eventually(lambda: fake_api.lists("leases") == 2, "relisted")
        assert fed.controller_seen_at == 1_010.0

        clock.now = 1_030.0
        fake_api.put("leases", lease("", "04"))  # released on shutdown
        await eventually(lambda: fed.controller_seen_at is None, "a released Lease is no controller")

        clock.now = 1_040.0
        fake_api.put("leases", lease("replica-b", "04"))  # a new leader took it
        await eventually(lambda: fed.controller_seen_at == 1_040.0, "acquisition seen at our time")

        fake_api.delete("leases", lease("replica-b", "04"))
        await eventually(lambda: fed.controller_seen_at is None, "a deleted Lease is no controller")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_lease_is_not_watched_unless_asked(fake_api: FakeApi, running: Running) -> None:
    seed(fake_api)
    await running.until(lambda: fake_api.open_watches() == len(feeder.KINDS), "watching every kind")
    assert fake_api.lists("leases") == 0 and running.feeder.controller_seen_at is None


async def test_budgets_are_left_out_by_a_reader_that_never_evicts(
    fake_api: FakeApi, api_client: client.ApiClient
) -> None:
    """The webhook is not granted PodDisruptionBudgets: it neither lists them nor waits for them to sync."""
    seed(fake_api)
    fed = feeder.Feeder(config=CONFIG, api=api_client, prometheus=None, read_budgets=False)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(fed.run())
        await eventually(lambda: fed.synced and fake_api.open_watches() == len(feeder.KINDS) - 1, "synced, watching")
        assert fake_api.lists("poddisruptionbudgets") == 0 and fed.snapshot.taken_at is not None
        task.cancel()


async def test_raw_list_is_cheaper_than_models(fake_api: FakeApi, api_client: client.ApiClient) -> None:
    """Why `common.kube` decodes JSON itself: prints the cost of both ways for 10,000 pods."""
    for i in range(10_000):
        fake_api.put("pods", builders.pod(f"p-{i}", namespace="bench", gpus=1, node=f"n-{i % 1000}", phase="Running"))
    started = time.perf_counter()
    raw = await kube.get(api_client, PATHS["pods"], timeout_seconds=60)
    raw_seconds = time.perf_counter() - started
    started = time.perf_counter()
    models = await client.CoreV1Api(api_client).list_pod_for_all_namespaces(_request_timeout=60)
    model_seconds = time.perf_counter() - started
    assert len(raw["items"]) == len(models.items) == 10_000
    print(f"\n10,000 pods: raw JSON {raw_seconds:.2f}s, generated models {model_seconds:.2f}s")


@pytest.mark.prometheus
async def test_occupancy_from_dcgm_and_outage(
    fake_api: FakeApi,
    api_client: client.ApiClient,
    prometheus_factory: StartPrometheus,
) -> None:
    seed(fake_api)
    labels = {"Hostname": "gpu-1", "namespace": "team-a", "modelName": "NVIDIA H100"}
    server = prometheus_factory(
        [  # DCGM says train-0 holds GPU 6 and train-1 GPU 2 (the estimate would give them 0 and 1)
            Series("DCGM_FI_DEV_GPU_UTIL", {**labels, "gpu": "6", "pod": "train-0"}, [(60, 90.0), (1, 91.0)]),
            Series("DCGM_FI_DEV_GPU_UTIL", {**labels, "gpu": "2", "pod": "train-1"}, [(60, 10.0), (1, 12.0)]),
        ]
    )
    config = settings.Settings(
        kubernetes=CONFIG.kubernetes,
        prometheus=settings.Prometheus(url=server.url, occupancy_refresh_seconds=0.05, timeout_seconds=5),
    )
    registry = prometheus_client.CollectorRegistry()
    fed = feeder.Feeder(
        config=config, api=api_client, prometheus=prometheus.Client(config.prometheus), registry=registry
    )
    running = Running(fed, registry, Clock(), fed.subscribe())
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(fed.run())
        await running.until(lambda: any(pod.indices_observed for pod in fed.snapshot.pods.values()), "occupancy read")
        pods = fed.snapshot.pods
        assert (pods["team-a/train-0"].gpu_indices, pods["team-a/train-0"].indices_observed) == ((6,), True)
        assert (pods["team-a/train-1"].gpu_indices, pods["team-a/train-1"].indices_observed) == ((2,), True)
        assert pods["team-a/train-2"].indices_observed is False

        server.stop()  # failures keep the last good occupancy
        await running.until(lambda: running.metric("gpu_steward_feeder_errors_total", source="occupancy") >= 2, "down")
        fake_api.put("namespaces", builders.namespace("team-z"))  # force a rebuild while Prometheus is down
        await running.until(lambda: "team-z" in fed.snapshot.namespaces, "rebuilt")
        assert fed.snapshot.pods["team-a/train-0"].gpu_indices == (6,)
        task.cancel()


def _pod_group(name: str, policy: Obj) -> Obj:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "team-a"}, "spec": {"schedulingPolicy": policy}}


@pytest.mark.parametrize("status", [pytest.param(404, id="api-not-served"), pytest.param(403, id="not-granted")])
async def test_pod_groups_are_optional_and_picked_up_once_served(
    fake_api: FakeApi, running: Running, status: int
) -> None:
    """Before Kubernetes 1.37 (or without GenericWorkload, or without RBAC for it) the PodGroup list fails:
    the snapshot syncs without PodGroups, and reads them once the API answers."""
    seed(fake_api)
    fake_api.put("podgroups", _pod_group("gang", {"gang": {"minCount": 2}}))
    fake_api.put("podgroups", _pod_group("basic", {"basic": {}}))
    fake_api.fail[PATHS["podgroups"]] = [status] * 3
    fake_api.fail[V1ALPHA2] = [404] * 3 if status == 404 else []  # no version served (403: no other is tried)
    await running.until(lambda: running.feeder.synced, "synced without PodGroups")
    assert (running.feeder.snapshot.pod_groups.version, dict(running.feeder.snapshot.pod_groups)) == (None, {})
    # Fresh at once: an absent API must not leave the snapshot "never synced" (no release, no preferred terms).
    assert running.feeder.snapshot.taken_at is not None
    assert running.metric("gpu_steward_feeder_errors_total", source="podgroups") == 0  # absence is no error
    await running.until(lambda: len(running.feeder.snapshot.pod_groups) == 2, "PodGroups read once served")
    assert {k: g.min_count for k, g in running.feeder.snapshot.pod_groups.items()} == {
        "team-a/gang": 2, "team-a/basic": None}
    assert running.feeder.snapshot.pod_groups.version == "v1beta1"
    fake_api.delete("podgroups", _pod_group("gang", {}))
    await running.until(lambda: list(running.feeder.snapshot.pod_groups) == ["team-a/basic"], "watched deletion")


async def test_pod_groups_are_read_from_the_version_served(fake_api: FakeApi, running: Running) -> None:
    """Kubernetes 1.36 serves PodGroups as v1alpha2 only (v1beta1 and v1alpha3 answer 404): they are read and
    watched there, their string `disruptionMode` understood; until then the snapshot says no API is served."""
    seed(fake_api)
    fake_api.fail[PATHS["podgroups"]] = [404] * 10_000
    fake_api.fail[V1ALPHA2] = [404]  # not served at first either
    group = _pod_group("gang", {"gang": {"minCount": 2}})
    fake_api.put("podgroups-v1alpha2", {**group, "apiVersion": "scheduling.k8s.io/v1alpha2",
                                        "spec": {**group["spec"], "disruptionMode": "PodGroup"}})
    await running.until(lambda: running.feeder.synced, "synced without PodGroups")
    assert (running.feeder.snapshot.pod_groups.version, dict(running.feeder.snapshot.pod_groups)) == (None, {})
    await running.until(lambda: len(running.feeder.snapshot.pod_groups) == 1, "PodGroups read from v1alpha2")
    assert running.feeder.snapshot.pod_groups.version == "v1alpha2"
    assert running.feeder.snapshot.pod_groups["team-a/gang"] == gangs.PodGroup("team-a", "gang", 2, "all")
    await running.until(lambda: bool(fake_api.watches("podgroups-v1alpha2")), "watched at v1alpha2")
    basic = {**_pod_group("basic", {"basic": {}}), "apiVersion": "scheduling.k8s.io/v1alpha2"}
    fake_api.put("podgroups-v1alpha2", basic)
    await running.until(lambda: "team-a/basic" in running.feeder.snapshot.pod_groups, "a v1alpha2 watch event")
    assert running.metric("gpu_steward_feeder_errors_total", source="podgroups") == 0


@pytest.mark.parametrize("status", [pytest.param(404, id="api-not-served"), pytest.param(403, id="not-granted")])
async def test_dra_gpus_are_read_where_resource_k8s_io_is_served(
    fake_api: FakeApi, running: Running, status: int
) -> None:
    """A node whose GPUs are DRA devices (no nvidia.com/gpu in its allocatable) is a GPU node once the DeviceClass,
    its ResourceSlice and the claims are read; while resource.k8s.io/v1 is not served (or not granted), it has no
    GPUs, a pod asking devices through claims is no GPU pod, and the snapshot still syncs."""
    seed(fake_api)
    fake_api.put("nodes", builders.dra_node("dra-0", domains=[range(4), range(4, 8)]))
    fake_api.put("pods", builders.pod("claimer", namespace="team-a", node="dra-0", phase="Running",
                                      mutate=builders.with_claim_template("four", generated="claimer-gpus")))
    fake_api.put("deviceclasses", builders.device_class())
    fake_api.put("resourceslices", builders.resource_slice("dra-0", 8))
    fake_api.put("resourceclaimtemplates", builders.claim_template("four", namespace="team-a",
                                                                   spec=builders.claim_spec(4)))
    fake_api.put("resourceclaims", builders.resource_claim(
        "claimer-gpus", namespace="team-a", spec=builders.claim_spec(4), devices=[("dra-0", i) for i in (4, 5, 6, 7)],
        reserved_for=["claimer"]))
    for kind in ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates", "devicetaintrules"):
        fake_api.fail[PATHS[kind]] = [status] * 3
    await running.until(lambda: running.feeder.synced, "synced without DRA")
    # Not known to ask GPUs: no GPU pod (nothing gates, tiers or evicts it).
    assert ("dra-0" in running.feeder.snapshot.nodes, "team-a/claimer" in running.feeder.snapshot.pods) == (
        False, False)
    # Each DRA kind is listed on its own schedule once served: wait for the node and the claim's pod both.
    await running.until(lambda: "dra-0" in running.feeder.snapshot.nodes
                        and "team-a/claimer" in running.feeder.snapshot.pods, "DRA read once served")
    node, pod = running.feeder.snapshot.nodes["dra-0"], running.feeder.snapshot.pods["team-a/claimer"]
    assert (node.gpu_count, node.free_by_domain(), pod.gpu_indices, pod.dra.left) == (
        8, ((0, 1, 2, 3), ()), (4, 5, 6, 7), None)
