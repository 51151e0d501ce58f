"""common.topology: a node's NVLink domains from the annotation, else the labels, else only a GPU count."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common import settings, topology
from tests import builders

NAMES = settings.Names()
ANNOTATION = NAMES.nvlink_topology
DOMAINS = NAMES.nvlink_domains
SIZE = NAMES.nvlink_domain_size
Source = topology.Source


def _node(
    *,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
    annotation: Any = None,
    drop_labels: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A node with exactly the topology labels/annotation given (no builder defaults for them)."""

    def mutate(node: dict[str, Any]) -> None:
        meta = node["metadata"]
        for key in drop_labels:
            meta["labels"].pop(key, None)
        meta["labels"].update(labels or {})
        if annotation is not None:
            meta["annotations"][ANNOTATION] = annotation if isinstance(annotation, str) else json.dumps(annotation)

    return builders.gpu_node("n", gpus=gpus, topology="none", mutate=mutate)


@pytest.mark.parametrize(
    ("node", "count", "domains", "source", "problems"),
    [
        pytest.param(_node(annotation=[[0, 1, 2, 3], [4, 5, 6, 7]]), 8, ((0, 1, 2, 3), (4, 5, 6, 7)),
                     Source.ANNOTATION, (), id="annotation-list"),
        pytest.param(_node(annotation={"domains": [[4, 5, 6, 7], [0, 1, 2, 3]]}), 8,
                     ((4, 5, 6, 7), (0, 1, 2, 3)), Source.ANNOTATION, (), id="annotation-domains-object"),
        pytest.param(_node(annotation=[[3, 1], [2, 0]]), 4, ((1, 3), (0, 2)), Source.ANNOTATION, (),
                     id="annotation-indices-sorted-within-domain"),
        pytest.param(_node(gpus=4, annotation=[[0], [1], [2], [3]]), 4, ((0,), (1,), (2,), (3,)),
                     Source.ANNOTATION, (), id="annotation-t4-every-gpu-alone"),
        pytest.param(_node(annotation=[[0, 1, 2, 3]], labels={DOMAINS: "2", SIZE: "4"}), 4, ((0, 1, 2, 3),),
                     Source.ANNOTATION, (), id="annotation-beats-labels"),
        pytest.param(_node(labels={DOMAINS: "2", SIZE: "4"}), 8, ((0, 1, 2, 3), (4, 5, 6, 7)), Source.LABELS, (),
                     id="labels"),
        pytest.param(_node(gpus=4, labels={DOMAINS: "4", SIZE: "1"}), 4, ((0,), (1,), (2,), (3,)),
                     Source.LABELS, (), id="labels-singletons"),
        pytest.param(_node(), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT, (), id="gpu-count-label"),
        pytest.param(_node(gpus=8, labels={"nvidia.com/gpu.count": "4"}), 4, ((0, 1, 2, 3),), Source.GPU_COUNT,
                     (), id="gpu-count-label-beats-allocatable"),
        pytest.param(_node(gpus=2, drop_labels=("nvidia.com/gpu.count",)), 2, ((0, 1),), Source.GPU_COUNT, (),
                     id="allocatable-fallback"),
        pytest.param(_node(gpus=2, labels={"nvidia.com/gpu.count": "zero"}), 2, ((0, 1),), Source.GPU_COUNT, (),
                     id="bad-gpu-count-label-uses-allocatable"),
        pytest.param(_node(annotation="{not json"), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: Expecting property name enclosed in double quotes: "
                      "line 1 column 2 (char 1)",), id="annotation-bad-json"),
        pytest.param(_node(annotation=[[0, 1, 2, 3], [3, 4, 5, 6]], labels={DOMAINS: "2", SIZE: "4"}), 8,
                     ((0, 1, 2, 3), (4, 5, 6, 7)), Source.LABELS,
                     (f"annotation {ANNOTATION} ignored: a GPU index appears in two domains",),
                     id="annotation-overlap-falls-back-to-labels"),
        pytest.param(_node(annotation=[]), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: expected a non-empty JSON list of GPU-index lists",),
                     id="annotation-empty-list"),
        pytest.param(_node(annotation={"groups": [[0]]}), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: expected a non-empty JSON list of GPU-index lists",),
                     id="annotation-object-without-domains"),
        pytest.param(_node(annotation=[[0, 1], []]), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: each domain must be a non-empty list of GPU indices",),
                     id="annotation-empty-domain"),
        pytest.param(_node(annotation=[[0, -1]]), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: each domain must be a non-empty list of GPU indices",),
                     id="annotation-negative-index"),
        pytest.param(_node(annotation=[[0, True]]), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: each domain must be a non-empty list of GPU indices",),
                     id="annotation-bool-index"),
        pytest.param(_node(annotation=[["0", "1"]]), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: each domain must be a non-empty list of GPU indices",),
                     id="annotation-string-index"),
        pytest.param(_node(labels={DOMAINS: "0", SIZE: "4"}), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"labels {DOMAINS}/{SIZE} incomplete or not positive",), id="labels-zero-domains"),
        pytest.param(_node(labels={DOMAINS: "2", SIZE: "-4"}), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"labels {DOMAINS}/{SIZE} incomplete or not positive",), id="labels-negative-size"),
        pytest.param(_node(labels={DOMAINS: "two", SIZE: "4"}), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"labels {DOMAINS}/{SIZE} incomplete or not positive",), id="labels-not-a-number"),
        pytest.param(_node(labels={SIZE: "4"}), 8, ((0, 1, 2, 3, 4, 5, 6, 7),), Source.GPU_COUNT,
                     (f"labels {DOMAINS}/{SIZE} incomplete or not positive",), id="labels-incomplete"),
        pytest.param(_node(annotation="[[0],[0]]", labels={DOMAINS: "1"}), 8, ((0, 1, 2, 3, 4, 5, 6, 7),),
                     Source.GPU_COUNT,
                     (f"annotation {ANNOTATION} ignored: a GPU index appears in two domains",
                      f"labels {DOMAINS}/{SIZE} incomplete or not positive"),
                     id="both-bad-both-reported"),
        pytest.param({"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "8"}}}, 0, (), Source.GPU_COUNT,
                     (), id="no-gpus"),
    ],
)
def test_from_node(
    node: dict[str, Any],
    count: int,
    domains: tuple[tuple[int, ...], ...],
    source: topology.Source,
    problems: tuple[str, ...],
) -> None:
    topo = topology.from_node(node, names=NAMES)
    assert (topo.gpu_count, topo.domains, topo.source, topo.problems) == (count, domains, source, problems)
    assert topo.known is (source is not Source.GPU_COUNT)
    assert topo.domain_size == max((len(d) for d in domains), default=0)


def test_custom_prefix_reads_its_own_names() -> None:
    names = settings.Names(prefix="gpus.example.com/")
    node = builders.gpu_node("n", gpus=4, topology="none", labels={
        "gpus.example.com/nvlink-domains": "2", "gpus.example.com/nvlink-domain-size": "2",
        DOMAINS: "1", SIZE: "4",  # the default prefix's labels are someone else's now
    })
    topo = topology.from_node(node, names=names)
    assert (topo.source, topo.domains) == (Source.LABELS, ((0, 1), (2, 3)))


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param({}, {"clique": None, "mig_strategy": None, "mig_config_state": None},
                     id="none"),
        pytest.param({"nvidia.com/gpu.clique": "cluster-a.1", "accelerator.topograph.run/domain": "rack-7"},
                     {"clique": "cluster-a.1", "mig_strategy": None, "mig_config_state": None},
                     id="clique-beats-topograph"),
        pytest.param({"accelerator.topograph.run/domain": "rack-7"},
                     {"clique": "rack-7", "mig_strategy": None, "mig_config_state": None},
                     id="topograph-domain"),
        pytest.param({"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config.state": "pending",
                      "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                     {"clique": None, "mig_strategy": "mixed", "mig_config_state": "pending"},
                     id="mig-and-product-label-ignored"),
    ],
)
def test_extra_labels(labels: dict[str, str], expected: dict[str, str | None]) -> None:
    topo = topology.from_node(builders.gpu_node("n", gpus=8, labels=labels), names=NAMES)
    assert {key: getattr(topo, key) for key in expected} == expected
    assert topo.source is Source.LABELS  # extras never change where the domains came from
