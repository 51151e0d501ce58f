"""Offline sweep of the learned idle window's settings on the GenAI trace: the pure core, no Prometheus.

    python benchmarks/learned_window_sweep.py [--hours H] [--judge-from H] [--phases N] [--out FILE]
    python benchmarks/learned_window_sweep.py --pool-cost GPUS  # time building the pool at that scale

An aid for choosing settings, not a measurement of the product: `benchmarks/reclaim_trace.py --learned-only`
replays the real loop against a real Prometheus, about 1,000x slower, so only the chosen settings run there.
Here each pod's history is folded by `descheduler.reclaim.idle_learning` from the peak of each `step_seconds` of its
trace samples (as the range query returns it), refreshed every `refresh_seconds`, its window learned by
`idle_learning.learn`, and it is evicted at the first cycle (every 5 trace steps, as the replay) at which it
was scheduled longer than max(toleration, window) ago and every sample of the window is below 5 % with enough
data (`reclaim_trace.missing_data`). No limits, cooldowns or demand: every idle pod goes. Scored by
`reclaim_trace.score` exactly as the replay is (regret: busy within 10 min; reclaimable from the floor on).
Each arm runs at `--phases` offsets of the trace against the history's 5-min steps (phase K at K/N of a step;
`reclaim_trace.py --phases N` replays the same phases in the real loop): a stretch's length in whole steps, and so
a learned window, moves with it. Totals over the phases are printed (evictions, regretted), with the mean share of
the clairvoyant reclaim and its range. Arms: the fixed tier window; the rule this replaced (longest stretch that
ended in work x 3, clamped to the floor and the tier window: `previous()`); the product's defaults; and one setting
changed at a time.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import pathlib
import random
import sys
import time
import tracemalloc
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import reclaim_trace as rt  # noqa: E402
from common import settings  # noqa: E402
from descheduler.reclaim import idle_learning  # noqa: E402

WALL = 1_700_000_000.0  # unix seconds of slot 0 at phase 0 (a multiple of the 300-s history step)
TIER, TOLERATION, THRESHOLD = 10800, 1800, 5.0  # the chart's normal tier
INTERVAL_SLOTS = 5  # a cycle every 5 trace steps (285 s), as the replay's default
SWEEP: list[dict[str, Any]] = [{}, {"min_at_risk": 10}, {"min_at_risk": 30}, {"resume_probability": 0.1},
                               {"resume_probability": 0.025}, {"min_stretches": 3}, {"floor_seconds": 3600.0}]
PREVIOUS_MARGIN = 3.0  # the rule learned windows had before the survival estimate


def coarse(pod: rt.PodTrace, *, step: float, history_step: float, wall: float) -> list[tuple[float, float]]:
    """The pod's peak per history step, (end of the step, peak), as `max_over_time(...[step])` at that step."""
    peaks: dict[float, float] = {}
    for slot, value in pod.samples.items():
        end = math.ceil((wall + slot * step) / history_step) * history_step
        peaks[end] = max(peaks.get(end, -1.0), value)
    return sorted(peaks.items())


def previous(stretches: list[float], *, config: settings.LearnedWindow) -> int:
    """The earlier rule: clamp(longest x 3, floor, tier window), rounded up to the bucket (too few: the tier's)."""
    if len(stretches) < config.min_stretches:
        return TIER
    window = max(max(stretches) * PREVIOUS_MARGIN, config.floor_seconds)
    buckets = math.ceil(window / config.bucket_seconds)
    return min(TIER, math.ceil(buckets * config.bucket_seconds))  # whole seconds, as idle_learning.learn's window


def replay(trace: rt.Trace, config: settings.LearnedWindow | None, *, judge_from: int, earlier: bool = False,
           wall: float = WALL) -> list[rt.Eviction]:
    """Evictions of the normal tier, learned (`config`; by the previous rule if `earlier`) or fixed (None)."""
    step, hstep = trace.step, config.step_seconds if config else 300.0
    yardstick = rt.Yardstick(step, 180.0, rt.MIN_COVERAGE)
    peaks = {name: coarse(pod, step=step, history_step=hstep, wall=wall) for name, pod in trace.pods.items()}
    histories = dict.fromkeys(trace.pods, idle_learning.History())
    read_to: float | None = None
    pool = idle_learning.Pool()
    until = wall + judge_from * step if judge_from else math.inf
    evicted: set[str] = set()
    out = []
    first = INTERVAL_SLOTS * max(1, math.ceil(judge_from / INTERVAL_SLOTS))
    for slot in range(first, trace.slots, INTERVAL_SLOTS):
        now = wall + slot * step
        if config is not None:
            end = math.floor(min(now, until) / hstep) * hstep
            if read_to is None or read_to < end - config.refresh_seconds:
                for name in trace.pods:
                    fresh = [(t, v) for t, v in peaks[name] if (read_to or -math.inf) < t <= end]
                    histories[name] = idle_learning.fold(histories[name], fresh, step_seconds=hstep,
                                                         threshold_percent=THRESHOLD)
                read_to = end
                pool = idle_learning.pool(histories.values(), step_seconds=hstep,
                                          min_stretches=config.min_stretches)
        for name, pod in trace.pods.items():
            if name in evicted or not pod.first <= slot <= pod.last:
                continue
            window = TIER
            if config is not None:
                stretches = idle_learning.stretches_of([histories[name]], since=now - config.lookback_seconds)
                window = previous(stretches, config=config) if earlier else idle_learning.learn(
                    stretches, tier_window=TIER, pool=pool, config=config).window_seconds
            if (slot - pod.first) * step <= max(TOLERATION, window):
                continue
            seen = pod.slots[bisect.bisect_left(pod.slots, slot - window / step):bisect.bisect_right(pod.slots, slot)]
            if not seen or any(pod.samples[s] >= THRESHOLD for s in seen):
                continue
            if rt.missing_data(pod, slot, window_seconds=window, yardstick=yardstick) is None:
                evicted.add(name)
                out.append(rt.Eviction(name, slot, f"window {window}s", window))
    return out


def row(trace: rt.Trace, name: str, config: settings.LearnedWindow | None, *, judge_from: int, phases: int,
        earlier: bool = False) -> dict[str, Any]:
    rule = rt.Policy(name, "gpu-steward", TIER, THRESHOLD, TOLERATION, tier="normal", learned=config is not None)
    floor = int(config.floor_seconds) if config else TIER
    clairvoyant = rt.clairvoyant_hours(trace, since=judge_from)
    results = [rt.score(trace, rt.judged_as(rule, floor_seconds=floor),
                        replay(trace, config, judge_from=judge_from, earlier=earlier, wall=WALL + offset),
                        yardstick=rt.Yardstick(trace.step, 180.0, rt.MIN_COVERAGE), since=judge_from)
               for offset in (300.0 * i / phases for i in range(phases))]
    evictions, regretted = sum(r.evictions for r in results), sum(r.regretted for r in results)
    shares = [r.reclaimed_hours / clairvoyant if clairvoyant else 0.0 for r in results]
    return {"arm": name, "evictions": evictions, "regretted": regretted,
            "regretted_share": round(regretted / evictions, 4) if evictions else 0.0,
            "missing_data_evictions": sum(r.missing_data for r in results),
            "reclaimed_gpu_hours": round(sum(r.reclaimed_hours for r in results) / phases, 2),
            "of_clairvoyant": round(sum(shares) / phases, 4), "of_clairvoyant_range": [round(min(shares), 4),
                                                                                        round(max(shares), 4)],
            "idle_gpu_hours_freed": round(sum(r.idle_reclaimed_hours for r in results) / phases, 2),
            "per_phase": [{"evictions": r.evictions, "regretted": r.regretted, "of_clairvoyant": round(share, 4)}
                          for r, share in zip(results, shares, strict=True)]}


def pool_cost(gpus: int, *, days: float = 7.0, per_day: int = 25, repeats: int = 3) -> dict[str, Any]:
    """CPU and wall seconds of `idle_learning.pool()` over `gpus` synthetic series of `days` x `per_day` idle
    stretches (1-20 steps long; the GenAI trace has about 25 a day per pod), as the descheduler builds it after
    each history read. CPU time is the one to read on a shared machine. Memory (Python's allocations, by
    tracemalloc, in a pass of its own): the histories as the descheduler keeps them, and the pool built from them."""
    rng = random.Random(1)
    count = round(days * per_day)

    def histories() -> list[idle_learning.History]:
        return [idle_learning.History(last=1.0, run_start=0.0, run_steps=rng.randint(1, 50), stretches=tuple(
            (1.8e9 + 3456.0 * i + g, 300.0 * rng.randint(1, 20)) for i in range(count))) for g in range(gpus)]

    tracemalloc.start()
    kept = histories()
    held = tracemalloc.get_traced_memory()[0]
    pooled = idle_learning.pool(kept, step_seconds=300.0, min_stretches=settings.LearnedWindow().min_stretches)
    memory = {"histories_mb": round(held / 1e6), "pool_mb": round((tracemalloc.get_traced_memory()[0] - held) / 1e6),
              "pooled": len(pooled.ended)}
    tracemalloc.stop()
    del kept, pooled
    series = histories()
    cpu, wall = [], []
    for _ in range(repeats):
        started, clock = time.process_time(), time.perf_counter()
        built = idle_learning.pool(series, step_seconds=300.0, min_stretches=settings.LearnedWindow().min_stretches)
        cpu.append(time.process_time() - started)
        wall.append(time.perf_counter() - clock)
    return {"gpus": gpus, "stretches": gpus * count, "pooled": len(built.ended) + len(built.censored),
            "cpu_seconds": [round(c, 3) for c in cpu], "wall_seconds": [round(w, 3) for w in wall], "memory": memory,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=None)
    parser.add_argument("--judge-from", type=float, default=0.0, metavar="HOURS")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--phases", type=int, default=5, help="offsets of the trace against the history steps")
    parser.add_argument("--pool-cost", type=int, default=None, metavar="GPUS",
                        help="only time building the pool of GPUS synthetic series of 7 d")
    parser.add_argument("--quick", action="store_true", help="CI size: the first 6 h of the trace, 2 phases")
    args = parser.parse_args()
    if args.pool_cost:
        cost = pool_cost(args.pool_cost)
        print(json.dumps(cost))
        if args.out:
            args.out.write_text(json.dumps(cost, indent=2) + "\n")
        return
    if args.quick:
        args.hours, args.phases = args.hours or 6.0, 2
    trace = rt.load_trace(rt.DEFAULT_TRACE, pods=None, hours=args.hours)
    judge_from = round(args.judge_from * 3600 / trace.step)
    base = settings.LearnedWindow()
    phases = args.phases
    rows = [row(trace, "fixed 3 h (the tier)", None, judge_from=judge_from, phases=phases),
            row(trace, "previous rule: longest x 3", base, judge_from=judge_from, phases=phases, earlier=True)]
    for change in SWEEP:
        name = "learned, defaults" if not change else "learned, " + ", ".join(f"{k} {v:g}" for k, v in change.items())
        rows.append(row(trace, name, base.model_copy(update=change), judge_from=judge_from, phases=phases))
    clairvoyant = rt.clairvoyant_hours(trace, since=judge_from)
    print(f"{len(trace.pods)} pods x {trace.slots * trace.step / 3600:.1f} h, judged from {args.judge_from:g} h; "
          f"clairvoyant {clairvoyant:.1f} GPU-h; totals over {phases} phase(s), reclaim their mean (range)")
    for r in rows:
        low, high = r["of_clairvoyant_range"]
        print(f"{r['arm']:36} {r['evictions']:>4} evictions, {r['regretted']:>2} regretted "
              f"({r['regretted_share']:.1%}), missing {r['missing_data_evictions']}, "
              f"{r['reclaimed_gpu_hours']:>6.1f} GPU-h = {r['of_clairvoyant']:.0%} ({low:.0%}-{high:.0%}) "
              f"of clairvoyant, {r['idle_gpu_hours_freed']:.1f} idle GPU-h freed")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "phases": phases,
                                        "clairvoyant_gpu_hours": round(clairvoyant, 2), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
