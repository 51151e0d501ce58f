"""`gpu-steward webhook`: serve the mutating admission webhook over TLS.

Live, the cluster snapshot comes from `common.feeder` (list+watch, DCGM occupancy); with
`--cluster STATE.json` it is a fixed file, for offline replay, demos and tests. Live, the gate lifter
(`admission.gate_lifter`) also runs: while the descheduler's Lease is stale it lifts our gate from pods past
their bound, so that no gate outlives its controller. The server and the
feeder run as named tasks of one TaskGroup; SIGTERM/SIGINT only resolve a future, and the group is
then cancelled, which stops the listener and closes connections within `SHUTDOWN_SECONDS`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import signal
import ssl
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import prometheus_client

from admission import server, tls
from common import httpserver, settings, source
from gpu_steward import cmdline

log = logging.getLogger(__name__)

# Time given to in-flight requests at shutdown; the API server's webhook timeout is a few seconds.
SHUTDOWN_SECONDS = 3.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = cmdline.command(sub, "webhook", run=run, parents=[cmdline.connection_parent()],
                             help="serve the mutating admission webhook (tiers, NVLink affinity, gang gates)",
                             description="Serve AdmissionReview admission.k8s.io/v1 on POST /mutate over TLS, with\n"
                                         "/healthz, /readyz and /metrics. Flags override the settings file and\n"
                                         "environment.")
    parser.add_argument(
        "--cluster",
        type=pathlib.Path,
        help="serve from a fixed cluster state (kubectl get nodes,pods,priorityclasses,namespaces -A -o json) "
        "instead of watching the API server; no descheduler Lease is watched then, so no pod is gated for "
        "placement at release (gangs still are)",
    )
    parser.add_argument("--host", help="listen address (webhook.host)")
    parser.add_argument("--port", type=int, help="listen port (webhook.port)")
    parser.add_argument("--cert-file", type=pathlib.Path, help="PEM serving certificate (webhook.cert_file)")
    parser.add_argument("--key-file", type=pathlib.Path, help="PEM private key (webhook.key_file)")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    flags = {"host": args.host, "port": args.port, "cert_file": args.cert_file, "key_file": args.key_file}
    given = {key: str(value) if isinstance(value, pathlib.Path) else value for key, value in flags.items()}
    return {"webhook": {key: value for key, value in given.items() if value is not None}}


def run(args: argparse.Namespace) -> int:
    config = cmdline.load_settings(args, overrides=_overrides)
    if config.webhook.managed_tls.enabled and args.cluster is None:
        from admission import certmanager  # the Kubernetes client: slow to import, `--cluster` never needs it
        from common import kube

        try:
            asyncio.run(certmanager.bootstrap(config))
        except (kube.ApiError, OSError, ValueError) as exc:
            print(f"webhook: cannot set up its own TLS (webhook.managed_tls): {exc}", file=sys.stderr)
            return 2
    try:
        context = tls.ssl_context(config.webhook)
    except (ValueError, OSError, ssl.SSLError) as exc:
        print(f"webhook: cannot serve TLS: {exc}", file=sys.stderr)
        return 2
    static = None
    if args.cluster is not None:
        try:
            # A fixed state counts as taken at start: it ages, and max_snapshot_age_seconds applies.
            static = source.from_file(args.cluster, names=config.names, clock=time.time,
                                       gpu_classes=config.dra.gpu_device_classes)
        except (OSError, ValueError) as exc:
            print(f"webhook: {exc}", file=sys.stderr)
            return 2
    try:
        asyncio.run(_main(config=config, context=context, static=static))
    except settings.SettingsError:
        raise  # bad configuration found on the way (no usable kubeconfig): one line, exit 2 (cli.main)
    except Exception:
        log.exception("webhook stopped on an error")
        return 1
    return 0


async def _main(*, config: settings.Settings, context: ssl.SSLContext, static: source.StaticSource | None) -> None:
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(signum: signal.Signals) -> None:
        if not stop.done():
            stop.set_result(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        if static is not None:
            await _run_until(stop, server=_serve(config=config, snapshots=static, context=context))
        else:
            await _live(config=config, context=context, stop=stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("webhook stopped on %s", stop.result().name)


async def _live(*, config: settings.Settings, context: ssl.SSLContext, stop: asyncio.Future[Any]) -> None:
    # Imported here: the Kubernetes client takes over a second to import and `--cluster` never needs it.
    from admission import gate_lifter
    from common import feeder, kube, prometheus

    registry = prometheus_client.CollectorRegistry()
    dcgm = prometheus.Client(config.prometheus) if config.prometheus.url else None
    api = await kube.api_client(config.kubernetes)
    try:
        live = feeder.Feeder(config=config, api=api, prometheus=dcgm, registry=registry, watch_controller=True,
                            read_budgets=False)
        tasks = {
            "feeder": live.run(),
            "server": _serve(config=config, snapshots=live, context=context, registry=registry,
                             controller=lambda: live.controller_seen_at),
        }
        # No gate of ours outlives the release controller: lifted past its bound while the Lease is stale.
        tasks["gate-lifter"] = gate_lifter.run(config=config, source=live, api=api, registry=registry,
                                               controller=lambda: live.controller_seen_at)
        if config.webhook.managed_tls.enabled:
            from admission import certmanager

            tasks["tls"] = certmanager.keep(
                api, config.webhook, request_timeout_seconds=config.kubernetes.request_timeout_seconds
            )
        await _run_until(stop, **tasks)
    finally:
        await api.close()
        if dcgm is not None:
            dcgm.close()


class _Stopped(Exception):
    """Raised inside the task group to cancel every task once `stop` resolves."""


async def _run_until(stop: asyncio.Future[Any], **tasks: Coroutine[Any, Any, None]) -> None:
    try:
        async with asyncio.TaskGroup() as group:
            for name, coroutine in tasks.items():
                group.create_task(_guard(name, coroutine), name=name)
            await stop
            raise _Stopped
    except* _Stopped:
        pass


async def _guard(name: str, coroutine: Coroutine[Any, Any, None]) -> None:
    """A long-lived task that returns has failed too: say so and bring the process down."""
    await coroutine
    raise RuntimeError(f"task {name} ended unexpectedly")


async def _serve(
    *,
    config: settings.Settings,
    snapshots: source.SnapshotSource,
    context: ssl.SSLContext,
    registry: prometheus_client.CollectorRegistry | None = None,
    controller: Callable[[], float | None] = lambda: None,
) -> None:
    """`controller`: when the descheduler's Lease was last seen renewed (a fixed --cluster state sees no Lease:
    nothing is gated for release)."""
    app = server.create_app(config=config, source=snapshots, registry=registry, controller=controller)
    async with httpserver.serving(
        app, host=config.webhook.host, port=config.webhook.port, ssl_context=context, shutdown_seconds=SHUTDOWN_SECONDS
    ) as (host, port):
        log.info("webhook serving on https://%s:%d/mutate", host, port)
        await asyncio.Event().wait()  # until cancelled
