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

Pure: `snapshot.build` resolves each term once (`resolve`), and attaches to each node the terms whose
topology holds it; `refusing` answers for a candidate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

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
    named = term.get("namespaces") or []
    selector = term.get("namespaceSelector")
    concerned = {str(n) for n in named} if type(named) is list else set()
    if not concerned and selector is None:
        concerned = {owner_namespace}
    if selector is not None:
        concerned |= {name for name, labels in namespaces.items() if label_selectors.matches(selector, labels)}
    return Term(owner, key, node_labels[key], frozenset(concerned), term.get("labelSelector"))


def refusing(terms: Sequence[Term], *, namespace: str, labels: Mapping[str, str]) -> Term | None:
    """The first term (of those attached to a node) that rules out a pod with this namespace and labels."""
    for term in terms:
        if namespace in term.namespaces and label_selectors.matches(term.selector, labels):
            return term
    return None
