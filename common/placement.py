"""Which GPU indices a pod gets inside a node — the one documented policy.

The scheduler picks only the node; the device plugin picks the indices. gpu-steward models that
choice with one policy, used everywhere a choice must be assumed (scoring a node, estimating
occupancy without DCGM data, and the kwok stand-in for the device plugin in tests and the demo):

1. the smallest domain whose free GPUs can hold the whole pod (lowest domain index on a tie),
   taking its lowest free indices;
2. else the fewest domains: largest free domains first (lowest index on a tie).

On a node whose GPUs are DRA devices the device plugin is out of the picture: kube-scheduler's allocator picks
the devices, first fit in device order (`k8s.io/dynamic-resource-allocation/structured`, `allocateOne`; seen on
1.37.2 and 1.36.3: after devices 0 and 1-2 were taken, a 4-GPU pod got 3, 4, 5, 6 while 4-7 was free). There
the model predicts that choice instead (`first_fit`: the node's GPU indices in the order its one ResourceSlice
lists them, which NVIDIA's driver does not keep by index); where that order is not known, it keeps the policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Allocation:
    indices: tuple[int, ...]
    domains: tuple[int, ...]  # positions (in the node's domain list) of the domains used

    @property
    def spanned(self) -> int:
        return len(self.domains)


def free_by_domain(domains: Sequence[Sequence[int]], used: Iterable[int]) -> list[list[int]]:
    taken = set(used)
    return [[i for i in domain if i not in taken] for domain in domains]


def allocate(free: Sequence[Sequence[int]], count: int, *, first_fit: Sequence[int] | None = None,
             ) -> Allocation | None:
    """Pick `count` indices from per-domain free lists; None when the node cannot hold them. `first_fit`: the
    order the DRA allocator tries the node's GPUs in; then its choice (the first free ones in that order, whatever
    domains they are in) instead of the policy."""
    if count <= 0:
        return Allocation((), ())
    if sum(len(f) for f in free) < count:
        return None
    if first_fit is not None:
        rank = {index: position for position, index in enumerate(first_fit)}
        first = sorted((i for f in free for i in f), key=lambda i: (rank.get(i, len(rank)), i))[:count]
        return Allocation(tuple(sorted(first)), tuple(pos for pos, f in enumerate(free) if set(f) & set(first)))
    fitting = [(len(f), pos) for pos, f in enumerate(free) if len(f) >= count]
    if fitting:
        _, pos = min(fitting)
        return Allocation(tuple(sorted(free[pos])[:count]), (pos,))
    picked: list[int] = []
    used_domains: list[int] = []
    # Largest first, and enough GPUs are free (checked above): the count is reached before any empty domain.
    for pos in sorted(range(len(free)), key=lambda p: (-len(free[p]), p)):
        take = sorted(free[pos])[: count - len(picked)]
        picked += take
        used_domains.append(pos)
        if len(picked) == count:
            break
    return Allocation(tuple(sorted(picked)), tuple(used_domains))
