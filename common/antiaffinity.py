"""Existing pods' required anti-affinity: the half of kube-scheduler's InterPodAffinity filter that a pod
cannot see in its own spec (a pod already on a node refuses newcomers whose labels its terms select).

Read in Kubernetes 1.37.2: `pkg/scheduler/framework/plugins/interpodaffinity/filtering.go`
(`getExistingAntiAffinityCounts`, `satisfyExistingPodsAntiAffinity`) and `k8s.io/kube-scheduler/framework`
`types.go` (`newAffinityTerm`, `getNamespacesFromPodAffinityTerm`, `AffinityTerm.Matches`):
- every pod the scheduler counts on a node contributes its
  `podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution` terms;
- a term concerns the namespaces it names (`namespaces`), or its own pod's namespace when it names none and
  has no `namespaceSelector`, plus those its `namespaceSelector` selects (an empty selector: every namespace);
- it rules out a candidate pod in such a namespace whose labels its `labelSelector` selects (none: no pod;
  an empty selector: every pod; `common.label_selectors.matches`);
- within its topology: every node whose label `topologyKey` has the value the term's own node has. A term
  whose node lacks that label rules out nothing, and a node without it is never ruled out by it. For
  `kubernetes.io/hostname` that is the node itself (hostnames are unique; the scheduler's fast path then reads
  only that node's pods).

Pure: `snapshot_build.build` resolves each term once (`resolve`), and attaches to each node the terms whose
topology holds it; `refusing` answers for a candidate.

The other half, a pod's own required anti-affinity (`satisfyPodAntiAffinity`, `getIncomingAffinityAntiAffinityCounts`
in the same file): each of its terms concerns namespaces as above (its own pod's namespace by default; the scheduler
merges the `namespaceSelector`'s namespaces into the named ones) and counts, per value of its `topologyKey`, the pods
holding a node with that value whose labels its `labelSelector` selects (`occupied`, over `Resident`s: every pod
holding a node, GPU or not). A candidate node whose label has a counted value is ruled out; a node without the label
never is (`refused_by`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from common import label_selectors


@dataclasses.dataclass(frozen=True)
class Term:
    """One required anti-affinity term of a pod holding a node, resolved against the cluster it was seen in."""

    owner: str  # namespace/name of the pod that carries it
    topology_key: str
    topology_value: str  # the value of `topology_key` on the owner's node
    namespaces: frozenset[str]  # the namespaces it concerns (selector resolved against the known namespaces)
    selector: Any  # the term's labelSelector as written (None: selects no pod)

    def describe(self) -> str:
        return (f"pod {self.owner} has required anti-affinity against it "
                f"(topologyKey {self.topology_key}={self.topology_value})")


def required_terms(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The pod's required anti-affinity terms as written (empty for most pods)."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    anti = affinity.get("podAntiAffinity") if isinstance(affinity, Mapping) else None
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(anti, Mapping) else None
    if type(terms) is not list:
        return ()
    return tuple(t for t in terms if isinstance(t, Mapping))


def resolve(term: Mapping[str, Any], *, owner: str, owner_namespace: str, node_labels: Mapping[str, str],
            namespaces: Mapping[str, Mapping[str, str]]) -> Term | None:
    """The term as it stands in this cluster (`namespaces`: every namespace's labels), or None when it can
    rule out no node (its owner's node lacks the topology label)."""
    key = term.get("topologyKey")
    if type(key) is not str or key not in node_labels:
        return None
    return Term(owner, key, node_labels[key], _concerned(term, owner_namespace, namespaces), term.get("labelSelector"))


def _concerned(term: Mapping[str, Any], owner_namespace: str, namespaces: Mapping[str, Mapping[str, str]],
               ) -> frozenset[str]:
    """The namespaces a term concerns: those it names and those its namespaceSelector selects; its own pod's
    namespace when it has neither."""
    named = term.get("namespaces") or []
    selector = term.get("namespaceSelector")
    concerned = {str(n) for n in named} if type(named) is list else set()
    if not concerned and selector is None:
        concerned = {owner_namespace}
    if selector is not None:
        concerned |= {name for name, labels in namespaces.items() if label_selectors.matches(selector, labels)}
    return frozenset(concerned)


def refusing(terms: Sequence[Term], *, namespace: str, labels: Mapping[str, str]) -> Term | None:
    """The first term (of those attached to a node) that rules out a pod with this namespace and labels."""
    for term in terms:
        if namespace in term.namespaces and label_selectors.matches(term.selector, labels):
            return term
    return None


# --- a pod's own required anti-affinity ------------------------------------------------------------------------


class Resident(NamedTuple):
    """A pod holding a node (bound, nominated, or pinned and released), as others' terms select it (a tuple: a
    cluster has one per pod)."""

    key: str  # namespace/name
    namespace: str
    labels: Mapping[str, str]
    node_labels: Mapping[str, str]  # of the node it holds


@dataclasses.dataclass(frozen=True)
class Occupied:
    """One required anti-affinity term of a pod to be placed, resolved against the pods holding nodes: the values
    of its topology key where a pod it selects is, each with the first such pod (by key) for the reason."""

    topology_key: str
    holders: Mapping[str, str]  # topology value -> key of a pod the term selects there

    def refuses(self, node_labels: Mapping[str, str]) -> str | None:
        value = node_labels.get(self.topology_key)
        holder = None if value is None else self.holders.get(value)
        if holder is None:
            return None
        return f"its required anti-affinity selects pod {holder} (topologyKey {self.topology_key}={value})"


def occupied(pod: Mapping[str, Any], *, residents: Sequence[Resident],
             namespaces: Mapping[str, Mapping[str, str]]) -> tuple[Occupied, ...]:
    """The pod's own required anti-affinity terms, each resolved against `residents` (in key order: the first
    selected pod per topology value is the one a reason names) and `namespaces` (every namespace's labels)."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    out = []
    for term in required_terms(pod):
        key = term.get("topologyKey")
        if type(key) is not str:
            continue  # the API server rejects a term without one: no pod carries it
        concerned, selects = _concerned(term, namespace, namespaces), label_selectors.compile_selector(
            term.get("labelSelector"))
        holders: dict[str, str] = {}
        for resident in residents:
            value = resident.node_labels.get(key)
            if (value is not None and value not in holders and resident.namespace in concerned
                    and selects(resident.labels)):
                holders[value] = resident.key
        out.append(Occupied(key, holders))
    return tuple(out)


def refused_by(terms: Sequence[Occupied], node_labels: Mapping[str, str]) -> str | None:
    """Why a node with these labels is ruled out by the pod's own resolved terms (None: it is not)."""
    for term in terms:
        why = term.refuses(node_labels)
        if why:
            return why
    return None
