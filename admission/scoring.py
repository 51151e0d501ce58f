"""Ranks nodes for the webhook's preferred terms by the NVLink-aware score (`common.nvlink_score`,
docs/scoring.md), among the nodes the pod may use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common import capacity, fit, nvlink_score, settings, snapshot

NodeScore = nvlink_score.NodeScore
Term = nvlink_score.Term
bounds = nvlink_score.bounds
normalize = nvlink_score.normalize


@dataclasses.dataclass(frozen=True)
class Ranking:
    scores: tuple[NodeScore, ...]  # best first; ties by node name
    excluded: Mapping[str, str]  # node -> why it cannot take the pod


def score_node(gpus: int, node: snapshot.Node, cfg: settings.Scoring) -> NodeScore | None:
    """The node's score for a pod of `gpus` whole GPUs, or None when its free GPUs cannot hold it."""
    return nvlink_score.score(gpus, name=node.name, free=node.free_by_domain(), free_gpus=node.free_gpus,
                              gpu_count=node.gpu_count, topo=node.topology, cfg=cfg, first_fit=node.device_order)


def _templates(
    gpus: int, cluster: snapshot.Snapshot, cfg: settings.Scoring
) -> tuple[list[tuple[NodeScore, tuple[snapshot.Node, ...]]], list[tuple[snapshot.Node, ...]]]:
    """One score per GPU state, best first, plus the groups too full for the pod; memoised per
    snapshot so that consecutive requests for the same pod size only walk the nodes."""
    key = ("scoring.templates", gpus, cfg)
    if key not in cluster.memo:
        templates, full = [], []
        for group in cluster.nodes_by_gpu_state.values():
            template = score_node(gpus, group[0], cfg)
            if template is None:
                full.append(group)
            else:
                templates.append((template, group))
        # Equal scores: the fullest node first (best fit keeps whole nodes free for large pods), then by name.
        templates.sort(key=lambda item: (-item[0].score, item[1][0].free_gpus, item[1][0].name))
        cluster.memo[key] = (templates, full)
    result: tuple[list[tuple[NodeScore, tuple[snapshot.Node, ...]]], list[tuple[snapshot.Node, ...]]]
    result = cluster.memo[key]
    return result


# Distinct pod shapes whose ranking one snapshot keeps; past this, rankings are computed and not kept
# (a snapshot of a quiet cluster may serve for hours, and pod specs are the users' to vary).
MAX_MEMOISED_RANKINGS = 1024


def rank(
    *, gpus: int, pod_spec: Mapping[str, Any], cluster: snapshot.Snapshot, cfg: settings.Scoring,
    limit: int | None = None, requests: Mapping[str, int] | None = None,
) -> Ranking:
    """Nodes that can take the pod, best first (ties: fewest free GPUs, then name). Each GPU state is scored once; with
    `limit`, only that many nodes are looked at past the scoring (the webhook's hot path) and
    `excluded` lists only the nodes passed over on the way. Pods alike in GPUs, tolerations,
    nodeSelector, required node affinity and requests (a Job's or a gang's pods) rank alike: the result is
    kept for the snapshot's life. `requests`: the pod's request vector (`resources.pod_requests`); a node short
    of CPU, memory, a pod slot or another resource for it is excluded, as the capacity model says."""
    fit_key = fit.key(pod_spec)
    asks = tuple(sorted((requests or {}).items()))
    key = ("scoring.rank", gpus, cfg, limit, fit_key, asks)
    kept: Ranking | None = cluster.memo.get(key) if fit_key is not None else None
    if kept is not None:
        return kept
    ranking = _rank(gpus=gpus, pod_spec=pod_spec, cluster=cluster, cfg=cfg, limit=limit, requests=requests or {})
    if fit_key is not None:
        counted = ("scoring.rankings",)
        if cluster.memo.get(counted, 0) < MAX_MEMOISED_RANKINGS:
            cluster.memo[counted] = cluster.memo.get(counted, 0) + 1
            cluster.memo[key] = ranking
    return ranking


def _rank(
    *, gpus: int, pod_spec: Mapping[str, Any], cluster: snapshot.Snapshot, cfg: settings.Scoring, limit: int | None,
    requests: Mapping[str, int],
) -> Ranking:
    templates, full = _templates(gpus, cluster, cfg)
    excluded: dict[str, str] = {}
    if limit is None:
        excluded = {n.name: f"{n.free_gpus} free GPUs, pod needs {gpus}" for group in full for n in group}
    scores: list[NodeScore] = []
    for template, group in templates:
        for node in group:
            if limit is not None and len(scores) >= limit:
                return Ranking(tuple(scores), excluded)
            reason = fit.why_not(pod_spec, node) or capacity.short_of(node, requests)
            if reason is not None:
                excluded[node.name] = reason
                continue
            scores.append(NodeScore(node.name, template.score, template.normalized, template.spanned, template.terms))
    return Ranking(tuple(scores), excluded)
