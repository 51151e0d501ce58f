"""Could this pod run on this node at all? The scheduler's filters that matter for GPU choice and read only
the pod and the node: node readiness, taints and tolerations, nodeSelector and the pod's required node affinity
(not free GPUs or other resources: `common.capacity` counts those). Callers use it to avoid spending preferred
terms (or plans) on nodes that can never take the pod.

Required node affinity follows kube-scheduler's NodeAffinity filter (read in Kubernetes 1.36.3:
`k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go`,
and the API server's `ValidateNodeSelector` in `pkg/apis/core/validation/validation.go`):
- nodeSelectorTerms are ORed; the matchExpressions and matchFields of one term are ANDed;
- a term with neither matches no node, and a required affinity without terms matches no node;
- matchExpressions: In, NotIn, Exists, DoesNotExist, Gt, Lt as `common.label_selectors.requirement` reads them;
- matchFields: only `metadata.name`, with In or NotIn and exactly one value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from common import label_selectors, snapshot

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
NAME_FIELD = "metadata.name"  # the one node field matchFields may name


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if not key:  # empty key with Exists tolerates everything
            if toleration.get("operator") == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists":
            return True
        if (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


# --- required node affinity ----------------------------------------------------------------------

# A requirement's outcome: True (met), False (not met) or None: malformed in a way the API server
# rejects (unknown operator, wrong number of values, a field other than metadata.name). Such a pod is
# never created (the webhook runs before validation), so what we answer cannot matter to the scheduler;
# we exclude no node for it rather than guess (an operator unknown to us may be known to a newer
# Kubernetes). Not so a Gt/Lt value that is no integer: validation only counts the values, so the pod
# is created, and the scheduler's parser then fails the whole term, which matches no node: so do we.
_Met = bool | None


def _field_requirement(requirement: Mapping[str, Any], node_name: str) -> _Met:
    operator, values = requirement.get("operator"), label_selectors.values(requirement)
    if requirement.get("key") != NAME_FIELD or values is None or len(values) != 1:
        return None
    if operator == "In":
        return node_name == values[0]
    if operator == "NotIn":
        return node_name != values[0]
    return None


def _describe(requirement: Mapping[str, Any]) -> str:
    values = requirement.get("values")
    shown = f" [{', '.join(map(str, values))}]" if isinstance(values, list) and values else ""
    note = ""
    if requirement.get("operator") in ("Gt", "Lt") and isinstance(values, list) and values:
        note = "" if label_selectors.int64(str(values[0])) is not None else " (not an integer)"
    return f"{requirement.get('key')} {requirement.get('operator')}{shown}{note}"


def _term(term: Any, node: snapshot.Node) -> Literal[True] | str | None:
    """True if the term matches the node, None if it is malformed, else its first unmet requirement."""
    if not isinstance(term, Mapping):
        return None
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if type(expressions) is not list or type(fields) is not list:
        return None
    if not expressions and not fields:
        return "no requirements"  # an empty term selects no node
    # Every requirement is looked at (no early exit on the first unmet one), so that whether a term is
    # malformed does not depend on the order of its requirements.
    unmet: str | None = None
    for requirement, on_field in [*((r, False) for r in expressions), *((r, True) for r in fields)]:
        if not isinstance(requirement, Mapping):
            return None
        met = (_field_requirement(requirement, node.name) if on_field
               else label_selectors.requirement(requirement, node.labels, node=True))
        if met is None:
            return None
        if not met and unmet is None:
            unmet = _describe(requirement)
    return True if unmet is None else unmet


def _affinity_why_not(pod_spec: Mapping[str, Any], node: snapshot.Node) -> str | None:
    """None when the pod's required node affinity admits the node (or has none, or is malformed), else why not."""
    affinity = pod_spec.get("affinity")
    if not affinity:
        return None
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    if not node_affinity:
        return None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(
        node_affinity, Mapping) else None
    if required is None:
        return None
    if not isinstance(required, Mapping):
        return None  # malformed: see _Met
    terms = required.get("nodeSelectorTerms") or []
    if type(terms) is not list:
        return None
    if not terms:
        return "required node affinity has no nodeSelectorTerms"  # the scheduler's rule; validation rejects it too
    unmet: list[str] = []
    malformed = False
    for index, term in enumerate(terms, 1):
        met = _term(term, node)
        if met is True:
            return None
        if met is None:
            malformed = True
        else:
            unmet.append(f"term {index}: {met}")
    if malformed:
        return None
    return f"required node affinity does not match ({'; '.join(unmet)})"


def why_not(pod_spec: Mapping[str, Any], node: snapshot.Node) -> str | None:
    """None when the pod may go to the node (ignoring GPU counts), else the reason it may not."""
    if not node.schedulable:
        return "node not ready or cordoned"
    tolerations = pod_spec.get("tolerations") or []
    for taint in node.taints:
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerates(tolerations, taint):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    return _affinity_why_not(pod_spec, node)


# --- cache keys ------------------------------------------------------------------------------------


def _frozen(value: Any) -> Any:
    """JSON data as a hashable value of the same shape (a dict never equals a list of pairs)."""
    kind = type(value)
    if kind is dict:
        return frozenset([(k, v if type(v) is str else _frozen(v)) for k, v in value.items()])
    if kind is list:
        return tuple([v if type(v) is str else _frozen(v) for v in value])
    return value


_ODD_SHAPE = object()  # tags keys of affinities not in the API server's shape (never equal to a usual key)


def _requirements_key(requirements: Any) -> tuple[Any, ...] | None:
    """(key, operator, values) of each requirement, as `why_not` reads them; None when not in the usual shape."""
    if requirements is None:
        return ()
    if type(requirements) is not list:
        return None
    out = []
    for requirement in requirements:
        if type(requirement) is not dict:
            return None
        values = requirement.get("values")
        if type(values) is list:
            values = tuple(values)
        elif values is None:
            values = ()  # `why_not` reads a missing list as an empty one
        else:
            return None
        out.append((requirement.get("key"), requirement.get("operator"), values))
    return tuple(out)


def _required_affinity_key(required: Any) -> Any:
    """What `why_not` reads of the required node affinity, hashable. Pods often carry one in the usual shape (a
    node pool, our release pin), so that shape takes a fast path; any other is frozen whole."""
    if required is None:
        return None
    if type(required) is dict and type(terms := required.get("nodeSelectorTerms")) is list:
        key = []
        for term in terms:
            if type(term) is not dict:
                break
            expressions = _requirements_key(term.get("matchExpressions"))
            fields = _requirements_key(term.get("matchFields"))
            if expressions is None or fields is None:
                break
            key.append((expressions, fields))
        else:
            return tuple(key)
    return _ODD_SHAPE, _frozen(required)


def key(pod_spec: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What `why_not` reads of the pod, hashable, for caches of its answers: pods with equal keys fit the same
    nodes. None when the spec holds something unhashable (then do not cache). Keep it in step with `why_not`."""
    try:
        tolerations = tuple(tuple(sorted(t.items())) for t in pod_spec.get("tolerations") or ())
        selector = tuple(sorted((pod_spec.get("nodeSelector") or {}).items()))
        node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
        required = _required_affinity_key(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
        hash((tolerations, selector, required))
    except (AttributeError, TypeError):
        return None
    return tolerations, selector, required
