"""Which entries of the DRA inventory a pod's parse read, and which entries changed between two inventories. Pure.

`snapshot_build.Builder` parses a pod asking devices through claims again only when an entry its last parse read
changed, not on every change of any claim: on a cluster whose GPUs are DRA devices every pod kube-scheduler binds
writes a claim, so re-parsing every claiming pod at each of them cost most of a rebuild.

An entry is a key of one of the inventory's per-claim maps (`ENTRY_FIELDS`: the claims holding GPUs, every
claim's spec and owners, the templates), read or missed: a pod that found no claim under a key depends on that
key as much as one that found it. What the inventory holds for every pod (the GPU classes, whether
`resource.k8s.io/v1` is served) is not an entry: `changed` says None (everything may differ) when it changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from common import dra

ENTRY_FIELDS = ("claims", "specs", "owners", "templates")
EVERY = "*"  # a read of the whole map (iterated): any change of it concerns the pod

Entry = tuple[str, str]  # (field, key)
V = TypeVar("V")


class _Recorded(Mapping[str, V]):
    """A map that notes each key asked of it into `reads` (a miss included)."""

    def __init__(self, inner: Mapping[str, V], field: str, reads: set[Entry]) -> None:
        self._inner, self._field, self._reads = inner, field, reads

    def __getitem__(self, key: str) -> V:
        self._reads.add((self._field, key))
        return self._inner[key]

    def __contains__(self, key: object) -> bool:
        self._reads.add((self._field, str(key)))
        return key in self._inner

    def __iter__(self) -> Iterator[str]:
        self._reads.add((self._field, EVERY))
        return iter(self._inner)

    def __len__(self) -> int:
        self._reads.add((self._field, EVERY))
        return len(self._inner)


def recording(inventory: dra.Inventory, reads: set[Entry]) -> dra.Inventory:
    """The inventory as it is, noting into `reads` each entry read through it."""
    fields: dict[str, Any] = {f: _Recorded(getattr(inventory, f), f, reads) for f in ENTRY_FIELDS}
    return dataclasses.replace(inventory, **fields)


def changed(was: dra.Inventory, now: dra.Inventory) -> set[Entry] | None:
    """The entries whose value differs between the two inventories, each also as (field, EVERY); None: what every
    pod reads (the GPU classes, `served`) differs."""
    if was.served != now.served or was.classes != now.classes:
        return None
    out: set[Entry] = set()
    for field in ENTRY_FIELDS:
        old: Mapping[str, Any] = getattr(was, field)
        new: Mapping[str, Any] = getattr(now, field)
        for key in old.keys() | new.keys():
            if key not in old or key not in new or (old[key] is not new[key] and old[key] != new[key]):
                out.update(((field, key), (field, EVERY)))
    return out


def concerned(reads: set[Entry], touched: set[Entry] | None) -> bool:
    """Whether a parse that read `reads` may differ once the entries `touched` (`changed`) changed."""
    return touched is None or not reads.isdisjoint(touched)
