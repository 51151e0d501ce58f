"""The benchmark figures the README and the docs quote, made from `benchmarks/results/*.json`: the one place a
figure is written down, so that no copy drifts from its run.

    python benchmarks/figures.py           # rewrite docs/figures.md
    python benchmarks/figures.py --check   # exit 1 if docs/figures.md is not what the results make now

Not a benchmark (`scripts/test` skips it); `tests/unit/test_figures.py` fails while docs/figures.md is stale.
Each row names its result file and the load average the run recorded (or says it recorded none); the runs'
commands and machine notes are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
OUT = REPO / "docs" / "figures.md"

Result = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Figure:
    section: tuple[str, str]  # title, what was run
    what: str
    source: str  # a file under benchmarks/results
    value: Callable[[Result], str]


def percent(share: float) -> str:
    return f"{100 * share:.1f} %"


def seconds(value: float) -> str:
    return f"{value:.2f} s"


def _placement(arm: str, key: str) -> Callable[[Result], str]:
    def value(result: Result) -> str:
        arms = result["arms"]
        if key == "one_domain_share":
            return percent(arms[arm]["placement"]["one_domain_share"])
        if key == "never_scheduled":
            return str(arms[arm]["pending"]["never_scheduled"])
        if key == "wait_p99_seconds":
            return seconds(arms[arm]["pending"]["wait_p99_seconds"])
        if key == "burst_vs_default":
            ratio = arms[arm]["burst"]["pods_per_second"] / arms["default"]["burst"]["pods_per_second"]
            return f"{ratio:.2f}x"
        if key == "gpus_bound":  # what never-scheduled counts in pods leaves out: the GPUs the bound pods hold
            bound = arms[arm]["bindings"]
            large = sum(1 for b in bound if b["gpus"] == 8)
            return f"{sum(b['gpus'] for b in bound)} ({large} pods of 8 GPUs, {len(bound) - large} others)"
        if key == "nominations_missed":
            missed = arms[arm]["nominations_missed"]
            return f"{missed['pods']} of {missed['nominated']}"
        if key == "cpu_seconds":  # our processes' CPU over the arm (a DRA cluster writes a claim per bound pod)
            cpu = arms[arm]["cpu_seconds"]
            return f"webhook {cpu['webhook']:.1f} s, descheduler {cpu['descheduler']:.1f} s"
        if key == "gated_p50_vs_default":  # the pods our webhook gates, against the same pods without us
            same = [g["value"] for g in result.get("goals", []) if g["arm"] == arm and "same pods" in g["goal"]]
            if same:  # the run's own figure: the pods bound in both arms
                ours, theirs = same[0]["wait_p50_seconds"], same[0]["default_wait_p50_seconds"]
                return f"{ours / theirs:.1f}x ({ours:.2f} s against {theirs:.2f} s, the same {same[0]['pods']} pods)"
            # Files before the same-pods measure: each arm's own gated pods, which are not the same pods.
            mine, default = (arms[a]["pending"]["waits"]["gated"] for a in (arm, "default"))
            ours, theirs = mine["wait_p50_seconds"], default["wait_p50_seconds"]
            return (f"{ours / theirs:.1f}x ({ours:.2f} s against {theirs:.2f} s; not the same pods: every gated pod "
                    f"bound in each arm, {mine['pods_bound']} and {default['pods_bound']})")
        raise KeyError(key)

    return value


def _policy(name: str, key: str) -> Callable[[Result], str]:
    def value(result: Result) -> str:
        (policy,) = [p for p in result["policies"] if p["policy"]["name"] == name]
        return str(policy[key]) if key == "missing_data_evictions" else percent(policy[key])

    return value


def _learned(name: str, key: str) -> Callable[[Result], str]:
    def value(result: Result) -> str:
        (total,) = [t for t in result["totals"] if t["policy"]["name"] == name]
        if key == "of_clairvoyant_range":
            low, high = total[key]
            return f"{percent(total['of_clairvoyant'])} ({percent(low)}-{percent(high)} by phase)"
        return percent(total[key])

    return value


def _pin_churn(run: str) -> Callable[[Result], str]:
    def value(result: Result) -> str:
        row = result["runs"][run]
        return f"{row['stuck_per_1000_arrivals']:g} per 1,000 arrivals, {row['still_stuck_at_end']} left at the end"

    return value


def _release_churn(run: str, what: str) -> Callable[[Result], str]:
    def value(result: Result) -> str:
        row = result["runs"][run]
        if what == "planned":
            return (f"{percent(row['bound_on_planned_node_share'])} ({row['bound_on_planned_node']} of "
                    f"{row['nominated_and_bound']}) at {percent(row['offered_load'])} offered load; deleted or "
                    f"re-created by gpu-steward: {row['deleted_or_recreated_by_gpu_steward']}")
        if what == "stuck":
            return (f"{row['stuck_per_1000_arrivals']:g} per 1,000 arrivals ({row['stuck_pods']}), "
                    f"{row['still_stuck_at_end']} left at the end")
        default = result["runs"][run.replace("gpu-steward", "default")]
        return (f"{row['gangs_part_running_over_threshold']} of {row['gangs']} (default scheduler: "
                f"{default['gangs_part_running_over_threshold']})")

    return value


def _decide(result: Result) -> str:
    decide = result["decide_in_process"]
    return f"p50 {decide['p50_us']:.1f} µs, p99 {decide['p99_us']:.1f} µs ({decide['gpu_nodes']:,} GPU nodes)"


def _tls(result: Result) -> str:
    ours, noop = result["servers"]["gpu-steward"], result["servers"]["noop"]
    ratio = ours["max"]["achieved_rps"] / noop["max"]["achieved_rps"]
    return (f"p99 {ours['fixed']['p99_ms']:.1f} ms at {ours['fixed']['target_rps']} requests/s; "
            f"{ours['max']['achieved_rps']:,.0f} requests/s at most, {ratio:.2f}x a no-op webhook's")


def _apiserver(key: str) -> Callable[[Result], str]:
    def value(result: Result) -> str:
        return f"{result['comparison'][key]['added_p50_ms_paired_blocks']:.1f} ms"

    return value


def _cycle_cpu(gpus: int) -> Callable[[Result], str]:
    def value(result: Result) -> str:
        (size,) = [s for s in result["prometheus"]["sizes"] if s["gpus"] == gpus]
        cpu = size["cycle_cpu_seconds_p50"]
        return f"Prometheus {cpu['prometheus']:.2f} s, descheduler {cpu['descheduler']:.2f} s"

    return value


def _quiet_cycle(result: Result) -> str:
    cycle = result["cycle_seconds"]
    return (f"cycle p50 {cycle['p50']:.2f} s, max {cycle['max']:.2f} s; slowest query "
            f"{result['query_seconds_max']:.2f} s; descheduler {result['peak_rss_mb']['descheduler']:.0f} MB")


# Each section: its title (the README links to its anchor) and what was run.
PLACEMENT = ("Placement", "`benchmarks/placement_trace.py`: the Alibaba openb trace through the real kube-scheduler "
             "1.37.2 on 200 kwok nodes, release by nomination (issue 28), two slices of the trace, on a loaded "
             "machine: load average 9-12 during pods 0-1999, 5-9 during pods 2000-3999 (from the runs' logs; these "
             "files predate the script recording it).")
PLACEMENT_QUIET = ("Placement, quieter machine", "The same replay and slices, release by nomination, with nothing "
                   "else running beside the benchmark (its own control plane, 200 kwok nodes and our processes load "
                   "the 2 cores: see each file's load average).")
PLACEMENT_PER_CHANGE = ("Placement, snapshot rebuilt per change", "The first slice again on a quieter machine, after "
                        "the snapshot became incremental (a watch event re-parses its pod and re-assembles its nodes "
                        "only: `benchmarks/snapshot_rebuild.py`); nothing else running beside the benchmark.")
PLACEMENT_EVENTS_OFF = ("Placement, release Events off the pass", "Both slices again, with release's Events posted "
                        "beside its passes instead of on their path; the three arms of each slice back to back, "
                        "nothing else running beside them (load in each file).")
PLACEMENT_REBUILD = ("Placement, snapshots rebuilt every 0.1 s (an experiment)", "The first slice with "
                     "`--rebuild-interval 0.1` (our processes rebuild their snapshot at most every 0.1 s, not 0.25 "
                     "s: the default is unchanged), arms default and gpu-steward, right after the runs above.")
PLACEMENT_EPYC = ("Placement, both slices on another machine", "Both slices again, arms default and gpu-steward, on "
                  "the 2-core AMD EPYC machine of 2026-12-07 (our processes used about half the CPU seconds of the "
                  "runs above for the same replay: a faster or far less contended machine), back to back, nothing "
                  "else running (load in each file).")
PLACEMENT_EARLY = ("Placement with early rebuilds", "Both slices, arms default and gpu-steward, with "
                   "`descheduler.gangs.early_rebuilds` on (a newly gated pod ends the pause after the descheduler's "
                   "last rebuild once it has lasted as long as that rebuild took), on the machine of 'Placement, "
                   "both slices on another machine', back to back, nothing else running (load in each file).")
PLACEMENT_DRA_RATE4 = ("Placement on DRA GPU nodes, at an arrival rate DRA scheduling keeps up with", "The same "
                       "command with `--arrival-rate 4 --time-compression 13.333` (a third of the default 12/s "
                       "and 40, so the cluster's load is the same), `--dra` and then without, back to back on a "
                       "quiet machine (nothing else running; load in each file), on two slices: pods 0-599 "
                       "(2026-12-06) and 2000-2599 (`--skip 2000`, 2026-12-07, on the machine of 'Placement, both "
                       "slices on another machine').")
PLACEMENT_DRA_READS = ("Placement on DRA GPU nodes, claims re-read only where they changed", "Both slices of "
                       "the section above (`--arrival-rate 4 --time-compression 13.333`), `--dra` "
                       "and then without, back to back on the quiet machine (load in each file), after a claim change "
                       "stopped re-parsing every claiming pod and re-reading every slice in our snapshots "
                       "(`common/dra_reads.py`, `dra.Memo`; 2026-12-07).")
PLACEMENT_DRA = ("Placement on DRA GPU nodes", "`benchmarks/placement_trace.py --nodes 60 --pods 600 --arms "
                 "default,gpu-steward` with `--dra` (each node's GPUs in a ResourceSlice, pods asking `nvidia.com/gpu` "
                 "through NVIDIA's DeviceClass) and without, back to back on a loaded machine (other runs beside "
                 "them). Issue 30 asks the DRA run to be within 1 point of the device-plugin run.")
PLACEMENT_PINS = ("Placement with pins", "The same replay with the pin design before issue 28, on a quieter machine "
                  "(RESULTS.md), kept for comparison.")
RELEASE_CHURN = ("Release churn", "`benchmarks/release_churn.py`: release by nomination (issue 28) under the same "
                 "churn as below: 800 mixed pods through 20 x 8-GPU nodes of the real control plane while nodes are "
                 "cordoned, deleted and created again; each rate against kube-scheduler alone.")
RELEASE_CHURN_EARLY = ("Release churn with early rebuilds", "The same benchmark at 2/s (~85 % load, where issue 28 "
                       "sets its goals) with `descheduler.gangs.early_rebuilds` on, both seeds, on the quiet machine "
                       "of 'Placement with early rebuilds' (load in each file).")
RELEASE_CHURN_UNBUILT = ("Release churn with the watch's newest pods", "The same benchmark at 2/s and 3/s, both seeds, "
                         "with release's last check also reading the pods the watch delivered since the snapshot was "
                         "built (`Feeder.unbuilt`), nothing else running (load in each file).")
CHURN = ("Pin churn", "`benchmarks/pin_churn.py` (the pin design before issue 28; now `release_churn.py`): 800 "
         "mixed pods through 20 x 8-GPU nodes of the real control plane while nodes are cordoned, deleted and "
         "created again, pin deadline 20 s.")
RECLAIM = ("Idle reclaim", "`benchmarks/reclaim_trace.py`: the Alibaba GenAI duty-cycle trace in a real Prometheus, "
           "the real reclaim loop cycle by cycle.")
WEBHOOK = ("Webhook cost", "`benchmarks/webhook_latency.py` (in process, and over TLS against a no-op aiohttp "
           "webhook) and `benchmarks/webhook_apiserver.py` (pod creates through the real API server).")
CYCLE = ("Descheduler cost", "`benchmarks/reclaim_cycle.py --prometheus`: a real Prometheus holding 4 h of 15 s DCGM "
         "history, the store's time advancing a minute a cycle.")


def _placement_rows(section: tuple[str, str], runs: Sequence[tuple[str, str]], *,
                    arms: Sequence[str] = ("gpu-steward", "default", "binpack"),
                    gated_waits: bool = False, gpus: bool = False, cpu: bool = False) -> list[Figure]:
    """The rows of placement_trace runs, each (its label, its result file) with `arms`; `gated_waits`: the files
    split the waits into gated pods and the rest (since issue 28); `gpus`: the GPUs bound per arm and the
    nominations missed too; `cpu`: our processes' CPU seconds."""
    rows = []
    for label, source in runs:
        for arm in arms:
            rows.append(Figure(section, f"{label}, {arm}: domain-fittable multi-GPU pods in one NVLink domain",
                               source, _placement(arm, "one_domain_share")))
            rows.append(Figure(section, f"{label}, {arm}: pods never scheduled", source,
                               _placement(arm, "never_scheduled")))
            if gpus:
                rows.append(Figure(section, f"{label}, {arm}: GPUs bound to trace pods", source,
                                   _placement(arm, "gpus_bound")))
        if gpus:
            rows.append(Figure(section, f"{label}, gpu-steward: nominations missed (bound elsewhere) of nominated",
                               source, _placement("gpu-steward", "nominations_missed")))
        if cpu:
            rows.append(Figure(section, f"{label}, gpu-steward: CPU seconds of our processes", source,
                               _placement("gpu-steward", "cpu_seconds")))
        rows.append(Figure(section, f"{label}, gpu-steward: burst bind rate against the default scheduler's",
                           source, _placement("gpu-steward", "burst_vs_default")))
        for arm in ("gpu-steward", "default"):
            rows.append(Figure(section, f"{label}, {arm}: create-to-bound wait p99", source,
                               _placement(arm, "wait_p99_seconds")))
        if gated_waits:
            rows.append(Figure(section, f"{label}, gpu-steward: gated pods' create-to-bound p50 against the "
                               "default scheduler's", source,
                               _placement("gpu-steward", "gated_p50_vs_default")))
    return rows


def _slices(design: str) -> list[tuple[str, str]]:
    """The two slices of the 200-node replay, by the design's result files."""
    return [(f"pods {part}", f"placement_trace_{design}_{part}.json") for part in ("0-2000", "2000-4000")]


FIGURES: list[Figure] = [
    *_placement_rows(PLACEMENT, _slices("nominate"), gated_waits=True),
    *_placement_rows(PLACEMENT_QUIET, _slices("nominate_quiet"), gated_waits=True),
    *_placement_rows(PLACEMENT_PER_CHANGE, [("pods 0-1999", "placement_trace_per_change_quiet_0-2000.json")],
                     gated_waits=True),
    *_placement_rows(PLACEMENT_EVENTS_OFF, _slices("events_off_pass"), gated_waits=True, gpus=True),
    *_placement_rows(PLACEMENT_REBUILD, [("pods 0-2000", "placement_trace_rebuild_0.1s_0-2000.json")],
                     arms=("gpu-steward", "default"), gated_waits=True, gpus=True),
    *_placement_rows(PLACEMENT_EPYC, _slices("epyc"), arms=("gpu-steward", "default"), gated_waits=True, gpus=True),
    *_placement_rows(PLACEMENT_EARLY, _slices("early_rebuilds"), arms=("gpu-steward", "default"), gated_waits=True,
                     gpus=True),
    *_placement_rows(PLACEMENT_DRA, [("DRA devices", "placement_trace_dra_nodes60_pods600.json"),
                                     ("device plugin", "placement_trace_device_plugin_nodes60_pods600.json")],
                     arms=("gpu-steward", "default"), gated_waits=True),
    *_placement_rows(PLACEMENT_DRA_RATE4, [
        ("DRA devices", "placement_trace_dra_rate4_nodes60_pods600.json"),
        ("device plugin", "placement_trace_device_plugin_rate4_nodes60_pods600.json"),
        ("DRA devices, pods 2000-2599", "placement_trace_dra_rate4_skip2000_nodes60_pods600.json"),
        ("device plugin, pods 2000-2599", "placement_trace_device_plugin_rate4_skip2000_nodes60_pods600.json")],
                     arms=("gpu-steward", "default"), gated_waits=True, gpus=True, cpu=True),
    *_placement_rows(PLACEMENT_DRA_READS, [
        ("DRA devices, pods 0-599", "placement_trace_dra_rate4_nodes60_pods600_dra_reads.json"),
        ("device plugin, pods 0-599", "placement_trace_device_plugin_rate4_nodes60_pods600_dra_reads.json"),
        ("DRA devices, pods 2000-2599", "placement_trace_dra_rate4_skip2000_nodes60_pods600_dra_reads.json"),
        ("device plugin, pods 2000-2599",
         "placement_trace_device_plugin_rate4_skip2000_nodes60_pods600_dra_reads.json")],
                     arms=("gpu-steward", "default"), gated_waits=True, gpus=True, cpu=True),
    *[Figure(RELEASE_CHURN, f"seed {seed}, {rate}: {what}", source, _release_churn(f"{rate} gpu-steward", key))
      for seed, source in ((1, "release_churn.json"), (2, "release_churn_seed2.json"))
      for rate in ("2/s", "3/s")
      for what, key in (("released pods bound on their planned node", "planned"),
                        ("stuck pods (released, Unschedulable)", "stuck"),
                        ("gangs part-running > 5 s", "gangs"))],
    *[Figure(RELEASE_CHURN_EARLY, f"seed {seed}, 2/s: {what}", source, _release_churn("2/s gpu-steward", key))
      for seed, source in ((1, "release_churn_early_rebuilds.json"), (2, "release_churn_early_rebuilds_seed2.json"))
      for what, key in (("released pods bound on their planned node", "planned"),
                        ("stuck pods (released, Unschedulable)", "stuck"),
                        ("gangs part-running > 5 s", "gangs"))],
    *[Figure(RELEASE_CHURN_UNBUILT, f"seed {seed}, {rate}: {what}", source, _release_churn(f"{rate} gpu-steward", key))
      for seed, source in ((1, "release_churn_unbuilt.json"), (2, "release_churn_unbuilt_seed2.json"))
      for rate in ("2/s", "3/s")
      for what, key in (("released pods bound on their planned node", "planned"),
                        ("stuck pods (released, Unschedulable)", "stuck"),
                        ("gangs part-running > 5 s", "gangs"))],
    *_placement_rows(PLACEMENT_PINS, _slices("release")),
    Figure(CHURN, "seed 1, ~90 % load (2/s): stuck pins", "pin_churn.json", _pin_churn("2/s gpu-steward")),
    Figure(CHURN, "seed 1, ~130 % load (3/s): stuck pins", "pin_churn.json", _pin_churn("3/s gpu-steward")),
    Figure(CHURN, "seed 2, ~90 % load (2/s): stuck pins", "pin_churn_seed2.json", _pin_churn("2/s gpu-steward")),
    Figure(CHURN, "seed 2, ~130 % load (3/s): stuck pins", "pin_churn_seed2.json", _pin_churn("3/s gpu-steward")),
    Figure(RECLAIM, "normal tier (chart default, 3 h peak): reclaimable idle GPU-hours reclaimed", "reclaim_trace.json",
           _policy("normal (chart default)", "reclaimed_share")),
    Figure(RECLAIM, "normal tier (chart default): evictions regretted", "reclaim_trace.json",
           _policy("normal (chart default)", "regretted_share")),
    Figure(RECLAIM, "normal tier (chart default): evictions on missing data", "reclaim_trace.json",
           _policy("normal (chart default)", "missing_data_evictions")),
    Figure(RECLAIM, "ReclaimIdleResource plugin's semantics, same window: evictions regretted", "reclaim_trace.json",
           _policy("plugin semantics, normal tier", "regretted_share")),
    Figure(RECLAIM, "ReclaimIdleResource plugin's semantics, same window: evictions on missing data",
           "reclaim_trace.json", _policy("plugin semantics, normal tier", "missing_data_evictions")),
    Figure(RECLAIM, "scavenger tier (chart default, 10 min): evictions regretted, all 99 pods", "reclaim_trace.json",
           _policy("scavenger (chart default)", "regretted_share")),
    Figure(RECLAIM, "scavenger tier (chart default, 10 min): evictions regretted, a 50-pod subset",
           "reclaim_trace_50pods.json", _policy("scavenger (chart default)", "regretted_share")),
    Figure(RECLAIM, "learned windows, whole day (5 phases): share of the clairvoyant regret-free reclaim",
           "reclaim_trace_learned.json", _learned("normal tier, learned window", "of_clairvoyant_range")),
    Figure(RECLAIM, "learned windows, whole day (5 phases): evictions regretted", "reclaim_trace_learned.json",
           _learned("normal tier, learned window", "regretted_share")),
    Figure(WEBHOOK, "decision in process, 1,000 nodes", "webhook_latency.json", _decide),
    Figure(WEBHOOK, "decision in process, 10,000 nodes", "webhook_latency_10k.json", _decide),
    Figure(WEBHOOK, "over TLS on one core, 1,000 nodes", "webhook_latency.json", _tls),
    Figure(WEBHOOK, "through the real API server: added to the median pod create by gpu-steward",
           "webhook_apiserver.json", _apiserver("B_vs_A")),
    Figure(WEBHOOK, "through the real API server: added to the median pod create by a no-op Python webhook",
           "webhook_apiserver.json", _apiserver("C_vs_A")),
    *[Figure(CYCLE, f"warm reclaim cycle CPU p50, {gpus:,} GPUs", "reclaim_cycle_prometheus.json", _cycle_cpu(gpus))
      for gpus in (1000, 5000, 10000)],
    Figure(CYCLE, "warm reclaim cycle, 10,000 GPUs, quiet machine", "reclaim_cycle_prometheus_quiet_10000.json",
           _quiet_cycle),
    Figure(CYCLE, "warm reclaim cycle, 10,000 GPUs, shared store (cluster matcher, 1 GPU in 10 scraped twice), "
           "loaded machine", "reclaim_cycle_prometheus_shared_10000.json", _quiet_cycle),
    Figure(CYCLE, "warm reclaim cycle, 10,000 GPUs, shared store (cluster matcher, 1 GPU in 10 scraped twice), "
           "quieter machine", "reclaim_cycle_prometheus_shared_10000_quiet.json", _quiet_cycle),
    Figure(CYCLE, "warm reclaim cycle, 10,000 GPUs, shared store (cluster matcher, 1 GPU in 10 scraped twice), "
           "quiet machine, after the warm cycle's caches", "reclaim_cycle_prometheus_shared_10000_quiet_dec06.json",
           _quiet_cycle),
    Figure(CYCLE, "re-checks right before the evictions (10 a cycle), 10,000 GPUs, shared store, quiet machine: "
           "share of the rest of the cycle", "reclaim_cycle_prometheus_shared_10000_quiet_dec06.json",
           lambda r: f"p50 {percent(r['recheck']['share_of_the_rest_of_the_cycle']['p50'])}, "
                     f"max {percent(r['recheck']['share_of_the_rest_of_the_cycle']['max'])}"),
]


def load_average(result: Result) -> str:
    """The 1-minute load average the run recorded before (and after) it, or that it recorded none."""
    recorded = result.get("load_average") or result.get("machine", {}).get("load_average")
    if not recorded:
        return "not recorded"
    if isinstance(recorded, Mapping):
        return f"{recorded['before'][0]:g} / {recorded['after'][0]:g}"
    return f"{recorded[0]:g}"


def render(results: pathlib.Path = RESULTS) -> str:
    loaded: dict[str, Result] = {}
    lines = [
        "# Benchmark figures",
        "",
        "<!-- Generated by `python benchmarks/figures.py` from benchmarks/results/*.json: do not edit by hand. -->",
        "",
        "Every figure the README and the docs quote, read from the result file its run wrote. Load average: the",
        "machine's 1-minute load before / after the run, as the run recorded it. Commands, machine notes and what each",
        "figure means: [benchmarks/RESULTS.md](../benchmarks/RESULTS.md).",
    ]
    section = ("", "")
    for figure in FIGURES:
        if figure.section != section:
            section = figure.section
            lines += ["", f"## {section[0]}", "", section[1], "", "| figure | value | result file | load average |",
                      "|---|---|---|---|"]
        if figure.source not in loaded:
            loaded[figure.source] = json.loads((results / figure.source).read_text())
        result = loaded[figure.source]
        lines.append(f"| {figure.what} | {figure.value(result)} | [{figure.source}](../benchmarks/results/"
                     f"{figure.source}) | {load_average(result)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/figures.md is stale; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"stale: {OUT}; run python benchmarks/figures.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
