"""The invariant over many cycles of the pure core: one pending pod causes at most one reclaim decision
until it binds or its preemptor cooldown ends — and, even with a cooldown shorter than a cycle, never a
second one while a victim of its first is still there (terminating for its grace period, or not yet shown
terminating by the snapshot), unless kube-scheduler gave the room it freed to another pod meanwhile (it
knows nothing of what we evicted for whom; the cooldown is what covers that case).

Random clusters and demands; victims terminate for zero to three cycles; a stand-in scheduler binds, at
the start of each cycle and by priority, every pending pod that fits where nothing is left holding the GPUs
(terminating pods still hold them, as in kube-scheduler); what the reclaim loop remembers of its evictions
is kept as `ReclaimLoop` keeps it (until the preemptor cooldown ends).

PodDisruptionBudgets: idle pods belong to apps, some of which have a budget with a random `minAvailable`; each
cycle its `status.disruptionsAllowed` is what the disruption controller would say (pods of the app not
terminating, less `minAvailable`). Second invariant: a plan never evicts more of an app's pods than its budget
allows in that cycle, so no app is ever disrupted below its `minAvailable` by reclaim."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from common import settings_loader, snapshot_build
from descheduler import cooldowns, policy, reclaim
from tests import builders
from tests.unit.test_reclaim_planner import CLASSES, Raw, busy, idle, pending, running

INTERVAL = 60.0
START = 1_900_000_000.0


@dataclasses.dataclass
class World:
    nodes: dict[str, int]  # name -> GPUs
    pods: dict[str, Raw]  # key -> raw pod
    gone_at: dict[str, float] = dataclasses.field(default_factory=dict)  # terminating pod -> when it is gone
    min_available: dict[str, int] = dataclasses.field(default_factory=dict)  # app -> its budget's minAvailable
    bound: set[str] = dataclasses.field(default_factory=set)  # demands the scheduler placed (busy from then on)
    placed: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)  # (cycle, node, demand) bindings
    cycle: int = 0

    def app_of(self, key: str) -> str | None:
        return ((self.pods[key]["metadata"].get("labels") or {}).get("app")) if key in self.pods else None

    def budgets(self) -> dict[str, int]:
        """app -> disruptionsAllowed now: its pods not terminating, less minAvailable."""
        up = {app: sum(1 for k in self.pods if self.app_of(k) == app and k not in self.gone_at)
              for app in self.min_available}
        return {app: max(0, up[app] - least) for app, least in self.min_available.items()}

    def used(self, node: str) -> int:
        return sum(int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
                   for p in self.pods.values() if p["spec"].get("nodeName") == node)

    def schedule(self) -> None:
        waiting = [p for p in self.pods.values() if not p["spec"].get("nodeName")]
        for pod in sorted(waiting, key=lambda p: (-p["spec"]["priority"], p["metadata"]["name"])):
            gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            for node, total in sorted(self.nodes.items()):
                if total - self.used(node) >= gpus:
                    pod["spec"]["nodeName"] = node
                    pod["status"] = {"phase": "Running", "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T10:00:00Z"}]}
                    self.bound.add(f"team-b/{pod['metadata']['name']}")
                    self.placed.append((self.cycle, node, f"team-b/{pod['metadata']['name']}"))
                    break


def world(rng: random.Random, apps: random.Random) -> World:
    """`apps` draws the apps and budgets, so that the rest of the world is what `rng` alone draws."""
    nodes = {f"n{i}": rng.choice([1, 2, 4]) for i in range(rng.randint(1, 4))}
    pods: dict[str, Raw] = {}
    for node, total in nodes.items():
        free = total - rng.randint(0, 1)
        while free > 0:
            gpus = min(free, rng.choice([1, 1, 2]))
            name = f"idle-{len(pods)}"
            app = apps.choice(["db", "web", "solo"])
            pods[f"team-a/{name}"] = running(name, node=node, gpus=gpus, priority=1000, labels={"app": app})
            free -= gpus
    for i in range(rng.randint(1, 4)):
        pods[f"team-b/want-{i}"] = pending(f"want-{i}", gpus=rng.choice([1, 1, 2]),
                                           priority=rng.choice([6000, 10000, 20000]))
    budgets = {app: apps.randint(0, 2) for app in ("db", "web") if apps.random() < 0.6}
    return World(nodes, pods, min_available=budgets)


@dataclasses.dataclass
class Run:
    violations: list[str] = dataclasses.field(default_factory=list)
    decisions: int = 0
    tested: int = 0  # cycles in which a demand with a decision was still pending beside a victim still there
    refused: int = 0  # idle pods a budget kept from being victims


def run_cycles(seed: int, *, cooldown: float, cycles: int = 8) -> Run:
    """One random run: its violations of the invariant (none expected) and how much it exercised."""
    rng = random.Random(seed)
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {
        "cooldowns": {"preemptor_seconds": cooldown, "node_seconds": 0, "workload_seconds": 0},
        "limits": {"per_cycle": 100, "per_node": 100, "per_namespace": 100}}}})
    sim = world(rng, random.Random(-1 - seed))
    state = cooldowns.State()
    remembered: dict[str, tuple[str | None, float]] = {}  # as ReclaimLoop._leaving
    decisions: dict[str, list[tuple[int, float, dict[str, str]]]] = {}  # demand -> (cycle, when, victim -> node)
    result = Run()
    violations = result.violations
    for cycle in range(cycles):
        now = START + cycle * INTERVAL
        for key in [k for k, t in sim.gone_at.items() if t <= now]:
            sim.pods.pop(key, None)
            del sim.gone_at[key]
        sim.cycle = cycle
        sim.schedule()
        raw = []
        for key, pod in sim.pods.items():
            body: dict[str, Any] = {**pod, "metadata": dict(pod["metadata"])}
            if key in sim.gone_at:
                body["metadata"]["deletionTimestamp"] = "2026-11-21T11:59:00Z"
            raw.append(body)
        nodes = [builders.gpu_node(name, gpus=total) for name, total in sim.nodes.items()]
        allowed = sim.budgets()
        pdbs = [builders.disruption_budget(app, namespace="team-a", match={"app": app}, allowed=n)
                for app, n in allowed.items()]
        cluster = snapshot_build.build(nodes=nodes, pods=raw, priority_classes=CLASSES, names=config.names,
                                       taken_at=now, disruption_budgets=pdbs)
        assessments = {**idle(*(k for k in sim.pods if k.startswith("team-a/"))),
                       **{k: v for d in sim.bound for k, v in busy(d).items()}}
        remembered = {k: v for k, v in remembered.items() if v[1] > now}
        plan = reclaim.plan(cluster=cluster, policies=policy.parse_all(cluster.priority_classes,
                                                                       default_threshold_percent=5.0),
                            assessments=assessments, demands=reclaim.demands_from_snapshot(cluster), state=state,
                            config=config, now=now, leaving={k: d for k, (d, _) in remembered.items()})
        result.refused += sum("PodDisruptionBudget" in s.reason for s in plan.spared)
        for outcome in plan.demands:
            earlier = decisions.get(outcome.demand, [])
            result.tested += any(v in sim.pods for _, _, victims in earlier for v in victims)
            if not outcome.served:
                continue
            result.decisions += 1
            for first, when, victims in earlier:
                if now < when + cooldown:
                    violations.append(f"{outcome.demand}: second decision {now - when:.0f}s after the first")
                taken = any(c > first and n in victims.values() and d != outcome.demand for c, n, d in sim.placed)
                still = sorted(v for v in victims if v in sim.pods)
                if still and not taken:
                    violations.append(f"{outcome.demand}: second decision while {still} still there")
            victims = {p: cluster.pods[p].node_name or "" for p in outcome.victims}
            decisions.setdefault(outcome.demand, []).append((cycle, now, victims))
        for app, n in allowed.items():
            hit = sorted(e.pod for e in plan.evictions if sim.app_of(e.pod) == app)
            if len(hit) > n:
                violations.append(f"app {app}: {hit} evicted, its budget allows {n}")
        for eviction in plan.evictions:
            if eviction.pod in sim.gone_at:
                violations.append(f"{eviction.pod} evicted twice")
            # Gone within this cycle, or terminating for one to three cycles (a checkpoint's grace period).
            sim.gone_at[eviction.pod] = now + rng.choice([1.0, 30.0, 90.0, 150.0])
            remembered[eviction.pod] = (eviction.preemptor, now + cooldown)
        state = cooldowns.record(state, preemptors=sorted({e.preemptor for e in plan.evictions if e.preemptor}),
                                 nodes=(), workloads=(), config=config.descheduler.reclaim.cooldowns, now=now)
    return result


@pytest.mark.parametrize("cooldown", [pytest.param(30.0, id="issue-cooldown-30s-below-the-cycle"),
                                      pytest.param(180.0, id="default-cooldown-180s")])
@pytest.mark.parametrize("seed", range(150))
def test_one_pending_pod_one_reclaim_decision(seed: int, cooldown: float) -> None:
    assert run_cycles(seed, cooldown=cooldown).violations == []


def test_the_runs_exercise_the_invariant() -> None:
    """Not vacuous: the runs decide, and demands stay pending beside victims that outlive a cycle."""
    runs = [run_cycles(seed, cooldown=30.0) for seed in range(150)]
    assert sum(r.decisions for r in runs) > 100
    assert sum(r.tested for r in runs) > 50
    assert sum(r.refused for r in runs) > 50, "budgets must keep some victims, or the second invariant is vacuous"
