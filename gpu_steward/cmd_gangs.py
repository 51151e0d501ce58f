"""`gpu-steward gangs [--cluster STATE.json]`: every gang (and every single pod gated for placement at release,
a gang of one), its members, its state, and what it waits for.

Offline from a saved state (`kubectl get nodes,pods,priorityclasses,namespaces -A -o json`), or live
(one full list through the feeder, no watch kept). Read-only: it shows the gang controller's plan
for this moment and every released pod whose release did not go as planned (`outcomes`: bound elsewhere than
nominated, not bound within `descheduler.gangs.bind_bound_seconds`, a gang spread or part-bound); it changes
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from common import feeder, kube, settings, snapshot, source
from descheduler.release import outcomes, planning
from gpu_steward import cmdline


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = cmdline.command(sub, "gangs", run=run, parents=[cmdline.cluster_parent()],
                             help="list gangs, their members and state, what a waiting gang waits for, and releases "
                                  "that went otherwise",
                             description="Show the gang controller's view: each gang, its members, its state and why.")
    parser.add_argument("--cluster", type=pathlib.Path, help="cluster state (a Kubernetes List); default: live")


def run(args: argparse.Namespace) -> int:
    config = cmdline.load_settings(args)
    now = time.time()
    try:
        if args.cluster is not None:
            cluster = source.from_file(args.cluster, names=config.names, clock=lambda: now,
                                       gpu_classes=config.dra.gpu_device_classes).snapshot
        else:
            cluster = asyncio.run(_live(config))
    except (OSError, ValueError, kube.ApiError, TimeoutError) as exc:
        print(f"gangs: {exc}", file=sys.stderr)
        return 2
    result = planning.plan(cluster, config=config, now=now)
    found = outcomes.assess(cluster, config=config, now=now)
    if args.namespace:  # planned on the whole cluster (capacity is shared), shown for one namespace
        mine = f"{args.namespace}/"
        result = dataclasses.replace(result, decisions=tuple(d for d in result.decisions if d.gang.startswith(mine)))
        found = tuple(o for o in found if o.key.startswith(mine))
    print(json.dumps(as_json(result, found), indent=2) if args.output == "json" else as_text(result, found))
    return 0


async def _live(config: settings.Settings) -> snapshot.Snapshot:
    """One synced snapshot from the API server (the feeder's list, without staying to watch)."""
    api = await kube.api_client(config.kubernetes)
    try:
        live = feeder.Feeder(config=config, api=api, prometheus=None)
        published = live.subscribe()
        async with asyncio.timeout(config.kubernetes.request_timeout_seconds * 3):
            async with asyncio.TaskGroup() as tg:
                feeding = tg.create_task(live.run(), name="feeder")
                while not live.synced:
                    await published.wait()
                    published.clear()
                feeding.cancel()
        return live.snapshot
    finally:
        await api.close()


def as_json(result: planning.ReleasePlan, found: Sequence[outcomes.Outcome] = ()) -> dict[str, Any]:
    return {
        "gangs": [
            {
                "gang": d.gang,
                "kind": "pod" if d.single else "gang",  # a pod gated for placement at release: a gang of one
                "state": d.action.value,
                "waiting_for": d.waiting.value if d.waiting else None,
                "size": d.size,
                "priority": d.priority,
                "created": d.created,
                "why": d.message,
                "event": {"type": d.event_type, "reason": d.event_reason} if d.event_reason else None,
                "members": [
                    {"pod": m.key, "gpus": m.request.describe(), "gated": m.gated, "node": m.node}
                    for m in d.members
                ],
            }
            for d in result.decisions
        ],
        "demand": [{"gang": d.gang, "nodes": list(d.nodes), "missing_gpus": d.missing_gpus} for d in result.shortages],
        "outcomes": [{"pod": o.key, "gang": o.gang, "cause": o.cause.value, "event": o.event[1], "why": o.message}
                     for o in found],
    }


def as_text(result: planning.ReleasePlan, found: Sequence[outcomes.Outcome] = ()) -> str:
    lines = [f"released {o.key}  {o.cause.value}\n  why: {o.message}" for o in found]
    if not result.decisions:
        return "\n".join([*lines, "no gangs"])
    for d in result.decisions:
        size = f"{len(d.members)}/{d.size}" if d.size else f"{len(d.members)}"
        state = f"{d.action.value}" + (f" ({d.waiting.value})" if d.waiting else "")
        kind = "pod (placed at release)" if d.single else "gang"
        lines.append(f"{kind} {d.gang}  members {size}  priority {d.priority}  {state}")
        lines.append(f"  why: {d.message}")
        lines += [
            f"  - {m.key}  {m.request.describe()}  {'gated' if m.gated else 'released'}"
            + (f"  node {m.node}" if m.node else "")
            for m in d.members
        ]
    return "\n".join(lines)
