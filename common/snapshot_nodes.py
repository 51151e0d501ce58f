"""One GPU node of a snapshot (`common.snapshot.Node`) as the pods holding it leave it (pure: no I/O): the GPU
indices each of its GPU pods holds, its MIG slices in use, what is requested of it, its host ports and the required
anti-affinity terms covering it. `common.snapshot_build` assembles each node a change touched with it.
Where DCGM has not told us a pod's GPU indices, they are estimated with `common.placement`'s policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from common import antiaffinity, dra, gpu, placement, resources, snapshot


def assemble(*, name: str, raw: Mapping[str, Any], own: snapshot.NodeParse, resident: Sequence[snapshot.Pod],
             holders: Mapping[str, snapshot.Entry], observed: Mapping[int, str], claimed: Mapping[int, str],
             blocked: frozenset[int], terms: Mapping[tuple[str, str], Sequence[antiaffinity.Term]],
             inventory: dra.Inventory, before: Mapping[str, snapshot.Pod],
             slices: Sequence[tuple[str, str | None]] = (),
             ) -> tuple[snapshot.Node, tuple[str, ...], dict[str, snapshot.Pod]]:
    """One GPU node as the pods holding it leave it (`resident`: its GPU pods), with its problems and its GPU pods
    with their indices (`before`: their last ones, kept when equal). `slices`: its DRA MIG devices that are taken
    (`snapshot_build._slices_taken`)."""
    meta = raw.get("metadata") or {}
    problems: list[str] = []
    if (inventory.devices.get(name) or inventory.mig.get(name)) and not own.dra_gpus:
        found = ", ".join(f"{n} DRA {kind} devices" for kind, n in (("GPU", len(inventory.devices.get(name, ()))),
                                                                      ("MIG", len(inventory.mig.get(name, ())))) if n)
        problems.append(f"node {name}: {found} beside a device plugin's GPUs; only the device plugin's are counted")
    topo = own.topology
    problems += [f"node {name}: {p}" for p in topo.problems]
    # Bound pods first (oldest first), then the ones not bound yet: estimated indices go to the former.
    resident = sorted(resident, key=lambda p: (p.reserved, p.created, p.key))
    # On a DRA node the claims' allocations say exactly which devices each pod holds; devices taken by a claim of
    # no pod we hold, or tainted, are taken all the same (`blocked`).
    if own.dra_gpus:  # a claim still held by a pod that no longer holds the node (finished) is taken too
        here = {p.key for p in resident}
        observed = {i: key for i, key in claimed.items() if key in here}
        blocked = blocked | {i for i, key in claimed.items() if key not in here}
    else:
        blocked = frozenset()
    # Indices the topology names but no device has (labels that disagree with the slices) are never free.
    absent = frozenset(i for d in topo.domains for i in d) - _indices(inventory.devices.get(name, ())) \
        if own.dra_gpus else frozenset()
    indices, used, seen = _assign_indices(topo.domains, resident, observed, blocked | absent)
    placed: dict[str, snapshot.Pod] = {}
    for pod in resident:
        was = before.get(pod.key)
        if (was is not None and was.raw is pod.raw and was.gpu_indices == indices[pod.key]
                and was.indices_observed == (pod.key in seen) and was.dra == pod.dra and was.request == pod.request):
            placed[pod.key] = was
        else:
            placed[pod.key] = dataclasses.replace(pod, gpu_indices=indices[pod.key], indices_observed=pod.key in seen)
    mig_used = _slices_used(resident, slices if own.dra_gpus else ())
    asked_mig = gpu.GpuRequest()
    for pod in resident:
        asked_mig = gpu.add(asked_mig, gpu.GpuRequest(mig=pod.request.mig))
    extra_mig = {gpu.MIG_PREFIX + p: n - asked_mig.mig.get(p, 0) for p, n in mig_used.items()
                 if n > asked_mig.mig.get(p, 0)}
    node = snapshot.Node(
        name=name,
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        topology=topo,
        allocatable=own.allocatable,
        schedulable=own.schedulable,
        taints=own.taints,
        used=frozenset(used),
        requested_full=sum(p.request.full for p in resident) + len(blocked),
        mig_used=mig_used,
        pods=tuple(p.key for p in resident if not p.reserved),
        resources=own.resources,
        requested={**resources.add(*(e.requests for e in holders.values()),
                                   {gpu.FULL_GPU: len(blocked)} if blocked else {}, extra_mig),
                   resources.PODS: len(holders)},
        reserved=tuple(p.key for p in resident if p.reserved),
        host_ports=frozenset(port for e in holders.values() for port in e.host_ports),
        anti_affinity=covering(terms, meta.get("labels") or {}),
        dra_gpus=own.dra_gpus,
        extended_gpus=not own.dra_gpus or gpu.FULL_GPU in inventory.extended,
        extended_mig=frozenset(n for n, p in inventory.extended_mig.items() if n == gpu.MIG_PREFIX + p)
        if own.dra_gpus else frozenset(),
        device_order=inventory.order.get(name) if own.dra_gpus else None,
    )
    return node, tuple(problems), placed


def covering(terms: Mapping[tuple[str, str], Sequence[antiaffinity.Term]], labels: Mapping[str, str],
             ) -> tuple[antiaffinity.Term, ...]:
    """The terms covering a node with these labels."""
    return tuple(t for (key, value), found in terms.items() if labels.get(key) == value for t in found)


def _slices_used(resident: Sequence[snapshot.Pod], taken: Sequence[tuple[str, str | None]]) -> dict[str, int]:
    """MIG slices in use by profile: each resident pod's, the larger of what it asks and what its claims hold, and
    the taken ones no resident pod holds (`snapshot_build._slices_taken`)."""
    here = {p.key for p in resident}
    held: dict[tuple[str, str], int] = {}
    used: dict[str, int] = {}
    for profile, holder in taken:
        if holder in here:
            held[(str(holder), profile)] = held.get((str(holder), profile), 0) + 1
        else:
            used[profile] = used.get(profile, 0) + 1
    for pod in resident:
        for profile in {*pod.request.mig, *(p for k, p in held if k == pod.key)}:
            used[profile] = used.get(profile, 0) + max(pod.request.mig.get(profile, 0), held.get((pod.key, profile), 0))
    return {p: n for p, n in used.items() if n}


def _indices(devices: Sequence[dra.Device]) -> frozenset[int]:
    return frozenset(d.index if d.index is not None else position for position, d in enumerate(devices))


def _assign_indices(
    domains: Sequence[Sequence[int]], resident: Sequence[snapshot.Pod], observed: Mapping[int, str],
    blocked: frozenset[int] = frozenset(),
) -> tuple[dict[str, tuple[int, ...]], set[int], set[str]]:
    """Observed indices first; the rest of the pods get the placement policy's choice, oldest first; `blocked`
    indices are taken by nobody we know. Returns indices per pod, all used indices (blocked ones included), and the
    pods whose indices were observed (DCGM, or their claims' allocation)."""
    valid = {i for d in domains for i in d}
    keys = {p.key for p in resident}
    indices: dict[str, list[int]] = {p.key: [] for p in resident}
    for index, key in observed.items():
        if key in keys and index in valid:
            indices[key].append(index)
    seen = {key for key, held in indices.items() if held}
    used = {i for held in indices.values() for i in held} | (blocked & valid)
    for pod in resident:
        missing = pod.request.full - len(indices[pod.key])
        if missing <= 0:
            continue
        choice = placement.allocate(placement.free_by_domain(domains, used), missing)
        if choice is not None:
            indices[pod.key] += choice.indices
            used |= set(choice.indices)
    return {k: tuple(sorted(v)) for k, v in indices.items()}, used, seen
