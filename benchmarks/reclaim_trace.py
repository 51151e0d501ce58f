"""Reclaim quality on real per-pod GPU utilisation: the real planner, replayed over a day of a real trace.

    python benchmarks/reclaim_trace.py [--pods N] [--hours H] [--interval SECONDS] [--phases N [--phase K]]
                                       [--quick] [--out FILE]

The trace (Alibaba cluster-trace-v2026-GenAI, `pod_gpu_duty_cycle.csv.gz`: Stable-Diffusion serving
pods, one duty-cycle sample every 57 s for ~23 h) is written once, whole, as `DCGM_FI_DEV_GPU_UTIL`
series (labels pod, namespace, Hostname, gpu) into a real Prometheus (promtool backfill); then the day
is replayed cycle by cycle, each cycle querying Prometheus at that cycle's trace time (`time=`).

Replay model (the trace records neither placement nor owners, so this is chosen and stated):
- each trace pod holds one GPU on its own 1-GPU node, is owned by a Deployment of its own (no shared
  workload cooldown; a bare pod would never be evicted), lives from its first to its last sample and is
  scheduled at its first sample;
- demand is always present: a standing queue of (per-cycle limit + 1) pending 1-GPU pods at priority
  100,000 (on-demand mode), so every GPU a policy frees is taken; an evicted pod is gone for the rest
  of the replay and its node holds the preemptor from then on;
- gpu-steward rows run the real `ReclaimLoop.cycle()` (screening, one PromQL query per window, the
  fail-closed assessment, the planner, limits and cooldowns, the dry-run evictor) with the default
  settings (coverage is judged by time, on the cadence the data shows); baselines read the same Prometheus:
  * ReclaimIdleResource plugin semantics: `scalar(avg_over_time(util[window]))` per pod, NaN (no
    samples) read as 0, so missing data is idle; exempt while scheduled < max(toleration, window) ago;
    evicted when the average is <= the threshold;
  * naive instantaneous threshold: the instant value (Prometheus' 5-minute lookback) < threshold;
  * no reclaim;
  * what-if (not a product setting): every sample of the window below the threshold, failing closed
    on the same coverage/staleness bar as ours — to show whether the averaging rule is what costs regret.
Cycles run every `--interval` seconds of trace time (default 300, rounded to the 57-s step; the chart's
loop runs every 60: `--interval 60` replays that, ~5x the queries).
The trace's slot 0 sits at a fixed offset against the learned windows' history steps (`step_seconds`, 5 min):
phase K of `--phases` N is K/N of a step (default: phase 0 of 1), as in `learned_window_sweep.py`. A learned
window moves with it (stretches are whole steps), so a learned arm's result is only reproducible at a fixed phase,
and is reported over several; `--phases N` replays each in turn (a Prometheus of its own) and prints the totals.

Scoring (pure functions below; one yardstick for every policy, whatever its own threshold):
- a sample is idle when below IDLE_PERCENT (5 %); each sample stands for one trace step of GPU time;
- reclaimed idle GPU time of an eviction at cycle slot j: the pod's idle samples after j for the rest
  of its life (the replay removes the pod, so every idle minute left is freed); busy samples after j
  are busy GPU time lost;
- regretted: the pod would have gone busy within REGRET_SECONDS (10 min) of its eviction;
- reclaimable idle GPU time of a policy (window W, toleration t): idle stretches are maximal runs of
  idle samples, ended by a busy sample or a silence longer than `max_sample_age_seconds` (no policy
  can know a pod idle across such a hole); a stretch starting at s is reclaimable from
  max(s + W, scheduled + max(t, W)) on — the earliest moment a W-window can have seen only idle samples
  and screening allows it. The share is reclaimed-within-reclaimable / reclaimable: <= 100 %.
  Idle time reclaimed outside it (early, on an average that hid a burst) counts in the absolute hours;
- decided on missing data: at the eviction, the policy's window held fewer samples than
  `MIN_COVERAGE` (90 %) of what the cadence puts in it, or its newest sample was older than
  `max_sample_age_seconds` (instant decisions: only the latter).
Goals for the chart's default tiers: >= 80 % of reclaimable idle GPU-hours, <= 5 % of evictions
regretted, no eviction on missing data. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import contextlib
import csv
import dataclasses
import datetime
import gzip
import itertools
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import yaml
from PIL import Image, ImageDraw

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout; the tests package is not installed

from common import prometheus, settings, settings_loader, snapshot, snapshot_build  # noqa: E402
from descheduler import evictor, policy  # noqa: E402
from descheduler.reclaim import idle_history, utilisation_promql  # noqa: E402
from descheduler.reclaim import loop as reclaim_loop  # noqa: E402
from gpu_steward_lab import localprometheus  # noqa: E402
from tests import builders  # noqa: E402

DEFAULT_TRACE = ROOT / "benchmarks" / "data" / "alibaba-genai" / "pod_gpu_duty_cycle.csv.gz"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "reclaim_trace.json"
VALUES = ROOT / "charts" / "gpu-steward" / "values.yaml"
IDLE_PERCENT = 5.0  # the yardstick: a sample below this is idle
REGRET_SECONDS = 600.0  # an eviction followed by a busy sample this soon is regretted
GOALS = {"reclaimed_share_min": 0.80, "regretted_share_max": 0.05, "missing_data_evictions": 0}
CLAIRVOYANT_GOAL = 0.60  # the default policy's reclaimed GPU-h against the clairvoyant regret-free reclaim
DEFAULT_PNG = ROOT / "benchmarks" / "results" / "reclaim_trace_curve.png"
SWEEP_WINDOWS = (300, 600, 1800, 3600, 7200, 10800)
SWEEP_THRESHOLDS = (1.0, 5.0)
NAMESPACE = "genai"
VICTIM_CLASS = "replay-tier"
VICTIM_PRIORITY = 10_000
PREEMPTOR_PRIORITY = 100_000
METRIC = "DCGM_FI_DEV_GPU_UTIL"
# The learned-window arms: the product defaults, but the trace is one day, so one day of look-back read at once.
LEARNED = {"lookback_seconds": 86400, "chunk_seconds": 86400}

Kind = Literal["gpu-steward", "plugin", "instant", "strict", "none"]


# --- the trace (pure) -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodTrace:
    name: str
    samples: Mapping[int, float]  # slot -> duty cycle (percent)
    slots: tuple[int, ...]  # the observed slots, ascending

    @property
    def first(self) -> int:
        return self.slots[0]

    @property
    def last(self) -> int:
        return self.slots[-1]


def pod_trace(name: str, samples: Mapping[int, float]) -> PodTrace:
    if not samples:
        raise ValueError(f"pod {name} has no samples")
    return PodTrace(name, dict(samples), tuple(sorted(samples)))


@dataclasses.dataclass(frozen=True)
class Trace:
    step: float  # seconds between samples (the trace's cadence)
    slots: int  # slots 0 .. slots-1
    pods: Mapping[str, PodTrace]


def parse_trace(rows: Iterable[tuple[float, float, str]], *, pods: int | None, hours: float | None) -> Trace:
    """(timestamp, value, pod id) rows -> the first `pods` pods (by id) over the first `hours` hours.

    Samples sit on one grid (every pod is sampled at the same instants); the step is the commonest gap."""
    by_pod: dict[str, dict[float, float]] = collections.defaultdict(dict)
    for timestamp, value, pod in rows:
        by_pod[pod][timestamp] = value
    instants = sorted({t for samples in by_pod.values() for t in samples})
    if len(instants) < 2:
        raise ValueError("the trace needs at least two sampling instants")
    gaps = collections.Counter(round(b - a, 3) for a, b in itertools.pairwise(instants))
    step = gaps.most_common(1)[0][0]
    start = instants[0]
    limit = math.inf if hours is None else hours * 3600 / step
    chosen = sorted(by_pod)[:pods] if pods is not None else sorted(by_pod)
    out: dict[str, PodTrace] = {}
    for pod in chosen:
        samples = {round((t - start) / step): v for t, v in by_pod[pod].items()}
        kept = {k: v for k, v in samples.items() if k < limit}
        if kept:
            name = f"sd-{pod[:10]}"
            if name in out:
                raise ValueError(f"pod ids {pod} and {out[name].name} share a prefix")
            out[name] = pod_trace(name, kept)
    last = max(p.last for p in out.values())
    return Trace(step=step, slots=last + 1, pods=out)


# --- policies -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Yardstick:
    step: float  # seconds of GPU time per sample
    max_silence_seconds: float  # a longer silence ends an idle stretch / makes data stale
    min_coverage: float  # share of the window's expected samples needed to judge it


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    kind: Kind
    window_seconds: int  # 0: instant decisions / no reclaim
    threshold_percent: float
    toleration_seconds: int
    tier: str | None = None  # the chart tier whose default this is
    learned: bool = False  # gpu-steward: the tier's window is learned per workload (`learned_window` settings)

    @property
    def needed_seconds(self) -> int:
        """How long after scheduling a pod may first be judged (toleration and window)."""
        return max(self.toleration_seconds, self.window_seconds)


def chart_tiers(values: Mapping[str, Any]) -> list[Policy]:
    """The reclaimable tiers of the chart's `priorityClasses.*.reclaim` (a tier without a window is never
    reclaimed, like `critical`: the "no reclaim" row stands for it)."""
    out = []
    for tier, spec in (values.get("priorityClasses") or {}).items():
        reclaim = (spec or {}).get("reclaim") if isinstance(spec, Mapping) else None
        if not reclaim or "resource-idle-seconds" not in reclaim:
            continue
        out.append(Policy(
            name=f"{tier} (chart default)", kind="gpu-steward",
            window_seconds=int(reclaim["resource-idle-seconds"]),
            threshold_percent=float(reclaim.get("resource-idle-usage-threshold", IDLE_PERCENT)),
            toleration_seconds=int(reclaim.get("toleration-seconds", 0)), tier=tier,
        ))
    return out


def sweep(windows: Sequence[int], thresholds: Sequence[float]) -> list[Policy]:
    return [Policy(f"window {w}s, <{t:g}%", "gpu-steward", w, t, 0) for w in windows for t in thresholds]


def what_if(windows: Sequence[int], *, threshold_percent: float) -> list[Policy]:
    """Not a product setting: every sample of the window below the threshold (fail closed like ours)."""
    return [Policy(f"what-if: every sample <{threshold_percent:g}% for {w}s", "strict", w, threshold_percent, 0)
            for w in windows]


def plugin_sweep(windows: Sequence[int], *, threshold_percent: float) -> list[Policy]:
    """The ReclaimIdleResource plugin's semantics at the sweep's windows: its reclaimed-vs-regret curve."""
    return [Policy(f"plugin semantics, window {w}s, <{threshold_percent:g}%", "plugin", w, threshold_percent, 0)
            for w in windows]


def baselines(tiers: Sequence[Policy]) -> list[Policy]:
    out = []
    for tier in tiers:
        out.append(dataclasses.replace(tier, name=f"plugin semantics, {tier.tier} tier", kind="plugin"))
        out.append(dataclasses.replace(tier, name=f"instant <{tier.threshold_percent:g}%, {tier.tier} tier",
                                       kind="instant", window_seconds=0))
    out.append(Policy("no reclaim", "none", 0, 0.0, 0))
    return out


def learned_arms(tiers: Sequence[Policy], *, floor_seconds: float) -> list[Policy]:
    """Each chart tier with its window learned per workload (where the tier's window exceeds the floor: below
    it no learned window is shorter than the tier's)."""
    return [dataclasses.replace(t, name=f"{t.tier} tier, learned window", learned=True)
            for t in tiers if t.window_seconds > floor_seconds]


def judged_as(rule: Policy, *, floor_seconds: int) -> Policy:
    """The policy its reclaimable time is scored by: a learned window may be as short as the floor, so its
    reclaimable time starts `floor_seconds` into each idle stretch (the tier's own window would leave out
    what it rightly frees early)."""
    return dataclasses.replace(rule, window_seconds=floor_seconds) if rule.learned else rule


def distinct(policies: Iterable[Policy]) -> list[Policy]:
    """Drop repeats that behave the same (same kind, window, threshold and earliest judgement): the first
    one named wins, so a chart tier keeps its name over the sweep point it equals."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for p in policies:
        key = (p.kind, p.window_seconds, p.threshold_percent, p.needed_seconds, p.learned)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def plugin_idle(average: float | None, *, threshold_percent: float) -> bool:
    """ReclaimIdleResource: the window average, NaN or absent read as 0; exempt only above the threshold."""
    value = 0.0 if average is None or math.isnan(average) else average
    return not value > threshold_percent


def instant_idle(value: float | None, *, threshold_percent: float) -> bool:
    """A naive check of the newest sample: no sample, no judgement."""
    return value is not None and not math.isnan(value) and value < threshold_percent


def strict_idle(maximum: float | None, samples: float | None, age: float | None, *, policy: Policy,
                yardstick: Yardstick) -> bool:
    """The what-if rule: enough fresh samples, and every one of them below the threshold."""
    if maximum is None or samples is None or age is None or math.isnan(maximum):
        return False
    enough = samples >= yardstick.min_coverage * policy.window_seconds / yardstick.step
    return enough and age <= yardstick.max_silence_seconds and maximum < policy.threshold_percent


def judged(*, scheduled: float, now: float, policy: Policy) -> bool:
    """The plugin's exemption: a pod scheduled less than max(toleration, window) ago is safe."""
    return now - scheduled >= policy.needed_seconds


# --- scoring (pure) -------------------------------------------------------------------------------


def missing_data(pod: PodTrace, slot: int, *, window_seconds: int, yardstick: Yardstick) -> str | None:
    """Why a decision at `slot` over the last `window_seconds` lacked data, or None (window 0: instant)."""
    step = yardstick.step
    newest = bisect.bisect_right(pod.slots, slot) - 1
    if newest < 0:
        return "no sample yet"
    age = (slot - pod.slots[newest]) * step
    if age > yardstick.max_silence_seconds:
        return f"newest sample {age:.0f}s old"
    if window_seconds:
        oldest = bisect.bisect_left(pod.slots, slot - window_seconds / step)
        present = newest - oldest + 1
        expected = window_seconds / step
        if present < yardstick.min_coverage * expected:
            return f"{present} of {expected:.1f} samples in {window_seconds}s"
    return None


def stretches(pod: PodTrace, *, yardstick: Yardstick) -> list[list[int]]:
    """Maximal runs of idle samples, ended by a busy sample or a silence longer than the yardstick's."""
    out: list[list[int]] = []
    current: list[int] | None = None
    previous: int | None = None
    for slot in pod.slots:
        silent = previous is not None and (slot - previous) * yardstick.step > yardstick.max_silence_seconds
        previous = slot
        if pod.samples[slot] >= IDLE_PERCENT:
            current = None
            continue
        if current is None or silent:
            current = []
            out.append(current)
        current.append(slot)
    return out


def reclaimable(pod: PodTrace, policy: Policy, *, yardstick: Yardstick) -> frozenset[int]:
    """Idle slots a perfect policy with this window and toleration could have reclaimed."""
    step = yardstick.step
    out: set[int] = set()
    for stretch in stretches(pod, yardstick=yardstick):
        earliest = max(stretch[0] * step + policy.window_seconds, pod.first * step + policy.needed_seconds)
        out.update(s for s in stretch if s * step > earliest)
    return frozenset(out)


@dataclasses.dataclass(frozen=True)
class Aftermath:
    idle: frozenset[int]  # idle slots the pod would have had after the eviction
    busy: int  # busy samples it would have had
    busy_after_seconds: float | None  # when it would first have gone busy


def aftermath(pod: PodTrace, slot: int, *, step: float) -> Aftermath:
    later = pod.slots[bisect.bisect_right(pod.slots, slot):]
    busy = [s for s in later if pod.samples[s] >= IDLE_PERCENT]
    return Aftermath(
        idle=frozenset(s for s in later if pod.samples[s] < IDLE_PERCENT),
        busy=len(busy),
        busy_after_seconds=(busy[0] - slot) * step if busy else None,
    )


def clairvoyant_hours(trace: Trace, *, since: int = 0) -> float:
    """The clairvoyant regret-free reclaim: each pod evicted right after its last busy sample, so it frees
    every idle sample after it and never regrets (a pod never busy is evicted at its first sample).
    `since`: only decisions from this slot on (a split run judges only its second part)."""
    idle = 0
    for pod in trace.pods.values():
        busy = [s for s in pod.slots if pod.samples[s] >= IDLE_PERCENT]
        last = max(busy[-1] if busy else -1, since - 1)
        idle += sum(1 for s in pod.slots if s > last and pod.samples[s] < IDLE_PERCENT)
    return idle * trace.step / 3600


@dataclasses.dataclass(frozen=True)
class Eviction:
    pod: str
    slot: int
    reason: str  # the deciding policy's own words
    window_seconds: int | None = None  # the window it was judged over, when not the policy's (a learned one)


@dataclasses.dataclass(frozen=True)
class Score:
    evictions: int
    regretted: int
    missing_data: int
    reclaimable_hours: float
    reclaimed_hours: float  # within reclaimable
    idle_reclaimed_hours: float  # all idle GPU time freed
    busy_lost_hours: float
    details: tuple[dict[str, Any], ...]  # one per eviction

    @property
    def reclaimed_share(self) -> float:
        return self.reclaimed_hours / self.reclaimable_hours if self.reclaimable_hours else 0.0

    @property
    def regretted_share(self) -> float:
        return self.regretted / self.evictions if self.evictions else 0.0

    def goals(self) -> dict[str, bool]:
        return {
            "reclaimed_share": self.reclaimed_share >= GOALS["reclaimed_share_min"],
            "regretted_share": self.regretted_share <= GOALS["regretted_share_max"],
            "missing_data": self.missing_data <= GOALS["missing_data_evictions"],
        }


def score(trace: Trace, policy: Policy, evictions: Sequence[Eviction], *, yardstick: Yardstick,
          since: int = 0) -> Score:
    """`since`: decisions are only made from this slot on (a split run): what is reclaimable starts there too."""
    hours = yardstick.step / 3600
    possible = {name: frozenset(s for s in reclaimable(pod, policy, yardstick=yardstick) if s >= since)
                for name, pod in trace.pods.items()}
    reclaimed = idle = busy = regretted = missing = 0
    details = []
    for eviction in evictions:
        pod = trace.pods[eviction.pod]
        after = aftermath(pod, eviction.slot, step=yardstick.step)
        window = policy.window_seconds if eviction.window_seconds is None else eviction.window_seconds
        lacking = missing_data(pod, eviction.slot, window_seconds=window, yardstick=yardstick)
        regret = after.busy_after_seconds is not None and after.busy_after_seconds <= REGRET_SECONDS
        reclaimed += len(after.idle & possible[eviction.pod])
        idle += len(after.idle)
        busy += after.busy
        regretted += regret
        missing += lacking is not None
        details.append({
            "pod": eviction.pod, "at_seconds": round(eviction.slot * yardstick.step), "reason": eviction.reason,
            "idle_minutes_after": round(len(after.idle) * yardstick.step / 60, 1),
            "busy_minutes_after": round(after.busy * yardstick.step / 60, 1),
            "busy_after_seconds": after.busy_after_seconds, "regretted": regret, "missing_data": lacking,
        })
    return Score(
        evictions=len(evictions), regretted=regretted, missing_data=missing,
        reclaimable_hours=sum(len(s) for s in possible.values()) * hours, reclaimed_hours=reclaimed * hours,
        idle_reclaimed_hours=idle * hours, busy_lost_hours=busy * hours, details=tuple(details),
    )


# --- the replayed cluster -------------------------------------------------------------------------


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _running(name: str, *, node: str, since: float, priority: int, class_name: str | None) -> dict[str, Any]:
    def status(body: dict[str, Any]) -> None:
        body["spec"]["priority"] = priority
        if class_name:
            body["spec"]["priorityClassName"] = class_name
        body["status"] = {"phase": "Running", "startTime": _iso(since), "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _iso(since)}]}
        body["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": name, "controller": True}]

    return builders.pod(name, namespace=NAMESPACE, gpus=1, node=node, phase="Running", created=_iso(since),
                        mutate=status)


def _pending(name: str, *, created: float) -> dict[str, Any]:
    def status(body: dict[str, Any]) -> None:
        body["spec"]["priority"] = PREEMPTOR_PRIORITY
        body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]

    return builders.pod(name, namespace=NAMESPACE, gpus=1, created=_iso(created), mutate=status)


def node_of(pod: str) -> str:
    return f"gpu-{pod}"


class Replay:
    """Where each pod is at a slot, for one policy: running, or gone (evicted, its GPU given away)."""

    def __init__(self, trace: Trace, *, wall: float) -> None:
        self.trace = trace
        self.wall = wall  # unix seconds of slot 0 in Prometheus' history
        self.evicted: dict[str, int] = {}  # pod -> slot
        self._objects: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # pod -> (node, pod), built once
        self._builder: snapshot_build.Builder | None = None  # re-does only what changed between cycles

    def time(self, slot: int) -> float:
        return self.wall + slot * self.trace.step

    def live(self, slot: int) -> list[PodTrace]:
        return [p for p in self.trace.pods.values() if p.first <= slot <= p.last and p.name not in self.evicted]

    def cluster(self, slot: int, *, rule: Policy, pending: int, config: settings.Settings) -> snapshot.Snapshot:
        objects = [self._object(pod.name, pod.name, since=pod.first, priority=VICTIM_PRIORITY,
                                class_name=VICTIM_CLASS) for pod in self.live(slot)]
        objects += [  # the preemptor holds the freed GPU (no reclaim policy) while the pod would have lived
            self._object(f"took-{name}", name, since=when, priority=PREEMPTOR_PRIORITY, class_name=None)
            for name, when in self.evicted.items() if slot <= self.trace.pods[name].last
        ]
        pods = [pod for _, pod in objects]
        pods += [self._object(f"want-{i}", None, since=0, priority=PREEMPTOR_PRIORITY, class_name=None)[1]
                 for i in range(pending)]
        classes = [builders.priority_class(VICTIM_CLASS, VICTIM_PRIORITY, annotations=class_annotations(rule))]
        if self._builder is None:
            self._builder = snapshot_build.Builder(names=config.names)
        return self._builder.build(nodes={snapshot.node_name(node): node for node, _ in objects},
                                   pods={snapshot.pod_key(pod): pod for pod in pods}, priority_classes=classes,
                                   taken_at=self.time(slot))

    def _object(self, name: str, node: str | None, *, since: int, priority: int,
                class_name: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """A pod's node and the pod (running on it, or pending when `node` is None), the same dicts every cycle."""
        if name not in self._objects:
            pod = (_running(name, node=node_of(node), since=self.time(since), priority=priority, class_name=class_name)
                   if node else _pending(name, created=self.wall))
            self._objects[name] = (builders.gpu_node(node_of(node or name), gpus=1), pod)
        return self._objects[name]


def class_annotations(rule: Policy) -> dict[str, str]:
    """The PriorityClass annotations of a gpu-steward policy, as the chart writes them."""
    if rule.kind != "gpu-steward":
        return {}
    learned = {settings.Names().learned_idle_window: "true"} if rule.learned else {}
    return {
        f"{policy.PREFIX}resource-idle-seconds": str(rule.window_seconds),
        f"{policy.PREFIX}resource-idle-usage-threshold": f"{rule.threshold_percent:g}",
        f"{policy.PREFIX}toleration-seconds": str(rule.toleration_seconds),
        **learned,
    }


def standing_demand(config: settings.Settings) -> int:
    """Pending pods in the queue: one more than a cycle may serve (every trace pod is in one namespace)."""
    limits = config.descheduler.reclaim.limits
    return min(limits.per_cycle, limits.per_namespace) + 1


class ReplaySource:
    """The snapshot the loop reads, set by the replay before each cycle."""

    def __init__(self) -> None:
        self.snapshot = snapshot.EMPTY
        self.synced = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SharedQueries:
    """One real query per distinct PromQL at a cycle's time: every policy of a cycle asks about the same
    instant, and the answer does not depend on who asks (each reader keeps only its pods' rows). The
    store's "now" (what the reclaim loop asks first) is the replay's clock: the trace's time."""

    def __init__(self, client: prometheus.Client) -> None:
        self._client = client
        self.clock = Clock()
        self._time: float | None = None
        self._answers: dict[str, list[dict[str, Any]]] = {}
        self.sent = 0
        self.seconds = 0.0
        self.range_seconds: list[float] = []  # duration of each range query

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        if promql == utilisation_promql.TIME_QUERY:
            return prometheus.Answer([{"metric": {}, "value": [self.clock.now, repr(self.clock.now)]}])
        return prometheus.Answer(await self.query(promql, time=self.clock.now if time is None else time))

    async def query(self, promql: str, *, time: float | None = None) -> list[dict[str, Any]]:
        if time != self._time:
            self._time, self._answers = time, {}
        if promql not in self._answers:
            started = _perf()
            self._answers[promql] = await self._client.query(promql, time=time)
            self.seconds += _perf() - started
            self.sent += 1
        return self._answers[promql]

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The learned-window arms' history reads (each arm reads its own; not shared)."""
        started = _perf()
        try:
            return await self._client.query_range(promql, start=start, end=end, step=step)
        finally:
            self.range_seconds.append(_perf() - started)


def _perf() -> float:
    return time.perf_counter()


def _by_pod(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    out = {}
    for row in rows:
        metric = row.get("metric") or {}
        if metric.get("namespace") == NAMESPACE and metric.get("pod"):
            out[str(metric["pod"])] = float(row["value"][1])
    return out


class Runner:
    """One policy over the day: its own replayed cluster, its evictions, the time its decisions took."""

    def __init__(self, rule: Policy, *, trace: Trace, wall: float, queries: SharedQueries,
                 config: settings.Settings, learn_until: float | None = None) -> None:
        self.rule = rule
        self.replay = Replay(trace, wall=wall)
        self.evictions: list[Eviction] = []
        self.seconds = 0.0
        self.fail_closed = 0  # pod-cycles the real loop judged "not idle" for want of data
        self._queries = queries
        self._config = config
        self._yardstick = yardstick(trace, config)
        self._source = ReplaySource()
        self._clock = queries.clock  # the store's time and ours: the trace's
        self._loop = reclaim_loop.ReclaimLoop(
            config=config, cluster=self._source, prometheus=queries, evictions=evictor.DryRunClient(), api=None,
            clock=self._clock,
        ) if rule.kind == "gpu-steward" else None
        if self._loop is not None:  # store time: each cycle waits for its history refresh (`Learner.wait`)
            self._loop.learner.wait = True
        if self._loop is not None and learn_until is not None:  # the split: history only up to `learn_until`
            self._loop.learner = idle_history.Learner(config=config, prometheus=queries, until=learn_until, wait=True)

    async def cycle(self, slot: int) -> None:
        started = _perf()
        made = await self._decide(slot)
        self.seconds += _perf() - started
        for eviction in made:
            self.replay.evicted[eviction.pod] = slot
        self.evictions += made

    async def _decide(self, slot: int) -> list[Eviction]:
        now = self.replay.time(slot)
        if self.rule.kind == "none":
            return []
        if self._loop is not None:
            self._source.snapshot = self.replay.cluster(
                slot, rule=self.rule, pending=standing_demand(self._config), config=self._config)
            self._clock.now = now
            cycle = await self._loop.cycle()
            self.fail_closed += sum(1 for s in cycle.plan.spared
                                    if s.reason.startswith("not idle:") and "GPU utilisation" not in s.reason)
            return [Eviction(o.eviction.pod.partition("/")[2], slot, o.eviction.reason, o.eviction.window_seconds)
                    for o in cycle.outcomes if o.result in evictor.SUCCESS]
        window = f"[{self.rule.window_seconds}s]"
        promql = {"plugin": f"avg_over_time({METRIC}{window})", "instant": METRIC,
                  "strict": f"max_over_time({METRIC}{window})"}[self.rule.kind]
        readings = _by_pod(await self._queries.query(promql, time=now))
        if self.rule.kind == "strict":
            counts = _by_pod(await self._queries.query(f"count_over_time({METRIC}{window})", time=now))
            newest = _by_pod(await self._queries.query(f"timestamp({METRIC})", time=now))
        made = []
        for pod in self.replay.live(slot):
            if not judged(scheduled=self.replay.time(pod.first), now=now, policy=self.rule):
                continue
            value = readings.get(pod.name)
            if self.rule.kind == "plugin":
                idle = plugin_idle(value, threshold_percent=self.rule.threshold_percent)
            elif self.rule.kind == "instant":
                idle = instant_idle(value, threshold_percent=self.rule.threshold_percent)
            else:
                last = newest.get(pod.name)
                idle = strict_idle(value, counts.get(pod.name), None if last is None else now - last,
                                   policy=self.rule, yardstick=self._yardstick)
            if idle:
                shown = "no data (read as 0)" if value is None else f"{value:.2f}%"
                made.append(Eviction(pod.name, slot, f"{promql} = {shown}"))
        return made


# --- the run --------------------------------------------------------------------------------------


MIN_COVERAGE = 0.9  # the yardstick's "enough data": this share of the samples the cadence puts in a window


def yardstick(trace: Trace, config: settings.Settings) -> Yardstick:
    """"Enough data", one bar for every policy, measured on the trace's cadence."""
    return Yardstick(trace.step, config.descheduler.reclaim.max_sample_age_seconds, MIN_COVERAGE)


def load_trace(path: pathlib.Path, *, pods: int | None, hours: float | None) -> Trace:
    with gzip.open(path, "rt", newline="") as handle:
        rows = [(float(r["timestamp_anon"]), float(r["value"]), r["container_ip"]) for r in csv.DictReader(handle)]
    return parse_trace(rows, pods=pods, hours=hours)


def history(trace: Trace) -> list[localprometheus.Series]:
    last = trace.slots - 1
    return [
        localprometheus.Series(METRIC, {"pod": pod.name, "namespace": NAMESPACE, "Hostname": node_of(pod.name),
                                        "gpu": "0"},
                               [((last - s) * trace.step, v) for s, v in pod.samples.items()])
        for pod in trace.pods.values()
    ]


async def replay(trace: Trace, rules: Sequence[Policy], *, interval_slots: int, config: settings.Settings,
                 wall: float, judge_from: int = 0) -> tuple[list[Runner], SharedQueries, int]:
    """`judge_from`: the first slot with a cycle; learned windows learn only from the history before it."""
    client = prometheus.Client(config.prometheus)
    try:
        queries = SharedQueries(client)
        until = wall + judge_from * trace.step if judge_from else None
        runners = [Runner(r, trace=trace, wall=wall, queries=queries, config=config, learn_until=until)
                   for r in rules]
        cycles = 0
        first = interval_slots * max(1, math.ceil(judge_from / interval_slots))
        for slot in range(first, trace.slots, interval_slots):
            cycles += 1
            for runner in runners:
                await runner.cycle(slot)
        return runners, queries, cycles
    finally:
        client.close()


def wall_of(now: float, *, span: float, step: float, phase: int, phases: int) -> float:
    """Unix seconds of the trace's slot 0: `phase` / `phases` of a history step (`step`) past a multiple of it,
    the trace (`span` seconds) ending more than a step before `now`. A learned window depends on this offset
    (a stretch is measured in whole history steps), so it is fixed, not the wall clock's: phase K of N is the
    offset `learned_window_sweep.py` replays as its phase K of N."""
    if not 0 <= phase < phases:
        raise ValueError(f"phase {phase} is not one of 0..{phases - 1}")
    return (math.floor((now - span) / step) - 1) * step + step * phase / phases


def run(trace: Trace, rules: Sequence[Policy], *, interval_seconds: float, judge_from_hours: float = 0.0,
        phase: int = 0, phases: int = 1, reclaim: Mapping[str, Any] | None = None) -> dict[str, Any]:
    interval_slots = max(1, round(interval_seconds / trace.step))
    judge_from = round(judge_from_hours * 3600 / trace.step)
    started = _perf()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="reclaim-trace-") as tmp:
        step = settings.LearnedWindow(**LEARNED).step_seconds
        wall = wall_of(time.time(), span=(trace.slots - 1) * trace.step, step=step, phase=phase, phases=phases)
        server = localprometheus.start_prometheus(pathlib.Path(tmp), history(trace),
                                                  now=wall + (trace.slots - 1) * trace.step)
        try:
            backfill_seconds = _perf() - started
            config = settings_loader.load(overrides={
                "prometheus": {"url": server.url, "timeout_seconds": 30},
                "descheduler": {"reclaim": {**(reclaim or {}), "mode": "on-demand", "dry_run": True,
                                             "learned_window": LEARNED}},
            })
            runners, queries, cycles = asyncio.run(
                replay(trace, rules, interval_slots=interval_slots, config=config, wall=wall, judge_from=judge_from))
        finally:
            server.stop()
    stick = yardstick(trace, config)
    clairvoyant = clairvoyant_hours(trace, since=judge_from)
    rows = []
    floor = int(config.descheduler.reclaim.learned_window.floor_seconds)
    for runner in runners:
        result = score(trace, judged_as(runner.rule, floor_seconds=floor), runner.evictions, yardstick=stick,
                       since=judge_from)
        goals = result.goals() if runner.rule.tier and runner.rule.kind == "gpu-steward" else None
        of_clairvoyant = result.reclaimed_hours / clairvoyant if clairvoyant else None  # None: nothing to free
        if goals is not None and of_clairvoyant is not None:
            goals["clairvoyant_share"] = of_clairvoyant >= CLAIRVOYANT_GOAL
        rows.append({
            "policy": dataclasses.asdict(runner.rule),
            "evictions": result.evictions, "regretted": result.regretted,
            "regretted_share": round(result.regretted_share, 4), "missing_data_evictions": result.missing_data,
            "reclaimable_gpu_hours": round(result.reclaimable_hours, 3),
            "reclaimed_gpu_hours": round(result.reclaimed_hours, 3),
            "reclaimed_share": round(result.reclaimed_share, 4),
            "idle_gpu_hours_freed": round(result.idle_reclaimed_hours, 3),
            "busy_gpu_hours_lost": round(result.busy_lost_hours, 3),
            "of_clairvoyant": None if of_clairvoyant is None else round(of_clairvoyant, 4),
            "goals_met": goals,
            "decision_seconds": round(runner.seconds, 2), "fail_closed_pod_cycles": runner.fail_closed,
            "eviction_details": list(result.details),
        })
    total = sum(len(p.slots) for p in trace.pods.values()) * trace.step / 3600
    idle = sum(1 for p in trace.pods.values() for v in p.samples.values() if v < IDLE_PERCENT) * trace.step / 3600
    return {
        "trace": {"pods": len(trace.pods), "hours": round(trace.slots * trace.step / 3600, 2),
                  "step_seconds": trace.step, "samples": sum(len(p.slots) for p in trace.pods.values()),
                  "gpu_hours_observed": round(total, 2), "idle_gpu_hours_observed": round(idle, 2)},
        "clairvoyant_gpu_hours": round(clairvoyant, 3),
        "cycles": cycles, "cycle_interval_seconds": interval_slots * trace.step,
        "promql_queries": queries.sent, "promql_seconds": round(queries.seconds, 2),
        "judged_from_hours": round(judge_from * trace.step / 3600, 2),
        "phase": {"index": phase, "of": phases, "offset_seconds": round(wall % step, 3), "history_step_seconds": step},
        "learned_window": {**config.descheduler.reclaim.learned_window.model_dump(mode="json"),
                           "range_queries": len(queries.range_seconds),
                           "range_query_seconds_max": round(max(queries.range_seconds, default=0.0), 3)},
        "backfill_and_start_seconds": round(backfill_seconds, 2), "wall_seconds": round(_perf() - started, 1),
        "yardstick": {"idle_below_percent": IDLE_PERCENT, "regret_within_seconds": REGRET_SECONDS,
                      **dataclasses.asdict(stick)},
        "goals": {**GOALS, "clairvoyant_share_min": CLAIRVOYANT_GOAL},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "prometheus": _version(),
                    "load_average": {"before": [round(x, 2) for x in load_before],
                                     "after": [round(x, 2) for x in os.getloadavg()]}},
        "policies": rows,
    }


def totals(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per policy over the phases' results: evictions, regretted and missing summed (the share of the sums),
    reclaimed GPU-h and the share of the clairvoyant reclaim as the phases' mean, with the range."""
    out = []
    for rows in zip(*(r["policies"] for r in results), strict=True):
        evictions, regretted = sum(r["evictions"] for r in rows), sum(r["regretted"] for r in rows)
        shares = [r["of_clairvoyant"] for r in rows if r["of_clairvoyant"] is not None]
        out.append({
            "policy": rows[0]["policy"], "phases": len(rows), "evictions": evictions, "regretted": regretted,
            "regretted_share": round(regretted / evictions, 4) if evictions else 0.0,
            "missing_data_evictions": sum(r["missing_data_evictions"] for r in rows),
            "reclaimed_gpu_hours": round(sum(r["reclaimed_gpu_hours"] for r in rows) / len(rows), 3),
            "of_clairvoyant": round(sum(shares) / len(shares), 4) if shares else None,
            "of_clairvoyant_range": [round(min(shares), 4), round(max(shares), 4)] if shares else None,
            "per_phase": [{"evictions": r["evictions"], "regretted": r["regretted"],
                           "of_clairvoyant": r["of_clairvoyant"]} for r in rows],
        })
    return out


def totals_table(result: Mapping[str, Any]) -> str:
    """The totals over the phases, and each phase's evictions / regretted / share of the clairvoyant reclaim."""
    phases = result["phases"]
    offsets = ", ".join(f"{p['phase']['offset_seconds']:g}" for p in phases)
    first = phases[0]
    lines = [f"totals over {len(phases)} phase(s) (offsets {offsets} s against the "
             f"{first['phase']['history_step_seconds']:g}-s history steps); clairvoyant "
             f"{first['clairvoyant_gpu_hours']:.1f} GPU-h; reclaim: mean (range)",
             f"{'policy':40} {'evict':>5} {'regret':>12} {'missing':>7} {'GPU-h':>6} {'of clairv.':>16}  per phase "
             "(evictions/regretted/of clairv.)"]
    for row in result["totals"]:
        share, span = row["of_clairvoyant"], row["of_clairvoyant_range"]
        said = "-" if share is None else f"{share:.0%} ({span[0]:.0%}-{span[1]:.0%})"
        each = " ".join(f"{p['evictions']}/{p['regretted']}/" + ("-" if p["of_clairvoyant"] is None
                                                                 else f"{p['of_clairvoyant']:.0%}")
                        for p in row["per_phase"])
        lines.append(f"{row['policy']['name']:40} {row['evictions']:>5} {row['regretted']:>4} "
                     f"({row['regretted_share']:>5.1%}) {row['missing_data_evictions']:>7} "
                     f"{row['reclaimed_gpu_hours']:>6.1f} {said:>16}  {each}")
    return "\n".join(lines)


def _version() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([localprometheus.PROMETHEUS, "--version"], capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).splitlines()[0]
    return "unknown"


def recommendation(rows: Sequence[Mapping[str, Any]]) -> str:
    """The sweep point that meets every goal and frees the most idle GPU time, against the chart defaults."""
    def meets(row: Mapping[str, Any]) -> bool:
        return bool(row["reclaimed_share"] >= GOALS["reclaimed_share_min"]
                and row["regretted_share"] <= GOALS["regretted_share_max"]
                and row["missing_data_evictions"] <= GOALS["missing_data_evictions"])

    ours = [r for r in rows if r["policy"]["kind"] == "gpu-steward"]
    passing = sorted((r for r in ours if meets(r)), key=lambda r: -r["reclaimed_gpu_hours"])
    if not passing:
        best = min(ours, key=lambda r: (r["regretted_share"], -r["reclaimed_share"]), default=None)
        return ("no gpu-steward setting meets all goals" +
                (f"; least regret: {best['policy']['name']}" if best else ""))
    top = passing[0]
    return (f"best setting meeting every goal: {top['policy']['name']} "
            f"({top['reclaimed_gpu_hours']:.1f} GPU-h reclaimed, {top['regretted_share']:.1%} regretted)")


def table(result: Mapping[str, Any]) -> str:
    t = result["trace"]
    lines = [
        f"reclaim quality: {t['pods']} pods x {t['hours']} h of the GenAI trace ({t['samples']} samples, "
        f"one per {t['step_seconds']:g}s; {t['idle_gpu_hours_observed']:.1f} of {t['gpu_hours_observed']:.1f} "
        f"GPU-h idle <{IDLE_PERCENT:g}%), {result['cycles']} cycles every {result['cycle_interval_seconds']:g}s, "
        f"{result['promql_queries']} PromQL queries; "
        f"clairvoyant regret-free reclaim {result['clairvoyant_gpu_hours']:.1f} GPU-h",
        f"{'policy':40} {'evict':>5} {'regret':>11} {'missing':>7} {'reclaimed GPU-h':>15} {'of reclaimable':>14} "
        f"{'of clairv.':>10} {'idle freed':>10} {'busy lost':>9}  goals",
    ]
    for row in result["policies"]:
        goals = row["goals_met"]
        verdict = "-" if goals is None else ("MET" if all(goals.values()) else
                                             "missed: " + ", ".join(k for k, ok in goals.items() if not ok))
        lines.append(
            f"{row['policy']['name']:40} {row['evictions']:>5} {row['regretted']:>4} ({row['regretted_share']:>4.0%})"
            f" {row['missing_data_evictions']:>7} {row['reclaimed_gpu_hours']:>15.1f} "
            f"{row['reclaimed_share']:>6.0%} of {row['reclaimable_gpu_hours']:>5.1f} "
            f"{'-' if row['of_clairvoyant'] is None else format(row['of_clairvoyant'], '.0%'):>10} "
            f"{row['idle_gpu_hours_freed']:>9.1f}h {row['busy_gpu_hours_lost'] * 60:>7.0f}min  {verdict}")
    lines.append(recommendation(result["policies"]))
    lines.append(f"wall {result['wall_seconds']}s (backfill + start {result['backfill_and_start_seconds']}s, "
                 f"PromQL {result['promql_seconds']}s); load average {result['machine']['load_average']}")
    return "\n".join(lines)


# Series of the reclaimed-vs-regret picture: which rows (a test of the row's policy), in which colour.
CURVES: dict[str, tuple[Callable[[Mapping[str, Any]], bool], tuple[int, int, int]]] = {
    "gpu-steward, fixed windows (peak <5%)": (lambda p: p["kind"] == "gpu-steward" and p["threshold_percent"] == 5.0
                                              and not p.get("learned"), (0, 90, 200)),
    "ReclaimIdleResource plugin semantics (average)": (lambda p: p["kind"] == "plugin", (200, 60, 0)),
}


def draw_curve(result: Mapping[str, Any], path: pathlib.Path) -> None:
    """Reclaimed GPU-h as a share of the clairvoyant regret-free reclaim (y) against the share of evictions
    regretted (x), one point per window, a line per kind of policy; the goal's corner shaded."""
    width, height, left, bottom, top, right = 820, 520, 70, 60, 60, 260
    rows = [r for r in result["policies"] if r["of_clairvoyant"] is not None
            and (r["goals_met"] is not None or any(selects(r["policy"]) for selects, _ in CURVES.values()))]
    xmax = max([r["regretted_share"] for r in rows] + [0.1]) * 100
    ymax = max([r["of_clairvoyant"] for r in rows] + [1.0]) * 100
    sx, sy = (width - left - right) / xmax, (height - bottom - top) / ymax

    def at(regret: float, share: float) -> tuple[float, float]:
        return left + regret * 100 * sx, height - bottom - share * 100 * sy

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([*at(0, ymax / 100), *at(GOALS["regretted_share_max"], CLAIRVOYANT_GOAL)], fill=(220, 245, 220))
    draw.text((left, 12), f"reclaimed vs regret, {result['trace']['pods']} pods x {result['trace']['hours']} h; "
              f"clairvoyant {result['clairvoyant_gpu_hours']:.1f} GPU-h = 100%", fill="black")
    draw.text((left, 30), "green: the goal (>= 60% of clairvoyant, <= 5% regretted)", fill=(0, 120, 0))
    draw.line([*at(0, 0), *at(xmax / 100, 0)], fill="black")
    draw.line([*at(0, 0), *at(0, ymax / 100)], fill="black")
    for tick in range(0, int(xmax) + 1, 10):
        x, y = at(tick / 100, 0)
        draw.text((x - 8, y + 6), f"{tick}%", fill="black")
    for tick in range(0, int(ymax) + 1, 50):
        x, y = at(0, tick / 100)
        draw.text((x - 40, y - 6), f"{tick}%", fill="black")
    draw.text((left + 120, height - 25), "evictions regretted (busy again within 10 min)", fill="black")
    draw.text((8, top - 20), "reclaimed GPU-h / clairvoyant", fill="black")
    legend = top
    for name, (selects, colour) in CURVES.items():
        points = sorted((r["policy"]["window_seconds"], at(r["regretted_share"], r["of_clairvoyant"]))
                        for r in rows if selects(r["policy"]) and r["policy"]["window_seconds"])
        if len(points) > 1:
            draw.line([p for _, p in points], fill=colour, width=2)
        for window, (x, y) in points:
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
            draw.text((x + 6, y - 12), f"{window // 60}m", fill=colour)
        draw.text((width - right + 15, legend), name, fill=colour)
        legend += 18
    for row in rows:
        if row["goals_met"] is not None:
            x, y = at(row["regretted_share"], row["of_clairvoyant"])
            draw.rectangle([x - 5, y - 5, x + 5, y + 5], outline="black", width=2)
            draw.text((x + 8, y + 2), row["policy"]["name"], fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=pathlib.Path, default=DEFAULT_TRACE)
    parser.add_argument("--pods", type=int, default=None, help="the first N pods by id (default: all)")
    parser.add_argument("--hours", type=float, default=None, help="the first H hours (default: all)")
    parser.add_argument("--interval", type=float, default=300.0,
                        help="seconds of trace time between cycles, rounded to the trace's step (default 300; "
                             "the chart's loop runs every 60)")
    parser.add_argument("--quick", action="store_true", help="CI-sized: 10 pods, 3 hours, 2 phases, chart tiers only")
    parser.add_argument("--tiers-only", action="store_true", help="no window/threshold sweep")
    parser.add_argument("--learned", action="store_true",
                        help="add each chart tier with its idle window learned per workload")
    parser.add_argument("--learned-only", action="store_true",
                        help="the chart tiers, learned and fixed, and the plugin's semantics only (implies --learned)")
    parser.add_argument("--learned-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a descheduler.reclaim.learned_window setting for the learned arms (repeatable)")
    parser.add_argument("--reclaim-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a descheduler.reclaim setting for every gpu-steward arm, e.g. part_seconds=150 "
                             "(repeatable; mode, dry_run and learned_window are the replay's own)")
    parser.add_argument("--judge-from", type=float, default=0.0, metavar="HOURS",
                        help="the split: cycles only from this hour on; learned windows learn only before it")
    parser.add_argument("--phases", type=int, default=1, metavar="N",
                        help="replay at N offsets of the trace against the learned history's steps (phase K at "
                             "K/N of a step, as learned_window_sweep.py): one Prometheus each, per-phase tables "
                             "and the totals (default 1: offset 0)")
    parser.add_argument("--phase", type=int, default=None, metavar="K",
                        help="only phase K of --phases (default: every phase)")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--png", type=pathlib.Path, default=None,
                        help=f"write the reclaimed-vs-regret curve here (a full run: {DEFAULT_PNG.relative_to(ROOT)})")
    args = parser.parse_args()
    if args.quick:
        args.pods, args.hours = args.pods or 10, args.hours or 3.0
        args.phases = max(args.phases, 2)
    tiers = chart_tiers(yaml.safe_load(VALUES.read_text()))
    LEARNED.update({k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.learned_setting)})
    learning = settings.LearnedWindow(**LEARNED)
    learned = learned_arms(tiers, floor_seconds=learning.floor_seconds) if args.learned or args.learned_only else []
    swept = not (args.quick or args.tiers_only or args.learned_only)
    if args.learned_only:
        rules = distinct([*learned, *tiers, *(b for b in baselines(tiers) if b.kind == "plugin")])
    else:
        rules = distinct([*tiers, *learned, *(sweep(SWEEP_WINDOWS, SWEEP_THRESHOLDS) if swept else []),
                          *baselines(tiers), *(plugin_sweep(SWEEP_WINDOWS, threshold_percent=IDLE_PERCENT) if swept
                                               else []),
                          *what_if(SWEEP_WINDOWS if swept else [t.window_seconds for t in tiers],
                                   threshold_percent=IDLE_PERCENT)])
    trace = load_trace(args.trace, pods=args.pods, hours=args.hours)
    reclaim = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.reclaim_setting)}
    chosen = range(args.phases) if args.phase is None else [args.phase]
    results = []
    for phase in chosen:
        results.append(run(trace, rules, interval_seconds=args.interval, judge_from_hours=args.judge_from,
                           phase=phase, phases=args.phases, reclaim=reclaim))
        print(f"phase {phase} of {args.phases}:")
        print(table(results[-1]), flush=True)
    command = " ".join(["python", "benchmarks/reclaim_trace.py", *sys.argv[1:]])
    if len(results) == 1:  # one phase: its result, as before phases existed
        result = {**results[0], "command": command}
    else:
        result = {"command": command, "phases": results, "totals": totals(results)}
        print(totals_table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")
    png = args.png or (None if args.quick else DEFAULT_PNG)
    if png is not None:
        draw_curve(results[0], png)  # several phases: the first one's
        print(f"curve: {png}")


if __name__ == "__main__":
    main()
