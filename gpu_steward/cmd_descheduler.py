"""`gpu-steward descheduler`: gang release and idle-GPU reclaim (Lease leader election, SIGTERM-safe).

    gpu-steward descheduler --once --dry-run --output json          # live cluster, decide only
    gpu-steward descheduler --once --cluster STATE.json --prometheus-url http://...  # offline

`--cluster` replays `kubectl get nodes,pods,priorityclasses,namespaces -A -o json`; with no API
server nothing can be evicted, so it always runs as a dry-run. `--once` runs one cycle and prints its
plan (`--output json`: `{"evictions": [...], "spared": [...]}`). That cycle first reads every utilisation part its
windows need (a loop reads `rebuild_parts_per_cycle` a cycle after a start), so its verdicts are a warmed-up
loop's, and when a tier learns its idle windows their whole look-back (`lookback_seconds / chunk_seconds` range
queries, 336 with the defaults), so the plan shows learned windows and their reasons; a line on stderr tells
each read's progress. Otherwise, while this replica holds
the leader Lease, the gang controller releases complete gangs (on every pod change and every
`descheduler.gangs.resync_seconds`) and reclaim cycles run every `descheduler.reclaim.interval_seconds`;
an unexpected error in one of the two loops is logged and counted, and that loop alone is restarted after a
backoff (`descheduler.loop_restart_*`).

`--metrics-port` serves `/metrics`, `/healthz` and `/readyz` (plain HTTP) from the same asyncio loop
as the work (`descheduler.health`), from before the initial sync until the process stops.

With `prometheus.url` set and reclaim on, the metrics store is checked once the snapshot is there (series of
`prometheus.gpu_util_metric` under `prometheus.scope_matchers`, a per-GPU identity, a retention of at least the
longest idle window of the PriorityClasses; `gpu-steward check --prometheus` runs the same): a failed check exits
2 with the reasons; a store that does not answer is logged and the run goes on (its cycles fail closed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import pathlib
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import prometheus_client

from common import buildinfo, httpserver, settings, snapshot, source
from descheduler import evictor, health, policy, reclaim, supervisor
from descheduler.reclaim import idle_history
from descheduler.reclaim import loop as reclaim_loop
from descheduler.release import planning
from gpu_steward import cmdline

if TYPE_CHECKING:
    from common import feeder

log = logging.getLogger("gpu_steward.descheduler")
SYNC_TIMEOUT_SECONDS = 120
# Time given to a scrape or probe in flight at SIGTERM; each answers at once.
SHUTDOWN_SECONDS = 2.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = cmdline.command(sub, "descheduler", run=run, parents=[cmdline.connection_parent()],
                             help="evict idle GPU pods by PriorityClass policy, for pending work that can use the GPUs",
                             description=__doc__)
    parser.add_argument("--once", action="store_true",
                        help="run one cycle, print its plan, exit (every utilisation part its windows need, and a "
                        "learning tier's history, are read first; progress on stderr)")
    parser.add_argument("--dry-run", action="store_true", help="decide, log and emit 'would' events; evict nothing")
    parser.add_argument("--cluster", type=pathlib.Path,
                        help="offline cluster state (a Kubernetes List); implies dry-run")
    parser.add_argument("--mode", choices=("on-demand", "always"), help="descheduler.reclaim.mode")
    parser.add_argument("--prometheus-url", help="Prometheus base URL with DCGM series")
    parser.add_argument("--prometheus-header", action="append", default=[], metavar="NAME:VALUE",
                        help="extra HTTP header for Prometheus (repeatable), e.g. 'X-Scope-OrgID: gpu'")
    parser.add_argument("--prometheus-bearer-token-file", type=pathlib.Path)
    parser.add_argument("--prometheus-ca-file", type=pathlib.Path)
    parser.add_argument("--prometheus-insecure-skip-verify", action="store_true")
    parser.add_argument("--prometheus-timeout", type=float, metavar="SECONDS")
    parser.add_argument("--kube-timeout", type=float, metavar="SECONDS", help="per API request")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve /metrics, /healthz and /readyz on this port (plain HTTP)")
    cmdline.add_output(parser)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    prom: dict[str, Any] = {}
    if args.prometheus_url:
        prom["url"] = args.prometheus_url
    if args.prometheus_header:
        headers = {}
        for header in args.prometheus_header:
            name, sep, value = header.partition(":")
            if not sep or not name.strip():
                raise settings.SettingsError(f"--prometheus-header {header!r}: expected NAME:VALUE")
            headers[name.strip()] = value.strip()
        prom["headers"] = headers
    for flag, key in (("prometheus_bearer_token_file", "bearer_token_file"), ("prometheus_ca_file", "ca_file"),
                      ("prometheus_timeout", "timeout_seconds")):
        if getattr(args, flag) is not None:
            prom[key] = str(getattr(args, flag)) if flag.endswith("file") else getattr(args, flag)
    if args.prometheus_insecure_skip_verify:
        prom["insecure_skip_verify"] = True
    kube: dict[str, Any] = {}
    if args.kube_timeout:
        kube["request_timeout_seconds"] = args.kube_timeout
    reclaim_cfg: dict[str, Any] = {}
    if args.dry_run or args.cluster:
        reclaim_cfg["dry_run"] = True
    if args.mode:
        reclaim_cfg["mode"] = args.mode
    out: dict[str, Any] = {"prometheus": prom, "kubernetes": kube, "descheduler": {"reclaim": reclaim_cfg}}
    return out


def run(args: argparse.Namespace) -> int:
    config = cmdline.load_settings(args, overrides=overrides)
    static = controllers = None
    if args.cluster:
        try:
            static = source.from_file(args.cluster, names=config.names, clock=time.time,
                                       gpu_classes=config.dra.gpu_device_classes)
            # Its ReplicaSets and Jobs, if saved too (`kubectl get ...,replicasets,jobs`): learned windows' workloads.
            controllers = idle_history.fixed_controllers(idle_history.controllers_in(
                json.loads(args.cluster.read_text()).get("items") or ()))
        except (OSError, ValueError) as exc:
            print(f"descheduler: {exc}", file=sys.stderr)
            return 2
    registry = prometheus_client.CollectorRegistry()
    buildinfo.register(registry)
    listener = None
    if args.metrics_port:
        try:
            listener = httpserver.listen(args.metrics_port)
        except (OSError, OverflowError) as exc:
            print(f"descheduler: cannot serve /metrics, /healthz and /readyz on --metrics-port {args.metrics_port}: "
                  f"{exc}", file=sys.stderr)
            return 2
    try:
        cycle = asyncio.run(_main(config=config, static=static, once=args.once, registry=registry, listener=listener,
                                  controllers=controllers))
    except settings.SettingsError:
        raise  # bad configuration found on the way (no usable kubeconfig): one line, exit 2 (cli.main)
    except Exception as exc:
        bad = _settings_error(exc)  # a failed start-up check of the metrics store, through the task group
        if bad is not None:
            raise bad from None
        log.exception("descheduler stopped on an error")
        return 1
    finally:
        if listener is not None:
            listener.close()
    if cycle is not None:
        print(json.dumps(cycle.plan.as_json(), indent=2) if args.output == "json" else as_text(cycle))
    return 0


def as_text(cycle: reclaim_loop.Cycle) -> str:
    plan = cycle.plan
    lines = [f"evict {e.pod} on {e.node}: {e.reason}" for e in plan.evictions]
    lines += [f"demand {d.demand}: {d.reason}" for d in plan.demands]
    lines += [f"spare {s.pod}: {s.reason}" for s in plan.spared]
    lines += [f"prometheus error: {e}" for e in cycle.prometheus_errors]
    lines.append(f"{len(plan.evictions)} eviction(s), {plan.candidates} idle candidate(s), "
                 f"{cycle.queries} PromQL quer{'y' if cycle.queries == 1 else 'ies'}")
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def _clients(config: settings.Settings, *, live: bool) -> AsyncIterator[tuple[Any, Any]]:
    """(Prometheus client or None, API client or None); closed on exit."""
    from common import prometheus  # imported late: `--help` stays fast

    dcgm = prometheus.Client(config.prometheus) if config.prometheus.url else None
    api = None
    try:
        if live:
            from common import kube

            api = await kube.api_client(config.kubernetes)
        yield dcgm, api
    finally:
        if api is not None:
            await api.close()
        if dcgm is not None:
            dcgm.close()


async def _main(
    *, config: settings.Settings, static: source.StaticSource | None, once: bool,
    registry: prometheus_client.CollectorRegistry, listener: socket.socket | None = None,
    controllers: idle_history.ControllerReader | None = None,
) -> reclaim_loop.Cycle | None:
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        async with _clients(config, live=static is None) as (dcgm, api):
            cluster = static if static is not None else _feeder(config=config, api=api, dcgm=dcgm, registry=registry)
            work = asyncio.create_task(
                _work(config=config, cluster=cluster, once=once, dcgm=dcgm, api=api, registry=registry,
                      controllers=controllers),
                name="descheduler-work")
            try:
                # `listener` has listened since `run`: a probe that came early is answered as soon as this
                # loop serves, whatever the work is doing (the first sync takes a while on a big cluster).
                async with _serving(listener, work=work, cluster=cluster, registry=registry):
                    waited: list[asyncio.Future[Any]] = [work, stop]
                    await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                    if not work.done():
                        log.info("descheduler stopping on a signal")
            finally:
                if not work.done():
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await work
            return None if work.cancelled() else work.result()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _feeder(
    *, config: settings.Settings, api: Any, dcgm: Any, registry: prometheus_client.CollectorRegistry,
) -> feeder.Feeder:
    from common import feeder  # imported late: the Kubernetes client is slow to import and --cluster needs none

    return feeder.Feeder(config=config, api=api, prometheus=dcgm, registry=registry,
                         hurry_for_gated=config.descheduler.gangs.early_rebuilds)


@contextlib.asynccontextmanager
async def _serving(
    listener: socket.socket | None, *, work: asyncio.Future[Any], cluster: source.SnapshotSource,
    registry: prometheus_client.CollectorRegistry,
) -> AsyncIterator[None]:
    """The health and metrics endpoints on `listener`, in this loop, while the block runs (none without one)."""
    if listener is None:
        yield
        return
    app = health.create_app(work=work, source=cluster, registry=registry)
    async with httpserver.serving(app, sock=listener, shutdown_seconds=SHUTDOWN_SECONDS) as (_, port):
        log.info("descheduler serving /metrics, /healthz and /readyz on port %d", port)
        yield


def _progress(line: str) -> None:
    """`--once`: each read before its cycle, on stderr (the plan alone goes to stdout)."""
    print(f"descheduler --once: {line}", file=sys.stderr, flush=True)


def gang_demands(config: settings.Settings) -> reclaim_loop.GangDemands:
    """What reclaim may free capacity for besides pending pods: the complete gated gangs the release planner finds
    waiting only for GPUs. Wired here, in the process, so that release and reclaim never import each other."""

    def waiting(cluster: snapshot.Snapshot, now: float) -> list[reclaim.Demand]:
        return [reclaim.gang_demand(s.gang, s.members)
                for s in planning.plan(cluster, config=config, now=now).shortages]

    return waiting


async def check_store(*, config: settings.Settings, dcgm: Any, cluster: snapshot.Snapshot) -> None:
    """The metrics store's start-up checks (common.dcgm.store_checks; the longest window: the cluster's
    PriorityClasses'): a failed one stops the process with its message (SettingsError: exit 2), where otherwise
    every pod would stay not idle forever; a store that cannot be reached is logged (the loop fails closed)."""
    if dcgm is None or not config.descheduler.reclaim.enabled:
        return
    from common import dcgm as dcgm_series
    from common import prometheus

    policies = policy.parse_all(cluster.priority_classes,
                                default_threshold_percent=config.descheduler.reclaim.default_idle_threshold_percent)
    longest = max((p.idle_seconds for p in policies.values() if p.reclaimable and p.idle_seconds), default=None)
    try:
        facts = await dcgm.store_facts()
    except prometheus.PrometheusError as exc:
        log.warning("metrics store not checked at start (pods stay not idle while it cannot be read): %s", exc)
        return
    checks = dcgm_series.store_checks(facts, config=config.prometheus, longest_window=longest)
    for ok, why in checks:
        log.info("metrics store: %s%s", "" if ok else "FAIL ", why)
    failed = [why for ok, why in checks if not ok]
    if failed:
        raise settings.SettingsError(f"metrics store at {config.prometheus.url}: {'; '.join(failed)}")


def _settings_error(exc: BaseException) -> settings.SettingsError | None:
    """The SettingsError inside `exc` (raised through task groups), if any."""
    if isinstance(exc, settings.SettingsError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next((found for inner in exc.exceptions if (found := _settings_error(inner)) is not None), None)
    return None


async def _work(
    *, config: settings.Settings, cluster: source.StaticSource | feeder.Feeder, once: bool, dcgm: Any, api: Any,
    registry: prometheus_client.CollectorRegistry, controllers: idle_history.ControllerReader | None = None,
) -> reclaim_loop.Cycle | None:
    dry_run = config.descheduler.reclaim.dry_run
    client: evictor.EvictionClient = (
        # A dry-run on the live cluster reads victims live as the real evictor does; on a file, nothing is live.
        evictor.DryRunClient(None if isinstance(cluster, source.StaticSource) else api,
                             timeout_seconds=config.kubernetes.request_timeout_seconds) if dry_run or api is None
        else evictor.ApiEvictionClient(api, timeout_seconds=config.kubernetes.request_timeout_seconds)
    )
    if isinstance(cluster, source.StaticSource):
        await check_store(config=config, dcgm=dcgm, cluster=cluster.snapshot)
        loop = reclaim_loop.ReclaimLoop(config=config, cluster=cluster, prometheus=dcgm, evictions=client, api=None,
                                        registry=registry, gang_demands=gang_demands(config), once=once,
                                        progress=_progress, controllers=controllers)
        if once:
            return await loop.cycle()
        await loop.run()
        return None

    from descheduler import leader
    from descheduler.release import controller

    live = cluster
    async with asyncio.TaskGroup() as tg:
        feeding = tg.create_task(live.run(), name="feeder")
        try:
            published = live.subscribe()
            async with asyncio.timeout(SYNC_TIMEOUT_SECONDS):
                while not live.synced:
                    await published.wait()
                    published.clear()
            live.unsubscribe(published)
            await check_store(config=config, dcgm=dcgm, cluster=live.snapshot)
            loop = reclaim_loop.ReclaimLoop(config=config, cluster=live, prometheus=dcgm, evictions=client, api=api,
                                            registry=registry, gang_demands=gang_demands(config), once=once,
                                            progress=_progress)

            gang_metrics = controller.Metrics(registry)
            failures = supervisor.Failures(registry)

            async def lead() -> None:
                """Both loops, while this replica leads; cancelled together when leadership is lost. Each one
                survives the other's unexpected errors (restarted with a backoff)."""
                changes = live.subscribe()

                def gangs() -> Coroutine[Any, Any, None]:
                    return controller.run(config=config, source=live, api=api, changes=changes,
                                               metrics=gang_metrics)

                try:
                    async with asyncio.TaskGroup() as loops:
                        loops.create_task(supervisor.keep_running("gangs", gangs, failures=failures,
                                                                  cfg=config.descheduler), name="gangs")
                        if config.descheduler.reclaim.enabled:
                            loops.create_task(supervisor.keep_running("reclaim", loop.run, failures=failures,
                                                                      cfg=config.descheduler), name="reclaim")
                finally:
                    live.unsubscribe(changes)

            elector = leader.Elector(api, config=config, registry=registry)
            if not config.descheduler.leader_election.enabled:
                if once:
                    return await loop.cycle()
                await lead()
                return None
            if once:
                if not dry_run:
                    held, why = await elector.try_acquire()
                    if not held:
                        raise RuntimeError(f"another replica leads ({why}); not evicting")
                try:
                    return await loop.cycle()
                finally:
                    if not dry_run:
                        await asyncio.shield(elector.release())
            await elector.run(lead)
            return None
        finally:
            feeding.cancel()

