"""Keeps the shared cluster `Snapshot` fresh: list+watch of Nodes, Pods, PriorityClasses, Namespaces
and, where the API server serves them (`GenericWorkload`), native PodGroups (the first version of
`gangs.POD_GROUP_VERSIONS` served: v1beta1 on 1.37, v1alpha2 on 1.36; found again at every list), plus
GPU-index occupancy from DCGM series in Prometheus.

    feeder = Feeder(config=cfg, api=api, prometheus=client_or_none, registry=registry)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(feeder.run())        # runs until cancelled
        ... feeder.snapshot, feeder.synced  # read at any time, never blocks

Each kind is listed (paged), then watched from the list's resourceVersion; a watch the server ends
is resumed from the last resourceVersion seen; 410 Gone (an ERROR event or an HTTP 410) relists;
any other failure waits a jittered, doubling backoff and tries again. An optional kind whose list answers
404 (API not served) or 403 (not granted to us) counts as listed and empty, and is tried again every
`kubernetes.backoff_max_seconds`, so a cluster that turns the API on later is picked up. Raw objects live in per-kind
stores; a separate task rebuilds the immutable snapshot off the event loop at most once per
`kubernetes.rebuild_interval_seconds`, so a reader never waits for a rebuild; the first change after a quiet spell is
rebuilt at once, those during the pause after a rebuild together at its end. A rebuild re-does only what changed
since the last one (`Builder`, `snapshot_build.Builder`): a pod event re-parses that pod and re-assembles the nodes it
held and holds; the result equals a snapshot built from scratch.

Freshness: `snapshot.taken_at` is the oldest of the kinds' last contact with the API server, where
a kind whose watch stream is open counts as in contact now. A dead feed therefore ages the snapshot
within one `watch_timeout_seconds + request_timeout_seconds` at worst (a silently dead connection).

Controller liveness (the webhook only, `watch_controller=True`): the descheduler's leader Lease
(`descheduler.leader_election`) is listed and watched the same way, and `controller_seen_at` is when
we last SAW it renewed — the time, on our own clock, at which an event showed a new renewTime or
holder. The Lease's own timestamps are never compared with our clock (clocks differ between
machines). The first sight of a Lease proves nothing (it may be stale), so after a start the
controller counts as seen only from its next renewal; an empty holder (released) or a deleted Lease
clears it. A feed that stops delivering events therefore ages it too.

Change notification: `subscribe()` returns an `asyncio.Event` that is set each time a rebuilt
snapshot is published (after a pod, node, ... event or an occupancy change); the subscriber clears
it before reading `feeder.snapshot`, so bursts of events coalesce into one wake-up. What the watch delivered
after the published snapshot's stores were copied is not in it; of that, the pods that newly hold a node (bound or
nominated) are `unbuilt()`, for a reader that must not act on a node a pod took a moment ago (release's last check).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import prometheus_client
from kubernetes_asyncio import client

from common import dcgm, dra, gangs, gpu, kube, prometheus, resources, settings, snapshot, snapshot_build

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    path: str
    optional: bool = False  # the API may not be served (or granted); then the kind is empty
    fallbacks: tuple[str, ...] = ()  # older versions' paths, tried in order while the one before answers 404

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.fallbacks)


POD_GROUP_PATHS = tuple(f"/apis/scheduling.k8s.io/{version}/podgroups" for version in gangs.POD_GROUP_VERSIONS)
KINDS = (
    Kind("nodes", "/api/v1/nodes"),
    Kind("pods", "/api/v1/pods"),
    Kind("priorityclasses", "/apis/scheduling.k8s.io/v1/priorityclasses"),
    Kind("namespaces", "/api/v1/namespaces"),
    Kind("podgroups", POD_GROUP_PATHS[0], optional=True, fallbacks=POD_GROUP_PATHS[1:]),
    # What the Eviction API will refuse: reclaim plans within them (not granted, e.g. to the webhook: none).
    Kind("poddisruptionbudgets", "/apis/policy/v1/poddisruptionbudgets", optional=True),
    # DRA GPUs (`common.dra`), where the cluster serves resource.k8s.io/v1 (Kubernetes 1.34+).
    *(Kind(name, f"/apis/resource.k8s.io/v1/{name}", optional=True) for name in (
        "deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates", "devicetaintrules")),
)
ABSENT_STATUSES = frozenset({403, 404})


def newly_gated(old: Mapping[str, Any] | None, new: Mapping[str, Any], *, names: settings.Names) -> bool:
    """Whether a pod's new version carries our gate and its old one (None: not seen before) did not: a pod that
    waits for release (in practice a new one: the API server lets gates be removed, never added)."""
    return gangs.gated(new, names=names) and not (old is not None and gangs.gated(old, names=names))


def _stored(kind: str, obj: dict[str, Any], *, names: settings.Names) -> dict[str, Any] | None:
    """What the store keeps of an object (None: nothing). GPU nodes, GPU pods and pods the gang controller
    needs (`gangs.involved`) whole; any other pod that holds a node's resources (bound, or nominated by the
    scheduler) only as the capacity model reads it (`resources.slim_pod`): CPU, memory, pod slots and host
    ports on GPU nodes are theirs too, and their required anti-affinity may rule a GPU node out. Other nodes
    only by name and labels: a pod's anti-affinity on one covers the GPU nodes in its topology domain (a zone).
    Everything else is dropped, so rebuilds stay proportional to what decisions read."""
    try:
        if kind == "pods":
            if gpu.pod_request(obj).any or gangs.involved(obj, names=names) or _claims_devices(obj):
                return obj
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            if spec.get("nodeName") or status.get("nominatedNodeName"):
                return resources.slim_pod(obj)
            return None
        if kind == "nodes":
            if gpu.node_allocatable(obj).any:
                return obj
            # A node whose GPUs are DRA devices has no GPU in its allocatable: keep what `snapshot_build.build` reads of
            # a GPU node (its ResourceSlices may name it at any time), without images and heartbeats.
            meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
            return {
                "metadata": {k: meta[k] for k in ("name", "labels", "annotations", "resourceVersion") if k in meta},
                "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
                "status": {**{k: status[k] for k in ("allocatable", "capacity") if k in status},
                           "conditions": [{"type": c.get("type"), "status": c.get("status")}
                                          for c in status.get("conditions") or () if isinstance(c, Mapping)]},
            }
    except gpu.QuantityError:
        return obj  # build() reports it as a problem
    return obj


def _claims_devices(pod: Mapping[str, Any]) -> bool:
    """The pod asks devices through resource claims (DRA): whether they are GPUs is the snapshot's to say."""
    return bool((pod.get("spec") or {}).get("resourceClaims")
                or (pod.get("status") or {}).get("extendedResourceClaimStatus"))


def _view(kind: str, obj: dict[str, Any]) -> Any:
    """What the snapshot reads of an object. Nodes report status every few seconds to minutes
    (heartbeats, images): only the parts `snapshot_build.build` uses may trigger a rebuild."""
    if kind != "nodes":
        return obj
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return (
        meta.get("labels"),
        meta.get("annotations"),
        spec.get("unschedulable"),
        spec.get("taints"),
        status.get("allocatable"),
        [(c.get("type"), c.get("status")) for c in status.get("conditions") or []],
    )


_NEVER_LISTED = object()  # the Lease mark before the first list: what that list shows is no renewal we saw


def lease_mark(lease: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """What changes when a Lease is renewed or changes hands: (holder, renewTime); None when nobody holds it."""
    spec = (lease or {}).get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    return (str(holder), str(spec.get("renewTime") or "")) if holder else None


class _Gone(Exception):
    """The resourceVersion we watch from has been compacted away: relist."""


class _Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.relists = prometheus_client.Counter(
            "gpu_steward_feeder_relists", "Full lists per kind (the first one included).", ["kind"], registry=registry
        )
        self.watch_restarts = prometheus_client.Counter(
            "gpu_steward_feeder_watch_restarts",
            "Watches resumed after the server ended them.",
            ["kind"],
            registry=registry,
        )
        self.errors = prometheus_client.Counter(
            "gpu_steward_feeder_errors", "Failed lists, watches and occupancy reads.", ["source"], registry=registry
        )
        self.rebuilds = prometheus_client.Counter(
            "gpu_steward_feeder_snapshot_rebuilds", "Snapshots built and published.", registry=registry
        )
        self.rebuild_seconds = prometheus_client.Summary(
            "gpu_steward_feeder_snapshot_rebuild_seconds", "Time to build one snapshot.", registry=registry
        )
        self.age = prometheus_client.Gauge(
            "gpu_steward_feeder_snapshot_age_seconds",
            "Seconds since the snapshot's data was last confirmed by the API server (-1: never).",
            registry=registry,
        )


class _Backoff:
    def __init__(self, cfg: settings.Kubernetes) -> None:
        self._cfg = cfg
        self._failures = 0

    def reset(self) -> None:
        self._failures = 0

    def next_delay(self) -> float:
        ceiling = min(self._cfg.backoff_max_seconds, self._cfg.backoff_initial_seconds * 2**self._failures)
        self._failures = min(self._failures + 1, 30)
        return random.uniform(ceiling / 2, ceiling)  # jitter: replicas must not reconnect in lockstep


class Feeder:
    def __init__(
        self,
        *,
        config: settings.Settings,
        api: client.ApiClient,
        prometheus: prometheus.Client | None,
        registry: prometheus_client.CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
        watch_controller: bool = False,
        read_budgets: bool = True,
        hurry_for_gated: bool = False,
    ) -> None:
        """`pause`: how the publisher waits out the pause after a rebuild (a test holds it to see what is batched).
        `hurry_for_gated`: a pod that newly carries our gate ends that pause early (see `_publish`): release, which
        plans on the published snapshot, is what it waits for. The descheduler's: nothing in the webhook waits on one.
        `watch_controller`: also watch the descheduler's leader Lease (`controller_seen_at`).
        `read_budgets`: list and watch PodDisruptionBudgets (reclaim plans within them); a reader that never
        evicts (the webhook, not granted them) leaves them out instead of being refused every backoff."""
        self._config = config
        self._kinds = tuple(k for k in KINDS if read_budgets or k.name != "poddisruptionbudgets")
        self._watch_controller = watch_controller
        self._lease_mark: object = _NEVER_LISTED
        self._controller_seen_at: float | None = None
        self._api = api
        self._prometheus = prometheus
        self._clock = clock
        self._pause = pause
        self._metrics = _Metrics(registry if registry is not None else prometheus_client.CollectorRegistry())
        self._metrics.age.set_function(self._age)
        self._stores: dict[str, dict[str, dict[str, Any]]] = {k.name: {} for k in KINDS}  # build() reads all
        self._listed: set[str] = set()
        self._not_served: set[str] = set()  # optional kinds whose API is not served or granted to us
        self._paths: dict[str, str] = {k.name: k.path for k in KINDS}  # the path each kind was last listed from
        self._contact: dict[str, float] = {}  # kind -> last confirmed contact
        self._streaming: set[str] = set()  # kinds whose watch stream is open right now
        self._occupancy: snapshot.Occupancy | None = None
        self._dirty = False
        self._wake = asyncio.Event()  # set by `_changed`: a change after a quiet spell is published at once
        self._hurry_for_gated = hurry_for_gated
        self._hurry = asyncio.Event()  # set when a pod newly gated by us arrives (`hurry_for_gated`)
        self._synced = False
        self._snapshot = snapshot.EMPTY
        self._builder = Builder(names=config.names, gpu_classes=config.dra.gpu_device_classes)
        self._subscribers: set[asyncio.Event] = set()
        # Pods that newly hold a node (bound or nominated) since the published snapshot's stores were copied: key ->
        # (change number, object), pruned when a snapshot built from a later copy is published (`unbuilt()`).
        self._holding: dict[str, tuple[int, dict[str, Any]]] = {}
        self._changes = 0

    # --- what readers see -------------------------------------------------------------------------

    @property
    def snapshot(self) -> snapshot.Snapshot:
        return self._snapshot

    @property
    def synced(self) -> bool:
        """True once a snapshot built from a full list of every kind has been published."""
        return self._synced

    def unbuilt(self) -> dict[str, dict[str, Any]]:
        """Pods the watch delivered since the published snapshot's stores were copied that newly hold a node (bound,
        or nominated: `snapshot.held_on` changed to a node): key -> the stored object. What release checks right
        before a nomination (`planning.overtaken`), a rebuild sooner than the snapshot would show them. A pod changed
        again after it newly held its node may be in it although the snapshot shows it there already (each later
        event of it renews its entry): a reader compares with the snapshot."""
        return {key: obj for key, (_, obj) in self._holding.items()}

    @property
    def controller_seen_at(self) -> float | None:
        """When (our clock) the leader Lease was last seen renewed; None: not since start, released or deleted."""
        return self._controller_seen_at

    def subscribe(self) -> asyncio.Event:
        """An event set on every snapshot publication with new content; clear it, then read `snapshot`."""
        event = asyncio.Event()
        self._subscribers.add(event)
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._subscribers.discard(event)

    # --- the loops --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Feed until cancelled. Failures are retried forever; only cancellation ends it."""
        async with asyncio.TaskGroup() as tg:
            for kind in self._kinds:
                tg.create_task(self._feed(kind), name=f"feeder:{kind.name}")
            tg.create_task(self._publish(), name="feeder:publish")
            if self._watch_controller:
                tg.create_task(self._retrying("lease", self._list_lease, self._watch_lease), name="feeder:lease")
            if self._prometheus is not None:
                tg.create_task(self._refresh_occupancy(self._prometheus), name="feeder:occupancy")

    async def _feed(self, kind: Kind) -> None:
        await self._retrying(kind.name, lambda: self._list(kind),
                             lambda version, backoff: self._watch(kind, version, backoff), kind=kind)

    async def _retrying(
        self,
        name: str,
        list_: Callable[[], Awaitable[str]],
        watch: Callable[[str, _Backoff], Awaitable[str]],
        *,
        kind: Kind | None = None,
    ) -> None:
        """List, then watch from the list's resourceVersion, forever: resume a watch the server ended, relist on
        410 Gone, back off on other failures; an optional `kind` whose API is not served counts as empty."""
        cfg = self._config.kubernetes
        backoff = _Backoff(cfg)
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await list_()
                    backoff.reset()
                resource_version = await watch(resource_version, backoff)
                self._metrics.watch_restarts.labels(name).inc()
            except _Gone:
                logger.info("%s: resourceVersion %s expired (410 Gone), relisting", name, resource_version)
                resource_version = None
            except (kube.ApiError, aiohttp.ClientError, TimeoutError) as exc:
                if isinstance(exc, kube.ApiError) and exc.status == 410:
                    resource_version = None  # a list's continue token expired, or an HTTP 410 watch
                    logger.info("%s: 410 Gone (%s), relisting", name, exc)
                    continue
                if kind is not None and kind.optional and isinstance(exc, kube.ApiError) \
                        and exc.status in ABSENT_STATUSES:
                    resource_version = None
                    await self._absent(kind, exc)
                    continue
                self._metrics.errors.labels(name).inc()
                delay = backoff.next_delay()
                logger.warning("%s: %s; retrying in %.2fs", name, exc or type(exc).__name__, delay)
                await asyncio.sleep(delay)

    async def _absent(self, kind: Kind, exc: kube.ApiError) -> None:
        """The kind's API is not served to us: it counts as listed, empty and in contact, until tried again."""
        if kind.name not in self._listed or self._stores[kind.name]:
            logger.info("%s: %s (HTTP %d); treated as none, checked again every %gs", kind.name, exc, exc.status,
                        self._config.kubernetes.backoff_max_seconds)
            self._stores[kind.name] = {}
            self._listed.add(kind.name)
            self._not_served.add(kind.name)
            self._changed()
        self._contact[kind.name] = self._clock()  # in contact now, not only after the wait: it blinds no snapshot
        self._streaming.add(kind.name)
        try:
            await asyncio.sleep(self._config.kubernetes.backoff_max_seconds)
        finally:
            self._streaming.discard(kind.name)
            self._contact[kind.name] = self._clock()

    async def _list(self, kind: Kind) -> str:
        for path in kind.paths[:-1]:
            try:
                return await self._list_from(kind, path)
            except kube.ApiError as exc:
                if exc.status != 404:
                    raise
        return await self._list_from(kind, kind.paths[-1])

    async def _list_from(self, kind: Kind, path: str) -> str:
        cfg = self._config.kubernetes
        items: dict[str, dict[str, Any]] = {}
        query: dict[str, kube.QueryValue] = {"limit": cfg.list_page_size}
        while True:
            page = await kube.get(self._api, path, timeout_seconds=cfg.request_timeout_seconds, query=query)
            for item in page.get("items") or []:
                kept = _stored(kind.name, item, names=self._config.names)
                if kept is not None:
                    items[_key(item)] = kept
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            query = {"limit": cfg.list_page_size, "continue": meta["continue"]}
        resource_version = str(meta.get("resourceVersion") or "")
        if not resource_version:
            raise kube.ApiError(0, f"{kind.name}: list without a resourceVersion")
        if kind.name == "pods":  # a relist (410 Gone) is followed like the watch events it stands for
            old = self._stores["pods"]
            self._holding = {key: held for key, held in self._holding.items() if key in items}
            for key, obj in items.items():
                self._note_holding(key, old.get(key), obj)
        self._stores[kind.name] = items
        self._paths[kind.name] = path
        self._listed.add(kind.name)
        self._not_served.discard(kind.name)
        self._contact[kind.name] = self._clock()
        self._changed()
        self._metrics.relists.labels(kind.name).inc()
        logger.debug("%s: listed %d at resourceVersion %s", kind.name, len(items), resource_version)
        return resource_version

    async def _watch(self, kind: Kind, resource_version: str, backoff: _Backoff) -> str:
        cfg = self._config.kubernetes
        store = self._stores[kind.name]
        try:
            async for event in kube.watch(
                self._api,
                self._paths[kind.name],
                resource_version=resource_version,
                server_timeout_seconds=cfg.watch_timeout_seconds,
                timeout_seconds=cfg.request_timeout_seconds,
                on_connect=lambda: self._streaming.add(kind.name),
            ):
                kind_of_event, obj = _checked(kind.name, event)
                if kind_of_event != "BOOKMARK":
                    self._apply(kind, store, obj, deleted=kind_of_event == "DELETED")
                resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
                backoff.reset()
        finally:
            if kind.name in self._streaming:  # alive until this moment
                self._streaming.discard(kind.name)
                self._contact[kind.name] = self._clock()
        return resource_version

    def _apply(self, kind: Kind, store: dict[str, dict[str, Any]], obj: dict[str, Any], *, deleted: bool) -> None:
        key = _key(obj)
        old = store.pop(key, None)
        kept = None if deleted else _stored(kind.name, obj, names=self._config.names)
        if kept is not None:
            if old is not None and _view(kind.name, old) == _view(kind.name, kept):
                # The same as far as the snapshot reads (a node's heartbeat): keep the object the builder knows, so
                # that no rebuild parses and assembles that node again.
                store[key] = old
                return
            store[key] = kept
            if kind.name == "pods":
                self._note_holding(key, old, kept)
                if self._hurry_for_gated and newly_gated(old, kept, names=self._config.names):
                    self._hurry.set()
        elif old is None:
            return
        else:
            self._holding.pop(key, None)
        self._changed()

    def _note_holding(self, key: str, old: Mapping[str, Any] | None, new: dict[str, Any]) -> None:
        self._changes += 1
        node = snapshot.held_on(new)
        if node is None:
            self._holding.pop(key, None)
        elif key in self._holding or node != (snapshot.held_on(old) if old is not None else None):
            self._holding[key] = (self._changes, new)

    def _lease_path(self) -> tuple[str, dict[str, kube.QueryValue]]:
        election = self._config.descheduler.leader_election
        path = f"/apis/coordination.k8s.io/v1/namespaces/{election.lease_namespace}/leases"
        return path, {"fieldSelector": f"metadata.name={election.lease_name}"}

    async def _list_lease(self) -> str:
        path, query = self._lease_path()
        page = await kube.get(self._api, path, timeout_seconds=self._config.kubernetes.request_timeout_seconds,
                              query=query)
        items = page.get("items") or []
        self._observe_lease(items[0] if items else None)
        resource_version = str((page.get("metadata") or {}).get("resourceVersion") or "")
        if not resource_version:
            raise kube.ApiError(0, "lease: list without a resourceVersion")
        return resource_version

    async def _watch_lease(self, resource_version: str, backoff: _Backoff) -> str:
        cfg = self._config.kubernetes
        path, query = self._lease_path()
        async for event in kube.watch(self._api, path, resource_version=resource_version, query=query,
                                      server_timeout_seconds=cfg.watch_timeout_seconds,
                                      timeout_seconds=cfg.request_timeout_seconds):
            kind_of_event, obj = _checked("lease", event)
            if kind_of_event != "BOOKMARK":
                self._observe_lease(None if kind_of_event == "DELETED" else obj)
            resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
            backoff.reset()
        return resource_version

    def _observe_lease(self, lease: Mapping[str, Any] | None) -> None:
        mark = lease_mark(lease)
        if mark is None:
            self._controller_seen_at = None
        elif mark != self._lease_mark and self._lease_mark is not _NEVER_LISTED:
            self._controller_seen_at = self._clock()
        self._lease_mark = mark

    async def _refresh_occupancy(self, client: prometheus.Client) -> None:
        cfg = self._config.prometheus
        query = dcgm.occupancy_query(cfg)
        while True:
            try:
                result = await client.query(query)
            except prometheus.PrometheusError as exc:
                self._metrics.errors.labels("occupancy").inc()
                logger.warning("occupancy: %s; keeping the last good occupancy", exc)
            else:
                occupancy, problems = dcgm.parse_occupancy(result, labels=cfg.labels)
                if occupancy != self._occupancy:
                    self._occupancy = occupancy
                    self._changed()
                logger.debug(
                    "occupancy: %d series, %d GPUs attributed, %d series unused%s",
                    len(result),
                    sum(len(v) for v in occupancy.values()),
                    len(problems),
                    f" (first: {problems[0]})" if problems else "",
                )
            await asyncio.sleep(cfg.occupancy_refresh_seconds)

    def _changed(self) -> None:
        self._dirty = True
        self._wake.set()

    async def _publish(self) -> None:
        """Rebuild when something changed, else only move `taken_at`; at most once per interval.

        The first change after a quiet spell is rebuilt at once (a lone gated pod is released without waiting out
        an interval); changes that come while a rebuild's pause runs are batched into one rebuild at its end. The
        pause after a rebuild is at least as long as the rebuild took: under constant churn in a big cluster
        rebuilding then takes at most half of a core (and of the GIL the webhook needs). With `hurry_for_gated`,
        a pod newly gated by us ends the pause once it has lasted as long as the rebuild took: under churn a gated
        pod then waits about one rebuild for release to see it, not half an interval on average.
        """
        interval = self._config.kubernetes.rebuild_interval_seconds
        while True:
            self._wake.clear()  # before looking: a change from here on wakes the wait below
            if self._dirty and len(self._listed) == len(self._kinds):
                self._dirty = False
                self._hurry.clear()  # before the stores are read: a gated pod from here on is not in this rebuild
                took = await self._rebuild()
                await self._rest(full=max(interval, took), floor=took)
                continue
            if self._snapshot.taken_at != (taken_at := self._taken_at()):
                self._snapshot = dataclasses.replace(self._snapshot, taken_at=taken_at)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()

    async def _rest(self, *, full: float, floor: float) -> None:
        """The pause after a rebuild: `full` seconds, or (`hurry_for_gated`) until a pod newly gated by us has
        arrived and `floor` seconds have passed."""
        if not self._hurry_for_gated:
            await self._pause(full)
            return

        async def hurried() -> None:
            await self._pause(floor)
            await self._hurry.wait()

        waits = [asyncio.ensure_future(self._pause(full)), asyncio.ensure_future(hurried())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _rebuild(self) -> float:
        """Build and publish a snapshot; returns how long the build took (seconds)."""
        # Shallow copies: stores are only ever given new dicts, never mutated ones, so the worker
        # thread reads a consistent set while the watches go on (and the builder keeps them until the next build).
        stores = {name: dict(store) for name, store in self._stores.items()}
        copied = self._changes
        occupancy, taken_at = self._occupancy, self._taken_at()
        started = time.perf_counter()
        # Claims are what a pod's DRA GPUs are read from: without them (not served, not granted) none is counted.
        served = not ({"resourceslices", "resourceclaims", "deviceclasses"} & self._not_served)
        built = await asyncio.to_thread(
            self._builder.build,
            stores=stores,
            served=served,
            pod_group_version=None if "podgroups" in self._not_served else self._paths["podgroups"].split("/")[3],
            occupancy=occupancy,
            taken_at=taken_at,
        )
        took = time.perf_counter() - started
        self._metrics.rebuild_seconds.observe(took)
        self._metrics.rebuilds.inc()
        self._snapshot = built
        self._holding = {key: held for key, held in self._holding.items() if held[0] > copied}
        self._synced = True
        for event in self._subscribers:
            event.set()
        return took

    def _taken_at(self) -> float | None:
        if len(self._contact) < len(self._kinds):
            return None
        now = self._clock()
        return min(now if name in self._streaming else at for name, at in self._contact.items())

    def _age(self) -> float:
        age = self._snapshot.age(self._clock())
        return -1.0 if age is None else age


DRA_KINDS = ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates", "devicetaintrules")


class Builder:
    """The feeder's stores to a snapshot, in a worker thread: the DRA inventory (built again only when a DRA object
    changed), then the snapshot (`snapshot_build.Builder`: only what changed is done again). Pure; one build at a
    time."""

    def __init__(self, *, names: settings.Names, gpu_classes: tuple[str, ...]) -> None:
        self._snapshots = snapshot_build.Builder(names=names)
        self._gpu_classes = gpu_classes
        self._dra_objects: tuple[Any, ...] | None = None  # the DRA objects and `served` the inventory was built from
        self._inventory = dra.EMPTY
        self._dra_memo = dra.Memo()

    def build(self, *, stores: Mapping[str, Mapping[str, dict[str, Any]]], served: bool,
              pod_group_version: str | None, occupancy: snapshot.Occupancy | None,
              taken_at: float | None) -> snapshot.Snapshot:
        """`stores`: kind -> key -> object (copies: kept until the next build)."""
        lists = {name: list(stores[name].values()) for name in DRA_KINDS}
        objects = (served, *(obj for name in DRA_KINDS for obj in (len(lists[name]), *lists[name])))
        if self._dra_objects is None or len(objects) != len(self._dra_objects) or any(
                a is not b and a != b for a, b in zip(objects, self._dra_objects, strict=True)):
            self._inventory = dra.build(
                device_classes=lists["deviceclasses"], slices=lists["resourceslices"], claims=lists["resourceclaims"],
                templates=lists["resourceclaimtemplates"], taint_rules=lists["devicetaintrules"],
                gpu_classes=self._gpu_classes, served=served, memo=self._dra_memo)
            self._dra_objects = objects
        return self._snapshots.build(
            nodes=stores["nodes"], pods=stores["pods"], priority_classes=stores["priorityclasses"].values(),
            namespaces=stores["namespaces"].values(), pod_groups=stores["podgroups"].values(),
            pod_group_version=pod_group_version, disruption_budgets=stores["poddisruptionbudgets"].values(),
            occupancy=occupancy, taken_at=taken_at, inventory=self._inventory)


def _checked(name: str, event: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A watch event's type and object; ERROR events raise (410: `_Gone`, relist)."""
    kind_of_event, obj = event.get("type"), event["object"]
    if kind_of_event == "ERROR":
        if obj.get("code") == 410:
            raise _Gone()
        raise kube.ApiError(int(obj.get("code") or 0), str(obj.get("message") or obj), body=obj)
    if kind_of_event not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        raise kube.ApiError(0, f"{name}: unknown watch event type {kind_of_event!r}")
    return str(kind_of_event), obj


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))
