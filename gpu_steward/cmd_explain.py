"""`gpu-steward explain POD.yaml --cluster STATE.json`: the webhook's decision for one pod, offline."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import yaml

from admission import mutation
from common import settings, source


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "explain",
        help="show the patch, decision record and node scores the webhook would produce for a pod",
        description="Replay the admission decision for POD.yaml against a saved cluster state "
        "(kubectl get nodes,pods,priorityclasses,namespaces -A -o json > STATE.json).",
    )
    parser.add_argument("pod", type=pathlib.Path, help="pod manifest (YAML or JSON)")
    parser.add_argument("--cluster", type=pathlib.Path, required=True, help="cluster state: a Kubernetes List")
    parser.add_argument("--config", type=pathlib.Path, help="settings file (as rendered by the Helm chart)")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = settings.load(config_file=args.config)
    except settings.SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        pod = yaml.safe_load(args.pod.read_text())
        cluster = source.from_file(args.cluster, names=config.names, taken_at=time.time()).snapshot
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"explain: {exc}", file=sys.stderr)
        return 2
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        print(f"explain: {args.pod} is not a Pod manifest", file=sys.stderr)
        return 2
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    outcome = mutation.decide(operation="CREATE", namespace=namespace, pod=pod, cluster=cluster,
                              config=config, now=time.time())
    if args.output == "json":
        print(json.dumps(as_json(outcome), indent=2))
    else:
        print(as_text(outcome))
    return 0


def as_json(outcome: mutation.Outcome) -> dict[str, Any]:
    return {
        "patch": outcome.patch,
        "tier": outcome.tier,
        "scores": [{"node": s.node, "score": s.score, "normalized": s.normalized} for s in outcome.scores],
        "gated": outcome.gated,
        "record": outcome.record,
        "warnings": list(outcome.warnings),
        "skipped": outcome.skipped,
    }


def as_text(outcome: mutation.Outcome, *, top: int = 10) -> str:
    lines = [f"decision: {outcome.record}"]
    lines += [f"warning:  {w}" for w in outcome.warnings]
    if outcome.scores:
        lines.append("")
        lines.append(f"{'node':<32} {'score':>7} {'weight':>6}")
        lines += [f"{s.node:<32} {s.score:>7g} {s.normalized:>6}" for s in outcome.scores[:top]]
        if len(outcome.scores) > top:
            lines.append(f"... {len(outcome.scores) - top} more nodes")
    lines.append("")
    lines.append("patch:" if outcome.patch else "patch: (none)")
    lines += [f"  {json.dumps(op)}" for op in outcome.patch]
    return "\n".join(lines)
