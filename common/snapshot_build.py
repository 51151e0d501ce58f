"""Builds snapshots (`common.snapshot`) from raw API objects and DCGM occupancy (pure: no I/O, no clock).

`build()` builds from scratch; `Builder` builds one snapshot after another (the shell, `common.feeder`, owns one),
re-doing only what changed, with the same result; `from_list()` replays the JSON of
`kubectl get nodes,pods,priorityclasses,namespaces -A -o json`. What each GPU node reads of the rest of the cluster
(the DRA claims holding its devices, its taken MIG devices, the required anti-affinity terms covering it) is worked
out here; `common.snapshot_nodes` assembles the node from it and the pods holding it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from common import antiaffinity, dra, dra_reads, gangs, gpu, settings, snapshot, snapshot_nodes


def build(
    *,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    priority_classes: Iterable[Mapping[str, Any]] = (),
    namespaces: Iterable[Mapping[str, Any]] = (),
    occupancy: snapshot.Occupancy | None = None,
    names: settings.Names,
    taken_at: float | None,
    pod_groups: Iterable[Mapping[str, Any]] = (),
    pod_group_version: str | None = gangs.POD_GROUP_VERSIONS[0],
    disruption_budgets: Iterable[Mapping[str, Any]] = (),
    inventory: dra.Inventory = dra.EMPTY,
) -> snapshot.Snapshot:
    """A snapshot from scratch (`Builder` builds one after another, re-doing only what changed). `inventory`: the
    cluster's DRA GPUs (`dra.build`): a node without a device plugin's GPUs offers its GPU devices, and which of
    them are taken, and by whom, is read from the claims' allocations. `pod_group_version`: the PodGroup API version
    `pod_groups` were read from (None: not served or not granted to us; `gangs.identify` says so). An object listed
    twice (the same node name, the same pod namespace/name) counts once: the last one."""
    return Builder(names=names).build(
        nodes={snapshot.node_name(raw): raw for raw in nodes}, pods={snapshot.pod_key(raw): raw for raw in pods},
        priority_classes=priority_classes, namespaces=namespaces, occupancy=occupancy, taken_at=taken_at,
        pod_groups=pod_groups, pod_group_version=pod_group_version, disruption_budgets=disruption_budgets,
        inventory=inventory)


class Builder:
    """Builds a snapshot from the stores after each change, re-doing only what the change touched; each result equals
    a from-scratch `build` of the same objects. Pure (no I/O, no clock); one build at a time.

    What it keeps from the last build, and what makes it do a part again:
    - a pod's parse: again when the store holds a new object under its key (the feeder replaces, never mutates, a
      changed object), or when the pod asks devices through claims and an entry of the DRA inventory its parse read
      changed (`dra_reads`: its claims, their specs and owners, its templates; every such pod when the GPU classes
      or whether resource.k8s.io is served changed; every pod when the extended resource names GPU classes serve
      changed);
    - a node's parse: again when its object is a new one, or its number of DRA GPU devices changed;
    - a node's `Node` and its GPU pods' indices: again when its object, any pod holding it (or that held it), its
      DCGM occupancy, its DRA devices, their order, the claims holding them or their taints, whether a DeviceClass
      serves `nvidia.com/gpu`, or the required anti-affinity terms covering it changed;
    - the anti-affinity terms: again when a pod that has such terms changed, a node's labels, or the namespaces.
    PriorityClasses, namespaces, PodGroups and PodDisruptionBudgets are read again each build (few, cheap).
    A build that raises leaves nothing kept: the next one starts from scratch."""

    def __init__(self, *, names: settings.Names) -> None:
        self._names = names
        self._forget()

    def _forget(self) -> None:
        self._first = True
        self._pods: Mapping[str, Mapping[str, Any]] = {}  # the pods' objects at the last build, by key
        self._entries: dict[str, snapshot.Entry] = {}  # each pod's parse, by key
        self._pod_problems: dict[str, str] = {}  # pods skipped, by key
        # keys of pods asking devices through claims -> the inventory's entries their parse read (`dra_reads`)
        self._claiming: dict[str, set[dra_reads.Entry]] = {}
        self._holders: dict[str, dict[str, snapshot.Entry]] = {}  # node -> the parses of the pods holding it, by key
        self._uids: dict[str, str] = {}  # uid -> key of the GPU pods and gang members (`Pod`)
        self._nodes: Mapping[str, Mapping[str, Any]] = {}  # the nodes' objects at the last build, by name
        self._node_parses: dict[str, snapshot.NodeParse | None] = {}
        self._built: dict[str, snapshot.Node] = {}  # GPU nodes
        self._node_problems: dict[str, tuple[str, ...]] = {}
        # GPU node -> its GPU pods with their GPU indices, by key
        self._indexed: dict[str, dict[str, snapshot.Pod]] = {}
        self._occupancy: snapshot.Occupancy = {}
        self._inventory = dra.EMPTY
        self._claimed: dict[str, dict[int, str]] = {}
        self._blocked: dict[str, frozenset[int]] = {}
        self._slices: dict[str, tuple[tuple[str, str | None], ...]] = {}
        self._namespaces: list[Mapping[str, Any]] = []
        self._terms: dict[tuple[str, str], list[antiaffinity.Term]] = {}

    def build(
        self,
        *,
        nodes: Mapping[str, Mapping[str, Any]],
        pods: Mapping[str, Mapping[str, Any]],
        priority_classes: Iterable[Mapping[str, Any]] = (),
        namespaces: Iterable[Mapping[str, Any]] = (),
        occupancy: snapshot.Occupancy | None = None,
        taken_at: float | None,
        pod_groups: Iterable[Mapping[str, Any]] = (),
        pod_group_version: str | None = gangs.POD_GROUP_VERSIONS[0],
        disruption_budgets: Iterable[Mapping[str, Any]] = (),
        inventory: dra.Inventory = dra.EMPTY,
    ) -> snapshot.Snapshot:
        """`nodes`: node objects by name; `pods`: pod objects by `pod_key`; the rest as `build` takes them. The
        mappings are kept until the next build: hand over copies, not a store that changes."""
        try:
            return self._build(nodes=nodes, pods=pods, priority_classes=priority_classes, namespaces=list(namespaces),
                               occupancy=occupancy or {}, taken_at=taken_at, pod_groups=pod_groups,
                               pod_group_version=pod_group_version, disruption_budgets=disruption_budgets,
                               inventory=inventory)
        except BaseException:
            self._forget()  # a half-updated state: the next build starts from scratch
            raise

    def _build(self, *, nodes: Mapping[str, Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]],
               priority_classes: Iterable[Mapping[str, Any]], namespaces: list[Mapping[str, Any]],
               occupancy: snapshot.Occupancy, taken_at: float | None, pod_groups: Iterable[Mapping[str, Any]],
               pod_group_version: str | None, disruption_budgets: Iterable[Mapping[str, Any]],
               inventory: dra.Inventory) -> snapshot.Snapshot:
        first, was = self._first, self._inventory
        dra_same = not first and (was is inventory or was == inventory)
        dirty: set[str] = set(nodes) | set(self._nodes) if first else set()  # nodes to assemble again
        terms_dirty = first or len(namespaces) != len(self._namespaces) or any(
            a is not b for a, b in zip(namespaces, self._namespaces, strict=False))

        # Pods: parse again the new objects (and those the inventory's change concerns).
        changed = [key for key, raw in pods.items() if self._pods.get(key) is not raw]
        changed += [key for key in self._pods if key not in pods]
        if not dra_same and not first:
            if _renamed(was) != _renamed(inventory):
                changed += list(pods)
            else:
                touched = dra_reads.changed(was, inventory)
                changed += [key for key, reads in self._claiming.items() if dra_reads.concerned(reads, touched)]
        for key in dict.fromkeys(changed):
            terms_dirty |= self._reparse(key, pods.get(key), inventory=inventory, dirty=dirty)

        # Nodes: parse again the new objects, or the ones whose DRA devices changed.
        for name in {name for name, raw in nodes.items() if self._nodes.get(name) is not raw} | (
                set(self._nodes) - set(nodes)):
            dirty.add(name)
            old, raw = self._nodes.get(name), nodes.get(name)
            terms_dirty |= _labels(old) != _labels(raw)
        if not dra_same:
            if ((gpu.FULL_GPU in was.extended) != (gpu.FULL_GPU in inventory.extended)
                    or was.extended_mig != inventory.extended_mig):
                dirty |= set(nodes)
            dirty |= {name for name in nodes if was.devices.get(name) != inventory.devices.get(name)
                      or was.mig.get(name) != inventory.mig.get(name)
                      or was.order.get(name) != inventory.order.get(name)}
        for name in dirty:
            raw = nodes.get(name)
            devices, profiles = len(inventory.devices.get(name, ())), inventory.profiles(name)
            own = self._node_parses.get(name)
            parsed_with = (own.devices, own.slices) if own is not None else (0, ())
            if raw is None:
                self._node_parses.pop(name, None)
            elif (self._nodes.get(name) is not raw or name not in self._node_parses
                  or parsed_with != (devices, tuple(sorted(profiles.items())))):
                self._node_parses[name] = snapshot.parse_node(raw, names=self._names, devices=devices, slices=profiles)

        # What a node reads of the rest of the cluster: DCGM occupancy, the claims holding its DRA devices.
        if occupancy is not self._occupancy:
            dirty |= {name for name in set(occupancy) | set(self._occupancy)
                      if occupancy.get(name) != self._occupancy.get(name)}
        claimed, blocked = _claimed(inventory, self._uids) if inventory.devices else ({}, {})
        slices = _slices_taken(inventory, self._uids) if inventory.mig else {}
        dirty |= {name for name in set(claimed) | set(self._claimed)
                  if claimed.get(name) != self._claimed.get(name) or blocked.get(name) != self._blocked.get(name)}
        dirty |= {name for name in set(slices) | set(self._slices) if slices.get(name) != self._slices.get(name)}
        namespace_labels = {(ns.get("metadata") or {}).get("name") or "": (ns.get("metadata") or {}).get("labels")
                            or {} for ns in namespaces}
        if terms_dirty:
            self._terms = _terms(((key, self._entries[key]) for key in pods if key in self._entries),
                                 labels_of={name: _labels(raw) for name, raw in nodes.items()},
                                 namespaces=namespace_labels)
            dirty |= {name for name, node in self._built.items() if name in nodes
                      and node.anti_affinity != snapshot_nodes.covering(self._terms, _labels(nodes[name]))}

        # Assemble the nodes that changed; the others are kept as they were.
        before: dict[str, snapshot.Pod] = {}
        for name in dirty:
            before.update(self._indexed.pop(name, {}))
            self._built.pop(name, None)
            self._node_problems.pop(name, None)
        for name in dirty:
            own = self._node_parses.get(name)
            if own is None:
                continue
            holders = self._holders.get(name, {})
            resident = [e for e in holders.values() if isinstance(e, snapshot.Pod) and e.request.any]
            node, problems, indexed = snapshot_nodes.assemble(
                name=name, raw=nodes[name], own=own, resident=resident, holders=holders,
                observed=occupancy.get(name, {}), claimed=claimed.get(name, {}),
                blocked=blocked.get(name, frozenset()), terms=self._terms, inventory=inventory, before=before,
                slices=slices.get(name, ()))
            self._built[name], self._indexed[name] = node, indexed
            if problems:
                self._node_problems[name] = problems

        self._first, self._pods, self._nodes, self._occupancy = False, pods, nodes, occupancy
        self._inventory, self._claimed, self._blocked, self._namespaces = inventory, claimed, blocked, namespaces
        self._slices = slices
        return self._snapshot(nodes=nodes, pods=pods, priority_classes=priority_classes,
                              namespace_labels=namespace_labels, taken_at=taken_at, pod_groups=pod_groups,
                              pod_group_version=pod_group_version, disruption_budgets=disruption_budgets,
                              inventory=inventory)

    def _reparse(self, key: str, raw: Mapping[str, Any] | None, *, inventory: dra.Inventory, dirty: set[str]) -> bool:
        """Forget the pod's last parse and parse `raw` (None: it is gone); the nodes it held and holds are `dirty`.
        Returns whether either parse has required anti-affinity terms."""
        terms = False
        self._pod_problems.pop(key, None)
        self._claiming.pop(key, None)
        old = self._entries.pop(key, None)
        if old is not None:
            terms = bool(old.anti_affinity)
            if old.held_on is not None:
                dirty.add(old.held_on)
                self._holders[old.held_on].pop(key, None)
            if isinstance(old, snapshot.Pod) and self._uids.get(old.uid) == key:
                del self._uids[old.uid]
        if raw is None:
            return terms
        if _claims(raw):
            reads = self._claiming[key] = set()
            inventory = dra_reads.recording(inventory, reads)
        try:
            entry = snapshot.parse(raw, names=self._names, inventory=inventory)
        except (gpu.QuantityError, ValueError, TypeError) as exc:
            self._pod_problems[key] = f"pod {key} skipped: {exc}"
            return terms
        self._entries[key] = entry
        if entry.held_on is not None:
            dirty.add(entry.held_on)
            self._holders.setdefault(entry.held_on, {})[key] = entry
        if isinstance(entry, snapshot.Pod) and entry.uid:
            self._uids[entry.uid] = key
        return terms or bool(entry.anti_affinity)

    def _snapshot(self, *, nodes: Mapping[str, Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]],
                  priority_classes: Iterable[Mapping[str, Any]], namespace_labels: Mapping[str, Mapping[str, str]],
                  taken_at: float | None, pod_groups: Iterable[Mapping[str, Any]], pod_group_version: str | None,
                  disruption_budgets: Iterable[Mapping[str, Any]], inventory: dra.Inventory) -> snapshot.Snapshot:
        """The snapshot of what is kept, every mapping in the stores' order (as a from-scratch build gives it)."""
        entries = self._entries
        parsed = {key: (raw, entries[key]) for key, raw in pods.items() if key in entries}
        indexed = {key: pod for placed in self._indexed.values() for key, pod in placed.items()}
        kept = {key: indexed.get(key, entry) for key, (_, entry) in parsed.items() if isinstance(entry, snapshot.Pod)}
        problems = [*inventory.problems]
        if self._pod_problems:
            problems += [self._pod_problems[key] for key in pods if key in self._pod_problems]
        problems += [p for name in nodes for p in self._node_problems.get(name, ())]
        built = snapshot.Snapshot(
            nodes={name: self._built[name] for name in nodes if name in self._built},
            pods=kept,
            priority_classes={pc.name: pc for pc in map(snapshot.priority_class, priority_classes)},
            namespaces=dict(namespace_labels),
            taken_at=taken_at,
            pod_groups=gangs.PodGroups({group.key: group for group in map(gangs.pod_group, pod_groups)},
                                       pod_group_version),
            problems=tuple(problems),
            parsed=parsed,
            disruption_budgets={b.key: b for b in map(snapshot.disruption_budget, disruption_budgets)},
            parsed_nodes={name: (raw, self._node_parses.get(name)) for name, raw in nodes.items()},
            dra=inventory,
        )
        # Derived views are computed here, where the shell builds (off the request path), not on first use.
        _ = built.nodes_by_gpu_state
        return built


def _labels(raw: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((raw or {}).get("metadata") or {}).get("labels") or {}


def _renamed(inventory: dra.Inventory) -> frozenset[str]:
    """The extended resource names GPU classes serve other than the device plugin's (`nvidia.com/gpu`,
    `nvidia.com/mig-<profile>`): a pod's parse reads them."""
    return frozenset(name for name in inventory.extended if name != gpu.FULL_GPU) | frozenset(
        name for name, profile in inventory.extended_mig.items() if name != gpu.MIG_PREFIX + profile)


def _terms(entries: Iterable[tuple[str, snapshot.Entry]], *, labels_of: Mapping[str, Mapping[str, str]],
           namespaces: Mapping[str, Mapping[str, str]]) -> dict[tuple[str, str], list[antiaffinity.Term]]:
    """The required anti-affinity terms of pods holding nodes by the topology pair (key, value) they cover, from
    every pod that holds a node (GPU nodes or not: a zone spans both)."""
    terms_on: dict[tuple[str, str], list[antiaffinity.Term]] = {}
    for key, entry in entries:  # not sorted: every pod of the cluster passes here
        if entry.held_on is None or not entry.anti_affinity:
            continue
        for raw_term in entry.anti_affinity:
            term = antiaffinity.resolve(raw_term, owner=key, owner_namespace=entry.namespace,
                                        node_labels=labels_of.get(entry.held_on, {}), namespaces=namespaces)
            if term is not None:
                terms_on.setdefault((term.topology_key, term.topology_value), []).append(term)
    for found in terms_on.values():
        found.sort(key=lambda t: t.owner)  # the first refusing term is the reason given: the same every build
    return terms_on


def _claimed(inventory: dra.Inventory, key_of: Mapping[str, str],
             ) -> tuple[dict[str, dict[int, str]], dict[str, frozenset[int]]]:
    """Per DRA node: GPU index -> key of the pod its claim is reserved for (`key_of`: pod uid -> key), and the
    indices taken otherwise: by a claim reserved for no pod we know (allocated, not reserved; a finished pod's), or
    tainted against new claims. A device's index is its `index` attribute, else its place in the node's list."""
    taken = inventory.taken()
    claimed: dict[str, dict[int, str]] = {}
    blocked: dict[str, frozenset[int]] = {}
    for node, devices in inventory.devices.items():
        mine: dict[int, str] = {}
        others: set[int] = set()
        for position, device in enumerate(devices):
            index = device.index if device.index is not None else position
            claim = taken.get(device.id)
            holder = next((key_of[u] for u in claim.reserved_for if u in key_of), None) if claim else None
            if holder is not None:
                mine[index] = holder
            elif claim is not None or device.blocked:
                others.add(index)
        claimed[node], blocked[node] = mine, frozenset(others)
    return claimed, blocked


def _slices_taken(inventory: dra.Inventory, key_of: Mapping[str, str],
                  ) -> dict[str, tuple[tuple[str, str | None], ...]]:
    """Per DRA node, its MIG devices that no new claim can get: (profile, key of the pod its claim is reserved for,
    None: a claim of no pod we know, or a taint against new claims)."""
    taken = inventory.taken()
    out: dict[str, tuple[tuple[str, str | None], ...]] = {}
    for node, devices in inventory.mig.items():
        found = []
        for device in devices:
            claim = taken.get(device.id)
            if claim is not None or device.blocked:
                holder = next((key_of[u] for u in claim.reserved_for if u in key_of), None) if claim else None
                found.append((str(device.profile), holder))
        out[node] = tuple(found)
    return out


def _claims(raw: Mapping[str, Any]) -> bool:
    return bool((raw.get("spec") or {}).get("resourceClaims")
                or (raw.get("status") or {}).get("extendedResourceClaimStatus"))


LIST_KINDS = ("List", "NodeList", "PodList", "PriorityClassList", "NamespaceList")


DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceTaintRule")


def from_list(document: Mapping[str, Any], *, names: settings.Names, taken_at: float | None,
              gpu_classes: Sequence[str] = settings.Dra().gpu_device_classes) -> snapshot.Snapshot:
    """Build from a Kubernetes `List` (kubectl get ... -o json) of nodes, pods, priorityclasses, namespaces
    (and podgroups, poddisruptionbudgets and DRA's deviceclasses, resourceslices, resourceclaims,
    resourceclaimtemplates and devicetainterules, if listed: `gpu_classes` names the GPU DeviceClasses).
    DRA counts as served when the list holds a DeviceClass or a ResourceSlice."""
    if document.get("kind") not in LIST_KINDS:
        raise ValueError(f"top-level kind is {document.get('kind')!r}; expected one of {', '.join(LIST_KINDS)}")
    items = document.get("items") or []
    if not isinstance(items, list):
        raise ValueError(f"items is a {type(items).__name__}; expected a list of objects")
    buckets: dict[str, list[Mapping[str, Any]]] = {
        "Node": [], "Pod": [], "PriorityClass": [], "Namespace": [], "PodGroup": [], "PodDisruptionBudget": [],
        **{kind: [] for kind in DRA_KINDS}}
    list_kind = str(document.get("kind"))
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"items[{index}] is a {type(item).__name__}; expected an object")
        kind = item.get("kind") or list_kind.removesuffix("List")
        if kind in buckets:
            buckets[kind].append(item)
    return build(
        nodes=buckets["Node"],
        pods=buckets["Pod"],
        priority_classes=buckets["PriorityClass"],
        namespaces=buckets["Namespace"],
        pod_groups=buckets["PodGroup"],
        disruption_budgets=buckets["PodDisruptionBudget"],
        names=names,
        taken_at=taken_at,
        inventory=dra.build(device_classes=buckets["DeviceClass"], slices=buckets["ResourceSlice"],
                            claims=buckets["ResourceClaim"], templates=buckets["ResourceClaimTemplate"],
                            taint_rules=buckets["DeviceTaintRule"], gpu_classes=gpu_classes,
                            served=bool(buckets["DeviceClass"] or buckets["ResourceSlice"])),
    )
