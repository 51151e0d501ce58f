"""The idle-reclaim loop: every `descheduler.reclaim.interval_seconds`, one cycle =
snapshot + measure (a few small PromQL queries for the newest minutes, for all pods and windows, over the
utilisation parts kept from earlier cycles) + plan + act + record.

- Prometheus unset, down, slow, erroring, partial (warnings) or skewed from our clock: every pod of that
  window is "not idle" (fail closed), the cycle evicts nothing for them and says so once (one log line,
  `..._prometheus_errors_total`); measuring is `descheduler.reclaim.measurement`.
- Cooldowns are read from (and, after real evictions, merged into) their Lease (`cooldowns`); with no
  API server (offline `--cluster`) or in dry-run they live in memory only.
- Every outcome goes through `record_outcome()`: one log line, one metric, the Events.
- Evictions as a transaction: the plan checked every victim's limits and PodDisruptionBudgets on the snapshot; the
  evictor dry-runs every victim of a demand on the API server and re-checks each GPU victim's newest samples in the
  store (`_recheck`, one small query for all of them, `..._rechecks_total`) before the first real eviction, and
  evicts none of them on any refusal. A victim refused (the budget changed, the pod opted out, changed or turned
  busy since) is left out and the cycle plans again, up to `ROUNDS` plans, so that the next candidate is tried now,
  not next cycle; a victim a budget refused cools down (`cooldowns`, scope `victim`). A demand whose later victim
  was refused after earlier ones were evicted is served in part: said (a Warning Event on the demand, a log line)
  and counted (`..._partial_demands_total`); its evicted victims stay its own (`leaving`), so the next plan takes
  only what it still lacks.
- Cancellation (SIGTERM) between two evictions stops the cycle; the cooldowns of the evictions
  already made are still written (shielded), so bookkeeping matches what happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import prometheus_client
from kubernetes_asyncio import client

from common import events, prometheus, settings, snapshot, source
from descheduler import cooldown_store, cooldowns, evictor, limits, policy, reclaim
from descheduler.reclaim import idle_history, idle_learning, measurement, recheck, utilisation, utilisation_promql

logger = logging.getLogger(__name__)

POLICY_INVALID = "ReclaimPolicyInvalid"
WOULD_EVICT = "IdleGPUReclaimWouldEvict"  # dry-run: its own reason, so alerts on IdleGPUReclaimed stay quiet
PARTIAL = "GPUReclaimPartial"
SKIPPED = "EvictionSkipped"
ROUNDS = 3  # plans per cycle at most: the first, and again after refusals (each round tries new victims only)
# Not evicted, and not for a reason the next plan would share: plan again without them.
REFUSED = frozenset({evictor.Result.BLOCKED, evictor.Result.PROTECTED, evictor.Result.CHANGED,
                     evictor.Result.FAILED, evictor.Result.BACKOFF, evictor.Result.NOT_IDLE})


Querier = measurement.Querier


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
        self.policy_problems = prometheus_client.Gauge(
            "gpu_steward_reclaim_policy_problems",
            "PriorityClass annotations reclaim cannot read, by class, last cycle (the class is not reclaimable, or "
            "does not learn its idle windows).", ["priority_class"], registry=registry)
        self.partial = prometheus_client.Counter(
            "gpu_steward_reclaim_partial_demands",
            "Demands whose victims were evicted only in part: a later victim was refused after earlier ones went.",
            registry=registry)
        self.rechecks = prometheus_client.Counter(
            "gpu_steward_reclaim_rechecks",
            "Utilisation re-checks of a victim right before its eviction, by verdict (idle, not-idle: busy, missing "
            "or stale; failed: the query failed, not evicted either).", ["verdict"], registry=registry)


@dataclasses.dataclass(frozen=True)
class Cycle:
    plan: reclaim.Plan
    outcomes: tuple[evictor.Outcome, ...]
    queries: int
    prometheus_errors: tuple[str, ...]
    seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)  # duration of each phase
    replans: tuple[reclaim.Plan, ...] = ()  # plans made again in this cycle after refusals (see ROUNDS)


GangDemands = Callable[[snapshot.Snapshot, float], Sequence[reclaim.Demand]]
"""(snapshot, now) -> complete gated gangs that wait only for GPUs, as the release controller sees them. Wired in
by the process (`gpu_steward.cmd_descheduler.gang_demands`): reclaim does not import release (import-linter)."""


def _threshold(pod: snapshot.Pod, *, policies: Mapping[str, policy.ReclaimPolicy]) -> float:
    found = policy.for_pod(pod, policies)
    return found.threshold_percent if isinstance(found, policy.ReclaimPolicy) else 0.0


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
        gang_demands: GangDemands | None = None,
        once: bool = False,
        progress: Callable[[str], None] | None = None,
        controllers: idle_history.ControllerReader | None = None,
    ) -> None:
        """`once`: this loop runs one cycle (`--once`), which reads every utilisation part its windows need and
        the learned windows' whole look-back first, each read told to `progress` (a line; None: logged).
        `controllers`: where learned windows find ReplicaSets and Jobs (default: listed from `api`, if any)."""
        self._config = config
        self._gang_demands = gang_demands
        self._cluster = cluster
        self._prometheus = prometheus
        self._evictor = evictor.Evictor(evictions, config=config.descheduler.reclaim, names=config.names,
                                        recheck=self._recheck if prometheus is not None else None)
        self._acting_on: snapshot.Snapshot | None = None  # the snapshot of the cycle whose plan is being evicted
        self._api = api
        self._clock = clock
        self._whole = (progress or logger.info) if once else None  # `--once`: read everything first
        registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        self._metrics = Metrics(registry)
        self._measurement_metrics = measurement.Metrics(registry)
        self.parts = measurement.Parts()  # utilisation parts kept across cycles: a new leader starts empty
        self._memory = cooldowns.State()  # dry-run / offline cooldowns
        if controllers is None and api is not None:
            controllers = idle_history.api_controllers(api, timeout_seconds=config.kubernetes.request_timeout_seconds)
        self.learner = idle_history.Learner(config=config, prometheus=prometheus, registry=registry, at_once=once,
                                            progress=self._whole, controllers=controllers)
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
        try:
            while True:
                started = time.monotonic()
                try:
                    await self.cycle()
                except (OSError, TimeoutError, ValueError) as exc:
                    logger.error("reclaim cycle failed, nothing more evicted this cycle: %s", exc)
                except Exception as exc:  # the api module's ApiError and friends: keep the loop alive
                    logger.exception("reclaim cycle failed: %s", exc)
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
        finally:  # cancelled (shutdown, leadership lost): the history refresh beside the cycles stops too
            await asyncio.shield(self.learner.close())

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
        await self._report_policies(policies, cluster.priority_classes)
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
        demands = reclaim.demands_from_snapshot(cluster, names=self._config.names)
        if self._gang_demands is not None:
            demands += self._gang_demands(cluster, now)
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
        leaving = {k: demand for k, (demand, _) in self._leaving.items()}

        def replan(refused: Mapping[str, str], done: Sequence[reclaim.Eviction]) -> reclaim.Plan:
            return reclaim.plan(cluster=cluster, policies=policies, assessments=assessments, demands=demands,
                                state=state, config=self._config, now=now, screened=screened,
                                leaving={**leaving, **{e.pod: e.preemptor for e in done}}, refused=refused,
                                spent=[(e.unit, e.namespace, e.node) for e in done])

        replans: list[reclaim.Plan] = []
        self._acting_on = cluster
        try:
            await self._act(plan, outcomes, now=now, replan=replan, replans=replans)
        finally:
            await asyncio.shield(self._remember(outcomes, state, now=now))
            lap("act")
            self._metrics.cycle.observe(time.monotonic() - started)
        self.learner.start(now=now)  # the learned windows' next refresh, if due: beside the next cycles
        logger.debug("reclaim cycle phases (s): %s", {k: round(v, 3) for k, v in seconds.items()})
        return Cycle(plan, tuple(outcomes), queries, tuple(errors), seconds, tuple(replans))

    async def _measure(
        self,
        cluster: snapshot.Snapshot,
        wanted: Mapping[int, Sequence[str]],
        policies: Mapping[str, policy.ReclaimPolicy],
        *,
        now: float,
    ) -> tuple[dict[str, utilisation.Assessment], int, list[str]]:
        def counted(ok: bool) -> None:
            self._metrics.queries.inc()
            if not ok:
                self._metrics.prometheus_errors.inc()

        thresholds = {key: _threshold(cluster.pods[key], policies=policies) for keys in wanted.values() for key in keys}
        measured = await measurement.measure(cluster, wanted, thresholds=thresholds, querier=self._prometheus,
                                             config=self._config, clock=self._clock,
                                             metrics=self._measurement_metrics, on_query=counted,
                                             kept=self.parts, whole=self._whole)
        return measured.assessments, measured.queries, list(measured.errors)

    async def _act(
        self,
        plan: reclaim.Plan,
        outcomes: list[evictor.Outcome],
        *,
        now: float,
        replan: Callable[[Mapping[str, str], Sequence[reclaim.Eviction]], reclaim.Plan],
        replans: list[reclaim.Plan],
    ) -> None:
        """Evict the plan; after refusals plan again without the refused victims (and with what went as gone)
        and evict the new victims only, `ROUNDS` plans at most, under one limits budget."""
        async def record(outcome: evictor.Outcome) -> None:
            outcomes.append(outcome)
            await self.record_outcome(outcome)

        budget = limits.Budget(self._config.descheduler.reclaim.limits)
        await self._evictor.evict_plan(plan.evictions, now=now, record=record, budget=budget)
        served = {d.demand: d for d in plan.demands if d.served}
        planned_without: set[str] = set()  # refused pods a plan was already made without
        for _ in range(ROUNDS - 1):
            refused = {o.eviction.pod: o.detail for o in outcomes if o.result in REFUSED}
            if refused.keys() <= planned_without:
                break  # no new refusal: planning again would only find the same victims
            planned_without |= refused.keys()
            done = [o.eviction for o in outcomes if o.result in evictor.SUCCESS or o.result is evictor.Result.GONE]
            again = replan(refused, done)
            # A victim skipped with its refused transaction was never called: it may go in the new plan's.
            tried = {o.eviction.pod for o in outcomes if o.result is not evictor.Result.SKIPPED}
            fresh = [e for e in again.evictions if e.pod not in tried]
            if not fresh:
                break
            replans.append(again)
            served.update({d.demand: d for d in again.demands if d.served})
            logger.info("reclaim: %d victim(s) refused (%s); planned again: %d new eviction(s)", len(refused),
                        ", ".join(sorted(refused)), len(fresh))
            await self._evictor.evict_plan(fresh, now=now, record=record, budget=budget)
        for demand in served.values():
            await self._triggered(demand, outcomes)
        for outcome in outcomes:
            if outcome.partial:
                await self._partial(outcome, served)

    async def _recheck(self, evictions: Sequence[reclaim.Eviction]) -> list[str | None]:
        """Why each of `evictions`' pods must not go now, from one small query for all of their newest samples judged
        at the store's time (descheduler.reclaim.recheck), or None: still idle. A failed or partial answer fails
        every one of them closed."""
        cluster = self._acting_on
        pods = [cluster.pods.get(e.pod) if cluster is not None else None for e in evictions]
        found = [p for p in pods if p is not None]
        answer: prometheus.Answer | None = None
        failed = "re-check: prometheus.url is not set"
        if cluster is not None and found and self._prometheus is not None:
            failed = ""
            kinds = utilisation.kinds_needed(found, cluster.nodes)  # as the measurement asked
            query = utilisation_promql.newest([p.name for p in found], config=self._config.prometheus, kinds=kinds)
            self._metrics.queries.inc()
            try:
                answer = await self._prometheus.instant(query)
            except prometheus.PrometheusError as exc:
                self._metrics.prometheus_errors.inc()
                failed = f"re-check: the query failed: {exc}"
            else:
                if answer.warnings:
                    failed = (f"re-check: Prometheus answered with warnings (partial data): "
                              f"{'; '.join(answer.warnings)[:300]}")
        said: list[str | None] = []
        for eviction, pod in zip(evictions, pods, strict=True):
            if pod is None:
                said.append("re-check: not in this cycle's snapshot")
                continue
            if failed or answer is None:
                self._metrics.rechecks.labels(verdict="failed").inc()
                said.append(failed)
                continue
            verdict = recheck.judge(pod, answer.series, threshold_percent=eviction.threshold or 0.0,
                                    config=self._config)
            self._metrics.rechecks.labels(verdict="idle" if verdict.idle else "not-idle").inc()
            logger.debug("reclaim %s: %s", eviction.pod, verdict.reason)
            said.append(None if verdict.idle else verdict.reason)
        return said

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
            # The live pod is no longer what was judged: not evicted, said on it.
            evictor.Result.PROTECTED: ("Normal", SKIPPED, f"Not evicted: {outcome.detail}"),
            evictor.Result.CHANGED: ("Normal", SKIPPED, f"Not evicted: {outcome.detail}"),
            evictor.Result.NOT_IDLE: ("Normal", SKIPPED, f"Not evicted: {outcome.detail}"),
            # Another victim of its demand (or member of its gang) refused: none of them goes, said on each.
            evictor.Result.SKIPPED: ("Normal", SKIPPED, f"Not evicted: {outcome.detail}"),
        }
        event = table.get(outcome.result)
        if event is not None:
            await self._event(events.ObjectRef.pod(eviction.pod, uid=eviction.uid), *event)

    async def _partial(self, outcome: evictor.Outcome, served: Mapping[str, reclaim.DemandOutcome]) -> None:
        """A demand served in part: said on its pods, counted; what went stays its own (`_leaving`)."""
        self._metrics.partial.inc()
        demand = outcome.eviction.preemptor or ""
        message = f"Served in part: {outcome.eviction.pod} not evicted ({outcome.detail})"
        logger.warning("reclaim demand %s: %s", demand, message)
        found = served.get(demand)
        for member in found.members if found else ():
            await self._event(events.ObjectRef.pod(member), "Warning", PARTIAL, message)

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

    async def _report_policies(self, policies: Mapping[str, policy.ReclaimPolicy],
                               classes: Mapping[str, snapshot.PriorityClass]) -> None:
        """Every PriorityClass annotation reclaim cannot read (its policy's, `policy.parse`; its learned-window
        opt-in's, `idle_learning.enabled`): a log line and a Warning Event once per process, and counted per class
        every cycle (`gpu_steward_reclaim_policy_problems`)."""
        problems = [(found.class_name, found.problem, found.reason) for found in policies.values() if found.problem]
        for pc in classes.values():
            learning = idle_learning.enabled(pc, names=self._config.names)
            if learning.problem:
                problems.append((pc.name, learning.problem, learning.problem))
        self._metrics.policy_problems.clear()
        for class_name, problem, reason in problems:
            self._metrics.policy_problems.labels(priority_class=class_name).inc()
            if (class_name, problem) not in self._reported:
                self._reported.add((class_name, problem))
                logger.warning("%s", reason)
                await self._event(
                    events.ObjectRef(kind="PriorityClass", name=class_name, api_version="scheduling.k8s.io/v1"),
                    "Warning", POLICY_INVALID, reason,
                )

    async def _remember(self, outcomes: Sequence[evictor.Outcome], state: cooldowns.State, *, now: float) -> None:
        done = [o.eviction for o in outcomes if o.result in evictor.SUCCESS]
        refused = sorted({o.eviction.pod for o in outcomes if o.result is evictor.Result.BLOCKED})
        if not done and not refused:
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
            refused=refused,
        )
        if not self._persist or self._api is None:
            self._memory = state.merged(fresh, now=now)
            return
        try:
            await cooldown_store.save(self._api, fresh, config=self._config, now=now)
        except Exception as exc:  # kube.ApiError or a network error: logged, the evictions stand
            logger.error("reclaim cooldowns not saved (%d eviction(s) this cycle): %s", len(done), exc)
            self._memory = state.merged(fresh, now=now)
