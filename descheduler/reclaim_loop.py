"""The idle-reclaim loop: every `descheduler.reclaim.interval_seconds`, one cycle =
snapshot + one PromQL query per distinct idle window + plan + act + record.

- Prometheus unset, down, slow or erroring: every pod of that window is "not idle" (fail closed), the
  cycle evicts nothing for them and says so (log line, `..._prometheus_errors_total`).
- Cooldowns are read from (and, after real evictions, merged into) their Lease (`cooldowns`); with no
  API server (offline `--cluster`) or in dry-run they live in memory only.
- Every outcome goes through `record_outcome()`: one log line, one metric, the Events.
- Cancellation (SIGTERM) between two evictions stops the cycle; the cooldowns of the evictions
  already made are still written (shielded), so bookkeeping matches what happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import prometheus_client
from kubernetes_asyncio import client

from common import events, prometheus, settings, snapshot, source
from descheduler import cooldown_store, cooldowns, evictor, gang_release, idle_history, policy, reclaim, utilisation

logger = logging.getLogger(__name__)

POLICY_INVALID = "ReclaimPolicyInvalid"
WOULD_EVICT = "IdleGPUReclaimWouldEvict"  # dry-run: its own reason, so alerts on IdleGPUReclaimed stay quiet


class Querier(Protocol):
    async def query(self, promql: str, *, time: float | None = None) -> list[dict[str, Any]]: ...


class Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.evictions = prometheus_client.Counter(
            "gpu_steward_reclaim_evictions", "Reclaim evictions by result and reason.", ["result", "reason"],
            registry=registry)
        self.candidates = prometheus_client.Gauge(
            "gpu_steward_reclaim_candidates", "Idle GPU pods that may be reclaimed, last cycle.", registry=registry)
        self.idle_gpus = prometheus_client.Gauge(
            "gpu_steward_reclaim_idle_gpus", "GPUs (and MIG slices) held by those pods, last cycle.",
            registry=registry)
        self.cycle = prometheus_client.Histogram(
            "gpu_steward_reclaim_cycle_seconds", "Duration of one reclaim cycle.", registry=registry)
        self.queries = prometheus_client.Counter(
            "gpu_steward_reclaim_promql_queries", "PromQL queries sent by the reclaim loop.", registry=registry)
        self.prometheus_errors = prometheus_client.Counter(
            "gpu_steward_reclaim_prometheus_errors", "Failed utilisation queries (pods stay not idle).",
            registry=registry)


@dataclasses.dataclass(frozen=True)
class Cycle:
    plan: reclaim.Plan
    outcomes: tuple[evictor.Outcome, ...]
    queries: int
    prometheus_errors: tuple[str, ...]
    seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)  # duration of each phase


def gang_demands(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float) -> list[reclaim.Demand]:
    """Complete gated gangs that wait only for GPUs, as the gang controller sees them."""
    waiting = gang_release.plan(cluster, config=config, now=now).demand
    return [reclaim.gang_demand(d.gang, d.members) for d in waiting]


def _threshold(pod: snapshot.Pod, *, policies: Mapping[str, policy.ReclaimPolicy]) -> float:
    found = policy.for_pod(pod, policies)
    return found.threshold_percent if isinstance(found, policy.ReclaimPolicy) else 0.0


def _rows_of(rows: Sequence[Mapping[str, Any]], pods: Sequence[str]) -> list[Mapping[str, Any]]:
    """The rows about `pods`: an answer covers every pod with DCGM series, and parsing them is the cost."""
    wanted = {tuple(key.split("/", 1)) for key in pods}
    out = []
    for row in rows:
        metric = row.get("metric") or {}
        if (metric.get(utilisation.NAMESPACE), metric.get(utilisation.POD)) in wanted:
            out.append(row)
    return out


class ReclaimLoop:
    def __init__(
        self,
        *,
        config: settings.Settings,
        cluster: source.SnapshotSource,
        prometheus: Querier | None,
        evictions: evictor.EvictionClient,
        api: client.ApiClient | None,
        registry: prometheus_client.CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._cluster = cluster
        self._prometheus = prometheus
        self._evictor = evictor.Evictor(evictions, config=config.descheduler.reclaim)
        self._api = api
        self._clock = clock
        registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        self._metrics = Metrics(registry)
        self._memory = cooldowns.State()  # dry-run / offline cooldowns
        self.learner = idle_history.Learner(config=config, prometheus=prometheus, registry=registry)
        self._reported: set[tuple[str, str]] = set()  # (class, problem) already reported
        # Pods evicted (or, in dry-run, that would have been) -> (the demand they were evicted for, until when
        # it is remembered: the preemptor cooldown). Until the snapshot shows them gone their GPUs are that
        # demand's and they are never victims again; a new leader starts empty but sees terminating pods.
        self._leaving: dict[str, tuple[str | None, float]] = {}

    @property
    def _persist(self) -> bool:
        return self._api is not None and not self._evictor.dry_run

    async def run(self) -> None:
        """Cycles until cancelled; a failed cycle is logged and the next one runs on time."""
        interval = self._config.descheduler.reclaim.interval_seconds
        while True:
            started = time.monotonic()
            try:
                await self.cycle()
            except (OSError, TimeoutError, ValueError) as exc:
                logger.error("reclaim cycle failed, nothing more evicted this cycle: %s", exc)
            except Exception as exc:  # the api module's ApiError and friends: keep the loop alive
                logger.exception("reclaim cycle failed: %s", exc)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def cycle(self) -> Cycle:
        started = time.monotonic()
        seconds: dict[str, float] = {}

        def lap(phase: str) -> None:  # time spent since the previous lap (or the start)
            seconds[phase] = time.monotonic() - started - sum(seconds.values())

        now = self._clock()
        cluster = self._cluster.snapshot
        if not self._cluster.synced:
            logger.info("reclaim: snapshot not synced yet; nothing to do")
            empty = reclaim.Plan(evictions=(), spared=(), demands=(), candidates=0, idle_gpus=0)
            return Cycle(empty, (), 0, ())
        policies = policy.parse_all(
            cluster.priority_classes,
            default_threshold_percent=self._config.descheduler.reclaim.default_idle_threshold_percent,
        )
        await self._report_policies(policies)
        state = self._memory
        if self._persist and self._api is not None:
            state = await cooldown_store.load(self._api, config=self._config)
        lap("policies")
        screened = reclaim.screen_all(cluster, policies=policies, state=state, config=self._config, now=now)
        screened, learned = await self.learner.screen(cluster, screened, policies=policies, state=state, now=now)
        wanted = reclaim.windows_needed(screened)
        lap("screen")
        assessments, queries, errors = await self._measure(cluster, wanted, policies, now=now)
        assessments = idle_history.explained(assessments, learned)
        lap("measure")
        demands = reclaim.demands_from_snapshot(cluster) + gang_demands(cluster, config=self._config, now=now)
        lap("demands")
        self._leaving = {k: v for k, v in self._leaving.items() if v[1] > now}
        plan = reclaim.plan(cluster=cluster, policies=policies, assessments=assessments, demands=demands,
                            state=state, config=self._config, now=now, screened=screened,
                            leaving={k: demand for k, (demand, _) in self._leaving.items()})
        lap("plan")
        self._metrics.candidates.set(plan.candidates)
        self._metrics.idle_gpus.set(plan.idle_gpus)
        for outcome in plan.demands:
            logger.info("reclaim demand %s (priority %d): %s", outcome.demand, outcome.priority, outcome.reason)
        for spared in plan.spared:
            logger.debug("reclaim spared %s: %s", spared.pod, spared.reason)
        if errors:
            logger.warning("reclaim: Prometheus failed (%s); pods measured by it are not idle, so not evicted",
                           "; ".join(errors))
        outcomes: list[evictor.Outcome] = []  # filled as evictions happen, read even after a cancellation
        try:
            await self._act(plan, outcomes, now=now)
        finally:
            await asyncio.shield(self._remember(outcomes, state, now=now))
            lap("act")
            self._metrics.cycle.observe(time.monotonic() - started)
        logger.debug("reclaim cycle phases (s): %s", {k: round(v, 3) for k, v in seconds.items()})
        return Cycle(plan, tuple(outcomes), queries, tuple(errors), seconds)

    async def _measure(
        self,
        cluster: snapshot.Snapshot,
        wanted: Mapping[int, Sequence[str]],
        policies: Mapping[str, policy.ReclaimPolicy],
        *,
        now: float,
    ) -> tuple[dict[str, utilisation.Assessment], int, list[str]]:
        assessments: dict[str, utilisation.Assessment] = {}
        errors: list[str] = []
        queries = 0
        for window in sorted(wanted):
            pods = wanted[window]
            if self._prometheus is None:
                reason = "prometheus.url is not set: no utilisation data"
                assessments.update({key: utilisation.failed(reason) for key in pods})
                continue
            thresholds = {key: _threshold(cluster.pods[key], policies=policies) for key in pods}
            queries += 1
            self._metrics.queries.inc()
            try:
                promql = utilisation.query(window, config=self._config.prometheus,
                                           reclaim=self._config.descheduler.reclaim,
                                           below_percent=max(thresholds.values(), default=0.0))
                rows = await self._prometheus.query(promql, time=now)
            except prometheus.PrometheusError as exc:
                self._metrics.prometheus_errors.inc()
                errors.append(str(exc))
                assessments.update({key: utilisation.failed(f"Prometheus query failed: {exc}") for key in pods})
                continue
            readings = utilisation.parse(_rows_of(rows, pods))
            for key in pods:
                assessments[key] = utilisation.assess(cluster.pods[key], readings=readings, window_seconds=window,
                                                      threshold_percent=thresholds[key], config=self._config, now=now)
        return assessments, queries, errors

    async def _act(self, plan: reclaim.Plan, outcomes: list[evictor.Outcome], *, now: float) -> None:
        async def record(outcome: evictor.Outcome) -> None:
            outcomes.append(outcome)
            await self.record_outcome(outcome)

        await self._evictor.evict_plan(plan.evictions, now=now, record=record)
        for demand in plan.demands:
            if demand.served:
                await self._triggered(demand, outcomes)

    async def record_outcome(self, outcome: evictor.Outcome) -> None:
        """The one place an eviction outcome is told: log line + metric + Event."""
        eviction = outcome.eviction
        why = "on-demand" if eviction.preemptor else "always"
        self._metrics.evictions.labels(result=outcome.result.value, reason=why).inc()
        level = logging.INFO if outcome.result in evictor.SUCCESS else logging.WARNING
        logger.log(level, "reclaim %s %s on %s: %s", outcome.result.value, eviction.pod, eviction.node,
                   outcome.detail)
        table: dict[evictor.Result, tuple[events.EventType, str, str]] = {
            evictor.Result.EVICTED: ("Normal", "IdleGPUReclaimed", f"Evicted: {eviction.reason}"),
            evictor.Result.WOULD_EVICT: ("Normal", WOULD_EVICT, f"Would evict (dry-run): {eviction.reason}"),
            evictor.Result.BLOCKED: ("Warning", "EvictionBlocked", f"Not evicted: {outcome.detail}"),
            evictor.Result.FAILED: ("Warning", "EvictionFailed", f"Eviction failed: {outcome.detail}"),
        }
        event = table.get(outcome.result)
        if event is not None:
            await self._event(events.ObjectRef.pod(eviction.pod, uid=eviction.uid), *event)

    async def _triggered(self, demand: reclaim.DemandOutcome, outcomes: Sequence[evictor.Outcome]) -> None:
        done = [o.eviction.pod for o in outcomes
                if o.eviction.preemptor == demand.demand and o.result in evictor.SUCCESS]
        if not done:
            return
        verb = "Would evict (dry-run)" if self._evictor.dry_run else "Evicted"
        message = f"{verb} {len(done)} idle GPU pod(s) for this pod (priority {demand.priority}): {', '.join(done)}"
        for member in demand.members:
            await self._event(events.ObjectRef.pod(member), "Normal", "GPUReclaimTriggered", message)

    async def _event(self, ref: events.ObjectRef, type: events.EventType, reason: str, message: str) -> None:
        if self._api is None:
            return  # offline: the log line is the record
        await events.post(self._api, regarding=ref, type=type, reason=reason, message=message,
                          request_timeout=self._config.kubernetes.request_timeout_seconds)

    async def _report_policies(self, policies: Mapping[str, policy.ReclaimPolicy]) -> None:
        for found in policies.values():
            if found.problem and (found.class_name, found.problem) not in self._reported:
                self._reported.add((found.class_name, found.problem))
                logger.warning("%s", found.reason)
                await self._event(
                    events.ObjectRef(kind="PriorityClass", name=found.class_name, api_version="scheduling.k8s.io/v1"),
                    "Warning", POLICY_INVALID, found.reason,
                )

    async def _remember(self, outcomes: Sequence[evictor.Outcome], state: cooldowns.State, *, now: float) -> None:
        done = [o.eviction for o in outcomes if o.result in evictor.SUCCESS]
        if not done:
            return
        remember = now + self._config.descheduler.reclaim.cooldowns.preemptor_seconds
        self._leaving.update({e.pod: (e.preemptor, remember) for e in done})
        fresh = cooldowns.record(
            cooldowns.State(),
            preemptors=sorted({e.preemptor for e in done if e.preemptor}),
            nodes=sorted({e.node for e in done}),
            workloads=sorted({e.workload for e in done if e.workload}),
            config=self._config.descheduler.reclaim.cooldowns,
            now=now,
        )
        if not self._persist or self._api is None:
            self._memory = state.merged(fresh, now=now)
            return
        try:
            await cooldown_store.save(self._api, fresh, config=self._config, now=now)
        except Exception as exc:  # kube.ApiError or a network error: logged, the evictions stand
            logger.error("reclaim cooldowns not saved (%d eviction(s) this cycle): %s", len(done), exc)
            self._memory = state.merged(fresh, now=now)
