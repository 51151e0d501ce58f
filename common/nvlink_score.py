"""The NVLink-aware node score from the product brief, term by term (docs/scoring.md): one pure function
of a pod's GPU count and a node's free GPUs, used by the webhook's ranking and by release planning.

A node starts at `base`. For a pod of G whole GPUs, with the GPU indices the placement policy
(common.placement) would give it on that node:
- domain integrity: all G in one NVLink domain `+fits_one_domain`; a whole empty domain of exactly
  G GPUs `+exact_domain_fit`; every further domain spanned `-extra_domain_penalty`;
- node-workload match: a small pod on a small node earns `small_on_small_max` on a node no larger
  than the small-pod class, falling linearly to `small_on_small_min` at `small_node_max_gpus`; on a
  bigger node `small_on_oversized`. A large pod on a large node earns `large_on_large_min` rising
  linearly to `large_on_large_max` as it fills the node; on a smaller node `large_on_undersized`;
- domain completion: G takes every free GPU of a partly used domain `+domain_completion`;
- efficiency: node GPU utilisation after placement above `high_utilisation_above` earns
  `high_utilisation_min` rising linearly to `high_utilisation_max` at 100 %; below
  `low_utilisation_below` it costs `low_utilisation_penalty`.
Where a node's NVLink topology is unknown the domain terms do not apply.

Normalisation onto affinity weights (1..100) is linear over the theoretical range of the constants:
from `base - extra_domain_penalty*(normalisation_max_domains-1) + min(mismatch penalties) +
min(low_utilisation_penalty, 0)` to `base + fits_one_domain + max(exact_domain_fit, domain_completion) +
max(match bonuses) + high_utilisation_max`, clamped, so it keeps the order of raw scores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from common import placement, settings, topology


@dataclasses.dataclass(frozen=True)
class Term:
    name: str
    points: float
    why: str


@dataclasses.dataclass(frozen=True)
class NodeScore:
    node: str
    score: float
    normalized: int
    spanned: int  # NVLink domains the pod would span there (1 when topology is unknown)
    terms: tuple[Term, ...]

    def explain(self) -> str:
        return ", ".join(f"{t.name} {t.points:+g} ({t.why})" for t in self.terms)


def _lerp(low: float, high: float, t: float) -> float:
    return low + (high - low) * min(1.0, max(0.0, t))


def bounds(cfg: settings.Scoring) -> tuple[float, float]:
    lowest = (
        cfg.base
        - cfg.extra_domain_penalty * (cfg.normalisation_max_domains - 1)
        + min(cfg.small_on_oversized, cfg.large_on_undersized, 0)
        + min(cfg.low_utilisation_penalty, 0)
    )
    highest = (
        cfg.base
        + cfg.fits_one_domain
        + max(cfg.exact_domain_fit, cfg.domain_completion, 0)
        + max(cfg.small_on_small_max, cfg.large_on_large_max, 0)
        + max(cfg.high_utilisation_max, 0)
    )
    return lowest, highest


def normalize(score: float, cfg: settings.Scoring) -> int:
    lowest, highest = bounds(cfg)
    if highest <= lowest:
        return 100
    return max(1, min(100, 1 + round(99 * (score - lowest) / (highest - lowest))))


def _domain_terms(gpus: int, free: Sequence[Sequence[int]], sizes: list[int], cfg: settings.Scoring, *,
                  first_fit: Sequence[int] | None) -> list[Term]:
    choice = placement.allocate(free, gpus, first_fit=first_fit)
    assert choice is not None  # callers check capacity first
    if choice.spanned > 1:
        extra = choice.spanned - 1
        return [Term("spans-domains", -cfg.extra_domain_penalty * extra, f"{choice.spanned} NVLink domains")]
    pos = choice.domains[0]
    free_before, size = len(free[pos]), sizes[pos]
    terms = [Term("one-domain", cfg.fits_one_domain, f"fits NVLink domain {pos} ({free_before}/{size} free)")]
    if gpus == size and free_before == size:
        terms.append(Term("exact-domain", cfg.exact_domain_fit, f"takes all of empty domain {pos}"))
    elif free_before < size and gpus == free_before:
        terms.append(Term("completes-domain", cfg.domain_completion, f"fills partly used domain {pos}"))
    return terms


def _match_term(gpus: int, node_gpus: int, cfg: settings.Scoring) -> Term | None:
    if gpus <= cfg.small_pod_max_gpus:
        if node_gpus > cfg.small_node_max_gpus:
            return Term("oversized-node", cfg.small_on_oversized, f"small pod on a {node_gpus}-GPU node")
        span = cfg.small_node_max_gpus - cfg.small_pod_max_gpus
        t = 0.0 if span <= 0 else (node_gpus - cfg.small_pod_max_gpus) / span
        return Term("small-node", _lerp(cfg.small_on_small_max, cfg.small_on_small_min, t),
                    f"small pod on a {node_gpus}-GPU node")
    if gpus >= cfg.large_pod_min_gpus:
        if node_gpus < cfg.large_node_min_gpus:
            return Term("undersized-node", cfg.large_on_undersized, f"large pod on a {node_gpus}-GPU node")
        span = node_gpus - cfg.large_pod_min_gpus
        t = 1.0 if span <= 0 else (gpus - cfg.large_pod_min_gpus) / span
        return Term("large-node", _lerp(cfg.large_on_large_min, cfg.large_on_large_max, t),
                    f"large pod on a {node_gpus}-GPU node")
    return None


def _efficiency_term(gpus: int, *, total: int, free: int, cfg: settings.Scoring) -> Term | None:
    after = (total - free + gpus) / total
    if after > cfg.high_utilisation_above:
        t = 1.0 if cfg.high_utilisation_above >= 1 else (after - cfg.high_utilisation_above) / (
            1 - cfg.high_utilisation_above)
        return Term("utilisation", _lerp(cfg.high_utilisation_min, cfg.high_utilisation_max, t),
                    f"{after:.0%} of node GPUs in use after")
    if after < cfg.low_utilisation_below:
        return Term("utilisation", cfg.low_utilisation_penalty, f"{after:.0%} of node GPUs in use after")
    return None


def score(
    gpus: int, *, name: str, free: Sequence[Sequence[int]], free_gpus: int, gpu_count: int,
    topo: topology.NodeTopology, cfg: settings.Scoring, first_fit: Sequence[int] | None = None,
) -> NodeScore | None:
    """A node's score for a pod of `gpus` whole GPUs, given its free GPUs (in all, and free indices per NVLink
    domain), or None when they cannot hold it. `first_fit`: the order kube-scheduler's allocator tries a DRA node's
    GPUs in (`placement.allocate`)."""
    if gpus > free_gpus or sum(len(f) for f in free) < gpus:
        return None
    terms = [Term("base", cfg.base, "every candidate node")]
    spanned = 1
    if topo.known:
        terms += _domain_terms(gpus, free, [len(d) for d in topo.domains], cfg, first_fit=first_fit)
        spanned = placement.allocate(free, gpus, first_fit=first_fit).spanned  # type: ignore[union-attr]
    extra = [_match_term(gpus, gpu_count, cfg), _efficiency_term(gpus, total=gpu_count, free=free_gpus, cfg=cfg)]
    terms += [t for t in extra if t is not None]
    total = sum(t.points for t in terms)
    return NodeScore(name, total, normalize(total, cfg), spanned, tuple(terms))
