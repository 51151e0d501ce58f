"""`gpu-steward explain POD.yaml --cluster STATE.json`: both halves of placement for one pod, offline: what
admission adds (patch, decision record, node scores), and where release would place it now and why no other
node would take it."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import jsonpatch
import yaml

from admission import mutation, scoring
from common import gpu, resources, settings, snapshot, snapshot_build, source
from descheduler.release import layout
from gpu_steward import cmdline

Release = list[tuple[str, bool, str]]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = cmdline.command(sub, "explain", run=run,
                             help="show the patch, decision record and node scores the webhook would produce for a pod",
                             description="Replay the admission decision for POD.yaml against a saved cluster state\n"
                                         "(kubectl get nodes,pods,priorityclasses,namespaces -A -o json > STATE.json).")
    parser.add_argument("pod", help="pod manifest (YAML or JSON); - reads it from stdin")
    parser.add_argument("--cluster", type=pathlib.Path, required=True, help="cluster state: a Kubernetes List")
    parser.add_argument("--controller", choices=("alive", "down"), default="alive",
                        help="the descheduler as the webhook would see it: alive (its Lease just renewed: governed "
                        "pods are gated for placement at release) or down (never gated; preferred terms only)")
    cmdline.add_config(parser)
    cmdline.add_output(parser)


def run(args: argparse.Namespace) -> int:
    config = cmdline.load_settings(args)
    try:
        pod = read_pod(args.pod)
        cluster = source.from_file(args.cluster, names=config.names, clock=time.time,
                                       gpu_classes=config.dra.gpu_device_classes).snapshot
    except ValueError as exc:
        print(f"explain: {exc}", file=sys.stderr)
        return 2
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    now = time.time()
    outcome = mutation.decide(operation="CREATE", namespace=namespace, pod=pod, cluster=cluster,
                              config=config, now=now, controller_seen_at=now if args.controller == "alive" else None)
    # The webhook scores only as far as its preferred terms need; explain shows every node.
    try:
        request, requests, _ = snapshot.gpu_requests(pod, cluster.dra, names=config.names)  # DRA claims' GPUs counted
        gpus = request.full
    except (gpu.QuantityError, resources.QuantityError):
        gpus, requests = 0, {}
    # Ranked against the pod as admitted, as the webhook ranks it.
    admitted = jsonpatch.apply_patch(pod, outcome.patch) if outcome.patch else pod
    ranking = scoring.rank(gpus=gpus, pod_spec=admitted.get("spec") or {}, cluster=cluster, cfg=config.scoring,
                           requests=requests)
    release = _release(admitted, cluster, config=config) if outcome.gated and gpus else None
    if args.output == "json":
        print(json.dumps(as_json(outcome, ranking if gpus else None, release), indent=2))
    else:
        print(as_text(outcome, ranking if gpus else None, release))
    return 0


def _release(admitted: dict[str, Any], cluster: snapshot.Snapshot, *, config: settings.Settings) -> Release:
    """Where the release controller would place the admitted pod now (a gang of one; a gang's members are
    placed together, see `gpu-steward gangs`)."""
    meta = admitted.setdefault("metadata", {})
    meta.setdefault("name", meta.get("generateName", "pod") + "(new)")
    pod = snapshot_build.build(nodes=[], pods=[admitted], names=config.names, taken_at=None,
                               inventory=cluster.dra).pods.get(f"{meta.get('namespace') or 'default'}/{meta['name']}")
    return layout.explain(pod, cluster, scoring=config.scoring) if pod is not None else []


def read_pod(name: str) -> dict[str, Any]:
    """The one Pod manifest in file `name` (`-`: stdin); InputError saying where and what was expected."""
    where = "<stdin>" if name == "-" else name
    text = source.read_text(name, expected="a Pod manifest (YAML or JSON)")
    try:
        pod = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = ", ".join(part for part in (exc.context, exc.problem) if part)
        raise source.InputError(f"{where}: {at}{problem}; expected one Pod manifest (YAML or JSON)") from None
    except yaml.YAMLError as exc:
        raise source.InputError(f"{where}: {exc}; expected one Pod manifest (YAML or JSON)") from None
    if not isinstance(pod, dict):
        found = "empty" if pod is None else f"a {type(pod).__name__}, not a mapping"
        raise source.InputError(f"{where}: {found}; expected a Pod manifest (apiVersion: v1, kind: Pod)")
    if pod.get("kind", "Pod") != "Pod":
        raise source.InputError(f"{where}: kind is {pod.get('kind')!r}; expected a single Pod (kind: Pod)")
    return pod


def as_json(outcome: mutation.Outcome, ranking: scoring.Ranking | None,
            release: Release | None = None) -> dict[str, Any]:
    return {
        "patch": outcome.patch,
        "tier": outcome.tier,
        "scores": [{"node": s.node, "score": s.score, "normalized": s.normalized,
                    "terms": {t.name: t.points for t in s.terms}} for s in (ranking.scores if ranking else ())],
        "excluded": dict(ranking.excluded) if ranking else {},
        "gated": outcome.gated,
        "release": outcome.release.value if outcome.release else None,
        "release_placement": [{"node": n, "fits": ok, "why": why} for n, ok, why in release or ()],
        "record": outcome.record,
        "warnings": list(outcome.warnings),
        "skipped": outcome.skipped,
    }


def as_text(outcome: mutation.Outcome, ranking: scoring.Ranking | None, release: Release | None = None, *,
            top: int = 10) -> str:
    lines = [f"decision: {outcome.record}"]
    if outcome.release is not None:
        lines.append(f"release:  {'gated, placed at release' if outcome.gated else 'not gated, controller down'}")
    lines += [f"warning:  {w}" for w in outcome.warnings]
    if ranking and ranking.scores:
        lines.append("")
        lines.append(f"{'node':<32} {'score':>7} {'weight':>6}  terms")
        lines += [f"{s.node:<32} {s.score:>7g} {s.normalized:>6}  {s.explain()}" for s in ranking.scores[:top]]
        if len(ranking.scores) > top:
            lines.append(f"... {len(ranking.scores) - top} more nodes")
    if ranking and ranking.excluded:
        lines.append(f"{len(ranking.excluded)} nodes cannot take the pod, e.g. "
                     + "; ".join(f"{n}: {why}" for n, why in list(ranking.excluded.items())[:3]))
    if release is not None:
        lines.append("")
        fits = [r for r in release if r[1]]
        lines.append(f"at release now: {fits[0][0]} ({fits[0][2]})" if fits else
                     "at release now: no node can take it; it waits (at most descheduler.gangs.max_wait_seconds)")
        lines += [f"  then {n}: {why}" for n, _, why in fits[1:top]]
        lines += [f"  not {n}: {why}" for n, ok, why in release if not ok][:top]
    lines.append("")
    lines.append("patch:" if outcome.patch else "patch: (none)")
    lines += [f"  {json.dumps(op)}" for op in outcome.patch]
    return "\n".join(lines)
