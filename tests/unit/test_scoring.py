"""The NVLink-aware score, term by term, including the product brief's worked examples."""

from __future__ import annotations

from typing import Any

import pytest

from admission import scoring
from common import fit, settings, snapshot, snapshot_build
from tests import builders

CFG = settings.Scoring()
NAMES = settings.Names()


def cluster(*nodes: dict, pods: tuple[dict, ...] = ()) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, names=NAMES, taken_at=0.0)


def busy(node: str, gpus: int, name: str = "busy") -> dict:
    return builders.pod(f"{name}-{node}", gpus=gpus, node=node, phase="Running")


@pytest.mark.parametrize(
    ("gpus", "nodes", "pods", "expected_score", "expected_terms"),
    [
        pytest.param(
            1, [builders.gpu_node("n", gpus=2)], [busy("n", 1)], 250,
            {"base": 50, "one-domain": 50, "completes-domain": 40, "small-node": 80, "utilisation": 30},
            id="brief-example-1gpu-on-half-used-2gpu-node",
        ),
        pytest.param(
            1, [builders.gpu_node("n", gpus=8, domains=[range(4), range(4, 8)])], [], 40,
            {"base": 50, "one-domain": 50, "oversized-node": -40, "utilisation": -20},
            id="brief-example-1gpu-on-empty-8gpu-node",
        ),
        pytest.param(
            4, [builders.gpu_node("n", gpus=8, domains=[range(4), range(4, 8)])], [], 130,
            {"base": 50, "one-domain": 50, "exact-domain": 30},
            id="4gpu-takes-whole-empty-domain",
        ),
        pytest.param(
            8, [builders.gpu_node("n", gpus=8, domains=[range(4), range(4, 8)])], [], 160,
            {"base": 50, "spans-domains": -20, "large-node": 100, "utilisation": 30},
            id="8gpu-spans-two-domains-fills-large-node",
        ),
        pytest.param(
            5, [builders.gpu_node("n", gpus=8)], [], 180,
            {"base": 50, "one-domain": 50, "large-node": 80},
            id="5gpu-smallest-large-pod-on-single-domain-8gpu-node",
        ),
        pytest.param(
            2, [builders.gpu_node("n", gpus=4, domains=[[0, 1], [2, 3]])], [], 190,
            {"base": 50, "one-domain": 50, "exact-domain": 30, "small-node": 60},
            id="2gpu-on-4gpu-node-takes-a-pair",
        ),
        pytest.param(
            1, [builders.gpu_node("n", gpus=2, topology="none")], [], 130,
            {"base": 50, "small-node": 80},
            id="unknown-topology-no-domain-terms",
        ),
        pytest.param(
            3, [builders.gpu_node("n", gpus=8, domains=[range(4), range(4, 8)])], [busy("n", 2)], 100,
            {"base": 50, "one-domain": 50},
            id="medium-pod-no-match-term-mid-utilisation",
        ),
    ],
)
def test_score_terms(gpus, nodes, pods, expected_score, expected_terms):
    snap = cluster(*nodes, pods=tuple(pods))
    result = scoring.score_node(gpus, snap.nodes["n"], CFG)
    assert result is not None
    assert result.score == pytest.approx(expected_score)
    assert {t.name: t.points for t in result.terms} == pytest.approx(expected_terms)


def test_worked_examples_normalise_in_order():
    example1 = scoring.normalize(250, CFG)
    example2 = scoring.normalize(40, CFG)
    assert (example1, example2) == (95, 40)
    lowest, highest = scoring.bounds(CFG)
    assert (lowest, highest) == (-110, 270)
    assert scoring.normalize(lowest - 100, CFG) == 1
    assert scoring.normalize(highest + 100, CFG) == 100


@pytest.mark.parametrize(
    ("score_a", "score_b"),
    [pytest.param(a, b, id=f"{a}>{b}") for a, b in [(250, 40), (41, 40), (0, -50), (270, 269)]],
)
def test_normalisation_is_monotonic(score_a, score_b):
    assert scoring.normalize(score_a, CFG) >= scoring.normalize(score_b, CFG)


def test_every_constant_is_a_setting():
    custom = settings.Scoring(base=0, fits_one_domain=0, domain_completion=0, small_on_small_max=0,
                              high_utilisation_min=0, high_utilisation_max=0)
    snap = cluster(builders.gpu_node("n", gpus=2), pods=(busy("n", 1),))
    result = scoring.score_node(1, snap.nodes["n"], custom)
    assert result is not None and result.score == 0


def test_rank_orders_best_first_and_explains_exclusions():
    snap = cluster(
        builders.gpu_node("big", gpus=8, domains=[range(4), range(4, 8)]),
        builders.gpu_node("small", gpus=2),
        builders.gpu_node("full", gpus=2),
        builders.gpu_node("cordoned", gpus=2, mutate=lambda n: n["spec"].update(unschedulable=True)),
        builders.gpu_node("tainted", gpus=2, mutate=lambda n: n["spec"].update(
            taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])),
        pods=(busy("small", 1), busy("full", 2)),
    )
    ranking = scoring.rank(gpus=1, pod_spec={}, cluster=snap, cfg=CFG)
    assert [s.node for s in ranking.scores] == ["small", "big"]
    assert ranking.excluded == {
        "full": "0 free GPUs, pod needs 1",
        "cordoned": "node not ready or cordoned",
        "tainted": "taint dedicated=infer:NoSchedule not tolerated",
    }


def test_rank_ties_broken_by_name_and_same_shape_scored_alike():
    nodes = [builders.gpu_node(f"n{i}", gpus=8, domains=[range(4), range(4, 8)]) for i in (3, 1, 2)]
    ranking = scoring.rank(gpus=4, pod_spec={}, cluster=cluster(*nodes), cfg=CFG)
    assert [s.node for s in ranking.scores] == ["n1", "n2", "n3"]
    assert len({s.score for s in ranking.scores}) == 1


def test_pod_that_no_domain_holds_prefers_fewest_domains():
    snap = cluster(
        builders.gpu_node("pairs", gpus=8, domains=[[0, 1], [2, 3], [4, 5], [6, 7]]),
        builders.gpu_node("quads", gpus=8, domains=[range(4), range(4, 8)]),
    )
    ranking = scoring.rank(gpus=8, pod_spec={}, cluster=snap, cfg=CFG)
    assert [(s.node, s.spanned) for s in ranking.scores] == [("quads", 2), ("pairs", 4)]


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_rank_with_a_limit_returns_the_same_best_nodes(limit):
    nodes = [builders.gpu_node(f"n{i}", gpus=2) for i in range(3)]
    nodes.append(builders.gpu_node("big", gpus=8, domains=[range(4), range(4, 8)]))
    snap = cluster(*nodes, pods=(busy("n2", 1),))
    full = scoring.rank(gpus=1, pod_spec={}, cluster=snap, cfg=CFG)
    limited = scoring.rank(gpus=1, pod_spec={}, cluster=snap, cfg=CFG, limit=limit)
    assert limited.scores == full.scores[:limit]
    assert [s.node for s in full.scores] == ["n2", "n0", "n1", "big"]


def test_equal_scores_go_to_the_fullest_node_first_to_keep_whole_nodes_free():
    snap = cluster(
        builders.gpu_node("a-empty", gpus=8, domains=[range(4), range(4, 8)]),
        builders.gpu_node("b-one-used", gpus=8, domains=[range(4), range(4, 8)]),
        pods=(busy("b-one-used", 1),),
    )
    ranking = scoring.rank(gpus=1, pod_spec={}, cluster=snap, cfg=CFG)
    assert [(s.node, s.score) for s in ranking.scores] == [("b-one-used", 40), ("a-empty", 40)]


TAINTED = [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]
TOLERATES = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}


def requires(key: str, *values: str) -> dict:
    """A pod spec fragment: required node affinity `key In values`."""
    term = {"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}}


def _fit_cluster() -> snapshot.Snapshot:
    return cluster(
        builders.gpu_node("plain", gpus=2, labels={"pool": "a"}),
        builders.gpu_node("tainted", gpus=2, labels={"pool": "b"}, mutate=lambda n: n["spec"].update(taints=TAINTED)),
    )


@pytest.mark.parametrize(
    ("spec_a", "spec_b", "nodes_b"),
    [
        pytest.param({}, {"containers": [{"name": "other"}]}, ["plain"], id="same-constraints-other-fields"),
        pytest.param({}, TOLERATES, ["plain", "tainted"], id="tolerations-differ"),
        pytest.param(TOLERATES, {**TOLERATES, "nodeSelector": {"pool": "b"}}, ["tainted"], id="node-selector-differs"),
        pytest.param({"nodeSelector": {"pool": "a"}}, {"nodeSelector": {"pool": "b"}}, [], id="selector-value-differs"),
        pytest.param({**TOLERATES, **requires("pool", "a")}, {**TOLERATES, **requires("pool", "b")}, ["tainted"],
                     id="required-affinity-differs"),
        pytest.param(TOLERATES, {**TOLERATES, **requires("pool", "b")}, ["tainted"], id="required-affinity-added"),
        pytest.param({**TOLERATES, **requires("pool", "a", "b")}, {**TOLERATES, **requires("pool", "b", "a")},
                     ["plain", "tainted"], id="required-affinity-value-order-differs"),
        pytest.param({**TOLERATES, **requires("pool", "b")},
                     {**TOLERATES, **requires("pool", "b"), "affinity": {**requires("pool", "b")["affinity"],
                                                                        "podAffinity": {}}},
                     ["tainted"], id="same-required-affinity-other-affinity-fields"),
    ],
)
def test_pods_alike_share_a_ranking_and_differing_ones_do_not(spec_a, spec_b, nodes_b):
    """A snapshot keeps each pod shape's ranking: same GPUs, tolerations, nodeSelector and required node
    affinity reuse it; any difference in what the fit check reads ranks again."""
    snap = _fit_cluster()
    first = scoring.rank(gpus=1, pod_spec=spec_a, cluster=snap, cfg=CFG, limit=3)
    second = scoring.rank(gpus=1, pod_spec=spec_b, cluster=snap, cfg=CFG, limit=3)
    assert [s.node for s in second.scores] == nodes_b
    same_shape = fit.key(spec_a) == fit.key(spec_b)
    assert (second is first) == same_shape
    assert scoring.rank(gpus=1, pod_spec=spec_b, cluster=snap, cfg=CFG, limit=3) is second


def test_pods_differing_only_in_required_affinity_get_their_own_ranking():
    snap = _fit_cluster()
    on_a = scoring.rank(gpus=1, pod_spec={**TOLERATES, **requires("pool", "a")}, cluster=snap, cfg=CFG, limit=3)
    on_b = scoring.rank(gpus=1, pod_spec={**TOLERATES, **requires("pool", "b")}, cluster=snap, cfg=CFG, limit=3)
    assert [s.node for s in on_a.scores] == ["plain"]
    assert on_a.excluded == {"tainted": "required node affinity does not match (term 1: pool In [a])"}
    assert [s.node for s in on_b.scores] == ["tainted"]
    assert on_b.excluded == {"plain": "required node affinity does not match (term 1: pool In [b])"}


def _required(*terms: Any) -> dict:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


@pytest.mark.parametrize(
    ("spec_a", "spec_b", "same"),
    [
        pytest.param({}, {"affinity": {"nodeAffinity": {}}}, True, id="none-required"),
        pytest.param(_required({"matchExpressions": [{"key": "pool", "operator": "Exists"}]}),
                     _required({"matchExpressions": [{"key": "pool", "operator": "Exists", "values": []}]}), True,
                     id="missing-values-read-as-empty"),
        pytest.param(_required({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}),
                     _required({"matchExpressions": [{"key": "pool", "operator": "In", "values": "ab"}]}), False,
                     id="values-list-vs-string"),
        pytest.param(_required({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}),
                     _required({"matchExpressions": [["pool", "In", ["a"]]]}), False, id="requirement-dict-vs-list"),
        pytest.param(_required({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}),
                     _required({"matchFields": [{"key": "pool", "operator": "In", "values": ["a"]}]}), False,
                     id="expressions-vs-fields"),
        pytest.param(_required({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}),
                     _required({}, {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}), False,
                     id="extra-empty-term"),
        pytest.param(_required(), {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": {"matchExpressions": []}}}}}, False, id="terms-list-vs-dict"),
        pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}}},
                     {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}, False,
                     id="null-vs-empty-required"),
    ],
)
def test_fit_key_tells_apart_what_fit_may_tell_apart(spec_a: dict, spec_b: dict, same: bool) -> None:
    key_a, key_b = fit.key(spec_a), fit.key(spec_b)
    assert key_a is not None and key_b is not None
    assert (key_a == key_b) is same


def test_a_spec_the_key_cannot_hold_is_ranked_every_time():
    snap = _fit_cluster()
    odd = {"nodeSelector": {"pool": ["a"]}}  # invalid for the API server; must not break or pollute the memo
    first = scoring.rank(gpus=1, pod_spec=odd, cluster=snap, cfg=CFG)
    assert scoring.rank(gpus=1, pod_spec=odd, cluster=snap, cfg=CFG) is not first
    assert [s.node for s in first.scores] == []


def test_kept_rankings_are_bounded_per_snapshot(monkeypatch):
    monkeypatch.setattr(scoring, "MAX_MEMOISED_RANKINGS", 2)
    snap = _fit_cluster()
    specs = [{"nodeSelector": {"pool": "a", "n": str(i)}} for i in range(3)]
    for spec in specs:
        scoring.rank(gpus=1, pod_spec=spec, cluster=snap, cfg=CFG)
    kept = [scoring.rank(gpus=1, pod_spec=spec, cluster=snap, cfg=CFG) for spec in specs]
    again = [scoring.rank(gpus=1, pod_spec=spec, cluster=snap, cfg=CFG) for spec in specs]
    assert [a is b for a, b in zip(kept, again, strict=True)] == [True, True, False]


def test_rank_leaves_out_nodes_short_of_cpu_memory_or_pod_slots_for_the_pod() -> None:
    """The capacity model, not GPUs alone: a node whose CPUs are taken by a non-GPU pod gets no preferred term."""
    def cpu_pod(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "60"}}

    snap = cluster(builders.gpu_node("crowded", gpus=8), builders.gpu_node("roomy", gpus=8),
                   pods=(builders.pod("web", node="crowded", phase="Running", mutate=cpu_pod),))
    ranking = scoring.rank(gpus=1, pod_spec={}, cluster=snap, cfg=CFG, requests={"cpu": 8000, "nvidia.com/gpu": 1})
    assert [s.node for s in ranking.scores] == ["roomy"]
    assert ranking.excluded == {"crowded": "Insufficient cpu"}
    small = scoring.rank(gpus=1, pod_spec={}, cluster=snap, cfg=CFG, requests={"cpu": 2000, "nvidia.com/gpu": 1})
    assert sorted(s.node for s in small.scores) == ["crowded", "roomy"], "ranked apart: their requests differ"
