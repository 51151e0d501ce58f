"""The admission webhook's HTTP shell: decode, call the pure engine, answer, record.

`POST /mutate` never denies and never fails a valid review: whatever goes wrong inside the engine,
the pod is admitted unchanged with a warning, a metric and a log line. Only a body that is not an
AdmissionReview gets an HTTP 400. `/healthz` says the process serves; `/readyz` says the snapshot
has synced; `/metrics` is the Prometheus exposition of this app's own registry.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import prometheus_client
from aiohttp import web

from admission import gating, metrics, mutation, review
from common import httpserver, settings, snapshot
from common import source as sources

log = logging.getLogger(__name__)

# An AdmissionReview carries the object and, on UPDATE, the old one: each may reach etcd's 1.5 MiB.
MAX_BODY_BYTES = 8 * 1024 * 1024


class Decide(Protocol):
    def __call__(
        self,
        *,
        operation: str,
        namespace: str | None,
        pod: Mapping[str, Any],
        cluster: snapshot.Snapshot,
        config: settings.Settings,
        now: float,
        controller_seen_at: float | None,
        request_uid: str,
    ) -> mutation.Outcome: ...


class OverBudget(Exception):
    """The engine answered, but later than `webhook.request_timeout_seconds`."""


CONFIG = web.AppKey("config", settings.Settings)
SOURCE: web.AppKey[sources.SnapshotSource] = web.AppKey("source")
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")
TIMER: web.AppKey[Callable[[], float]] = web.AppKey("timer")
DECIDE: web.AppKey[Decide] = web.AppKey("decide")
CONTROLLER: web.AppKey[Callable[[], float | None]] = web.AppKey("controller")
METRICS = web.AppKey("metrics", metrics.Metrics)


def create_app(
    *,
    config: settings.Settings,
    source: sources.SnapshotSource,
    clock: Callable[[], float] = time.time,
    timer: Callable[[], float] = time.perf_counter,
    decide: Decide = mutation.decide,
    controller: Callable[[], float | None] = lambda: None,
    registry: prometheus_client.CollectorRegistry | None = None,
) -> web.Application:
    """`clock` is wall time (the engine's `now`, the snapshot age); `timer` measures durations; `controller` says
    when the descheduler's leader Lease was last seen renewed, on `clock` (None: not seen; nothing is gated
    for release)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[CONFIG] = config
    app[SOURCE] = source
    app[CLOCK] = clock
    app[TIMER] = timer
    app[DECIDE] = decide
    app[CONTROLLER] = controller

    def controller_age() -> float | None:
        seen_at = controller()
        return None if seen_at is None else max(0.0, clock() - seen_at)

    app[METRICS] = metrics.Metrics(snapshot_age=lambda: source.snapshot.age(clock()), controller_age=controller_age,
                                   registry=registry)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    return app


@dataclasses.dataclass(frozen=True)
class _Answer:
    result: metrics.Result
    body: bytes  # the AdmissionReview answer, encoded once
    warnings: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()
    skipped: str | None = None
    release: gating.Release | None = None


def _pod_ref(request: review.Request) -> str:
    # Also called on the error path: a malformed object must not turn "admitted unchanged" into an HTTP 500.
    meta = (request.object or request.old_object or {}).get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = request.name or meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "?")
    return f"{request.namespace or meta.get('namespace') or '-'}/{name}"


def _run_engine(app: web.Application, request: review.Request, pod: Mapping[str, Any]) -> mutation.Outcome:
    budget = app[CONFIG].webhook.request_timeout_seconds
    # The engine is synchronous CPU work of about a millisecond: a thread could not interrupt it
    # (nor, under the GIL, run beside the loop), so it runs inline, is timed, and an answer that
    # came too late is replaced by the safe one.
    started = app[TIMER]()
    outcome = app[DECIDE](
        operation=request.operation,
        namespace=request.namespace,
        pod=pod,
        cluster=app[SOURCE].snapshot,
        config=app[CONFIG],
        now=app[CLOCK](),
        controller_seen_at=app[CONTROLLER](),
        request_uid=request.uid,
    )
    took = app[TIMER]() - started
    if took > budget:
        raise OverBudget(f"decision took {took:.3f}s, over the {budget:g}s budget")
    return outcome


def _answer(app: web.Application, request: review.Request) -> _Answer:
    if not request.is_pod:
        sub = f"/{request.sub_resource}" if request.sub_resource else ""
        skipped = f"not a pod ({request.kind.kind or '?'}{sub})"
        return _Answer(metrics.Result.SKIPPED, review.encode(review.allowed(request.uid)), skipped=skipped)
    if request.object is None:
        skipped = f"no pod object ({request.operation})"
        return _Answer(metrics.Result.SKIPPED, review.encode(review.allowed(request.uid)), skipped=skipped)
    try:
        outcome = _run_engine(app, request, request.object)
        # Encoded here so that a patch the encoder refuses also ends in "admitted unchanged", never a 500.
        body = review.encode(review.patched(request.uid, outcome.patch, warnings=outcome.warnings))
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
        log.error(
            "admission uid=%s pod=%s: engine failed, admitting unchanged: %s",
            request.uid,
            _pod_ref(request),
            problem,
            exc_info=not isinstance(exc, OverBudget),
        )
        warning = f"gpu-steward: pod admitted unchanged ({problem})"
        answer = review.encode(review.allowed(request.uid, warnings=[warning]))
        return _Answer(metrics.Result.ERROR, answer, warnings=(warning,))
    if outcome.skipped is not None:
        result = metrics.Result.SKIPPED
    elif outcome.patch:
        result = metrics.Result.MUTATED
    else:
        result = metrics.Result.UNCHANGED
    changes = outcome.changes if outcome.patch else ()
    return _Answer(result, body, warnings=outcome.warnings, changes=changes, skipped=outcome.skipped,
                   release=outcome.release)


async def mutate(request: web.Request) -> web.Response:
    app = request.app
    timer = app[TIMER]
    started = timer()
    body = await request.read()
    try:
        parsed = review.decode(body)
    except review.ReviewError as exc:
        app[METRICS].record(result=metrics.Result.BAD_REQUEST, seconds=timer() - started, changes=(), warnings=0)
        log.warning("admission bad request from %s: %s", request.remote, exc)
        raise web.HTTPBadRequest(text=f"{exc}\n") from None

    answer = _answer(app, parsed.request)
    seconds = timer() - started
    app[METRICS].record(result=answer.result, seconds=seconds, changes=answer.changes, warnings=len(answer.warnings),
                        release=answer.release)
    # One line per request costs as much as the decision itself; the pod's decision annotation and the
    # metrics are the record, so the line is for debugging, or for answers that warned the user.
    level = logging.INFO if answer.warnings else logging.DEBUG
    if log.isEnabledFor(level):
        log.log(
            level,
            "admission uid=%s op=%s pod=%s result=%s changes=%s duration_ms=%.2f%s",
            parsed.request.uid,
            parsed.request.operation,
            _pod_ref(parsed.request),
            answer.result.value,
            ",".join(answer.changes) or "-",
            seconds * 1000,
            f" skipped={answer.skipped!r}" if answer.skipped else "",
        )
    return web.Response(body=answer.body, content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    return httpserver.readiness(request.app[SOURCE])


async def metrics_page(request: web.Request) -> web.Response:
    return httpserver.exposition(request.app[METRICS].registry)
