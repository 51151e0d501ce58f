"""Offline sweep of the learned idle window's settings on the GenAI trace: the pure core, no Prometheus.

    python benchmarks/learned_window_sweep.py [--hours H] [--judge-from H] [--out FILE]

An aid for choosing settings, not a measurement of the product: `benchmarks/reclaim_trace.py --learned-only`
replays the real loop against a real Prometheus, about 1,000x slower, so only the chosen settings run there.
Here each pod's history is folded by `descheduler.idle_learning` from the peak of each `step_seconds` of its
trace samples (as the range query returns it), refreshed every `refresh_seconds`, its window learned by
`idle_learning.learn`, and it is evicted at the first cycle (every 5 trace steps, as the replay) at which it
was scheduled longer than max(toleration, window) ago and every sample of the window is below 5 % with enough
data (`reclaim_trace.missing_data`). No limits, cooldowns or demand: every idle pod goes. Scored by
`reclaim_trace.score` exactly as the replay is (regret: busy within 10 min; reclaimable from the floor on).
Arms: the fixed tier window; the rule this replaced (longest stretch that ended in work x 3, clamped to the
floor and the tier window: `previous()`); the product's defaults; and one setting changed at a time.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import reclaim_trace as rt  # noqa: E402
from common import settings  # noqa: E402
from descheduler import idle_learning  # noqa: E402

WALL = 1_700_000_000.0  # unix seconds of slot 0: an arbitrary phase against the history's steps
TIER, TOLERATION, THRESHOLD = 10800, 1800, 5.0  # the chart's normal tier
INTERVAL_SLOTS = 5  # a cycle every 5 trace steps (285 s), as the replay's default
SWEEP: list[dict[str, Any]] = [{}, {"min_at_risk": 10}, {"min_at_risk": 30}, {"resume_probability": 0.1},
                               {"resume_probability": 0.025}, {"min_stretches": 3}, {"floor_seconds": 3600.0}]
PREVIOUS_MARGIN = 3.0  # the rule learned windows had before the survival estimate


def coarse(pod: rt.PodTrace, *, step: float, history_step: float) -> list[tuple[float, float]]:
    """The pod's peak per history step, (end of the step, peak), as `max_over_time(...[step])` at that step."""
    peaks: dict[float, float] = {}
    for slot, value in pod.samples.items():
        end = math.ceil((WALL + slot * step) / history_step) * history_step
        peaks[end] = max(peaks.get(end, -1.0), value)
    return sorted(peaks.items())


def previous(stretches: list[float], *, config: settings.LearnedWindow) -> int:
    """The earlier rule: clamp(longest x 3, floor, tier window), rounded up to the bucket (too few: the tier's)."""
    if len(stretches) < config.min_stretches:
        return TIER
    window = max(max(stretches) * PREVIOUS_MARGIN, config.floor_seconds)
    return min(TIER, math.ceil(window / config.bucket_seconds) * config.bucket_seconds)


def replay(trace: rt.Trace, config: settings.LearnedWindow | None, *, judge_from: int,
           earlier: bool = False) -> list[rt.Eviction]:
    """Evictions of the normal tier, learned (`config`; by the previous rule if `earlier`) or fixed (None)."""
    step, hstep = trace.step, config.step_seconds if config else 300.0
    yardstick = rt.Yardstick(step, 180.0, rt.MIN_COVERAGE)
    peaks = {name: coarse(pod, step=step, history_step=hstep) for name, pod in trace.pods.items()}
    histories = dict.fromkeys(trace.pods, idle_learning.History())
    read_to: float | None = None
    pool = idle_learning.Pool()
    until = WALL + judge_from * step if judge_from else math.inf
    evicted: set[str] = set()
    out = []
    first = INTERVAL_SLOTS * max(1, math.ceil(judge_from / INTERVAL_SLOTS))
    for slot in range(first, trace.slots, INTERVAL_SLOTS):
        now = WALL + slot * step
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


def row(trace: rt.Trace, name: str, config: settings.LearnedWindow | None, *, judge_from: int,
        earlier: bool = False) -> dict[str, Any]:
    rule = rt.Policy(name, "gpu-steward", TIER, THRESHOLD, TOLERATION, tier="normal", learned=config is not None)
    floor = int(config.floor_seconds) if config else TIER
    result = rt.score(trace, rt.judged_as(rule, floor_seconds=floor),
                      replay(trace, config, judge_from=judge_from, earlier=earlier),
                      yardstick=rt.Yardstick(trace.step, 180.0, rt.MIN_COVERAGE), since=judge_from)
    clairvoyant = rt.clairvoyant_hours(trace, since=judge_from)
    return {"arm": name, "evictions": result.evictions, "regretted": result.regretted,
            "regretted_share": round(result.regretted_share, 4), "missing_data_evictions": result.missing_data,
            "reclaimed_gpu_hours": round(result.reclaimed_hours, 2),
            "of_clairvoyant": round(result.reclaimed_hours / clairvoyant, 4) if clairvoyant else None,
            "idle_gpu_hours_freed": round(result.idle_reclaimed_hours, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=None)
    parser.add_argument("--judge-from", type=float, default=0.0, metavar="HOURS")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--quick", action="store_true", help="CI size: the first 6 h of the trace")
    args = parser.parse_args()
    if args.quick and args.hours is None:
        args.hours = 6.0
    trace = rt.load_trace(rt.DEFAULT_TRACE, pods=None, hours=args.hours)
    judge_from = round(args.judge_from * 3600 / trace.step)
    base = settings.LearnedWindow()
    rows = [row(trace, "fixed 3 h (the tier)", None, judge_from=judge_from),
            row(trace, "previous rule: longest x 3", base, judge_from=judge_from, earlier=True)]
    for change in SWEEP:
        name = "learned, defaults" if not change else "learned, " + ", ".join(f"{k} {v:g}" for k, v in change.items())
        rows.append(row(trace, name, base.model_copy(update=change), judge_from=judge_from))
    clairvoyant = rt.clairvoyant_hours(trace, since=judge_from)
    print(f"{len(trace.pods)} pods x {trace.slots * trace.step / 3600:.1f} h, judged from {args.judge_from:g} h; "
          f"clairvoyant {clairvoyant:.1f} GPU-h")
    for r in rows:
        print(f"{r['arm']:34} {r['evictions']:>4} evictions, {r['regretted']:>2} regretted "
              f"({r['regretted_share']:.1%}), missing {r['missing_data_evictions']}, "
              f"{r['reclaimed_gpu_hours']:>6.1f} GPU-h = "
              f"{r['of_clairvoyant'] or 0:.0%} of clairvoyant, {r['idle_gpu_hours_freed']:.1f} idle GPU-h freed")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "clairvoyant_gpu_hours":
                                        round(clairvoyant, 2), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
