"""The NVLink topology of one node, read from its labels and annotation.

Sources, best first: the `<prefix>nvlink-topology` annotation (JSON list of GPU-index lists, one per
NVLink domain, written by `gpu-steward label-node`); the `<prefix>nvlink-domains` and
`<prefix>nvlink-domain-size` labels (contiguous domains); else only a GPU count
(`nvidia.com/gpu.count` or allocatable `nvidia.com/gpu`) and the topology is unknown.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

from common import gpu, label_values, settings

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
TOPOGRAPH_DOMAIN_LABEL = "accelerator.topograph.run/domain"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"


class Source(enum.StrEnum):
    ANNOTATION = "annotation"
    LABELS = "labels"
    GPU_COUNT = "gpu-count"  # how many GPUs, not how they are linked


@dataclasses.dataclass(frozen=True)
class NodeTopology:
    gpu_count: int
    domains: tuple[tuple[int, ...], ...]  # GPU indices per NVLink domain; one domain when unknown
    source: Source
    problems: tuple[str, ...] = ()  # why a better source was not used
    clique: str | None = None  # multi-node NVLink domain (GB200 NVL72 style), if any
    mig_strategy: str | None = None
    mig_config_state: str | None = None

    @property
    def known(self) -> bool:
        return self.source is not Source.GPU_COUNT

    @property
    def domain_size(self) -> int:
        return max((len(d) for d in self.domains), default=0)


def _parse_annotation(text: str) -> tuple[tuple[int, ...], ...]:
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("domains")
    if not isinstance(data, list) or not data:
        raise ValueError("expected a non-empty JSON list of GPU-index lists")
    domains = []
    seen: set[int] = set()
    for domain in data:
        if not isinstance(domain, list) or not domain or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in domain
        ):
            raise ValueError("each domain must be a non-empty list of GPU indices")
        if seen & set(domain):
            raise ValueError("a GPU index appears in two domains")
        seen |= set(domain)
        domains.append(tuple(sorted(domain)))
    return tuple(domains)


def positive_int(value: str | None) -> int | None:
    """A count label's value; None when absent or not a positive integer (`label_values.count`)."""
    return label_values.count(value, key="").value


def from_node(node: Mapping[str, Any], *, names: settings.Names, gpus: int | None = None) -> NodeTopology:
    """`gpus`: how many whole GPUs the node has when its allocatable does not say (DRA devices, `common.dra`)."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    allocatable = gpu.node_allocatable(node).full if gpus is None else gpus
    extras = {
        "clique": labels.get(CLIQUE_LABEL) or labels.get(TOPOGRAPH_DOMAIN_LABEL),
        "mig_strategy": labels.get(MIG_STRATEGY_LABEL),
        "mig_config_state": labels.get(MIG_CONFIG_STATE_LABEL),
    }
    problems: list[str] = []

    raw = annotations.get(names.nvlink_topology)
    if raw:
        try:
            domains = _parse_annotation(raw)
        except (ValueError, json.JSONDecodeError) as exc:
            problems.append(f"annotation {names.nvlink_topology} ignored: {exc}")
        else:
            count = sum(len(d) for d in domains)
            return NodeTopology(count, domains, Source.ANNOTATION, tuple(problems), **extras)

    n_domains = positive_int(labels.get(names.nvlink_domains))
    size = positive_int(labels.get(names.nvlink_domain_size))
    if n_domains and size:
        domains = tuple(tuple(range(d * size, (d + 1) * size)) for d in range(n_domains))
        return NodeTopology(n_domains * size, domains, Source.LABELS, tuple(problems), **extras)
    if names.nvlink_domains in labels or names.nvlink_domain_size in labels:
        problems.append(f"labels {names.nvlink_domains}/{names.nvlink_domain_size} incomplete or not positive")

    count = positive_int(labels.get(GPU_COUNT_LABEL)) or allocatable
    return NodeTopology(count, (tuple(range(count)),) if count else (), Source.GPU_COUNT, tuple(problems), **extras)
