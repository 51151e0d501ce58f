"""Kubernetes' label selectors: the one matcher every caller uses (PodDisruptionBudgets, pod anti-affinity terms
and their namespace selectors, node affinity requirements, the operator's label rules). Pure.

Read in Kubernetes 1.37.2: `k8s.io/apimachinery/pkg/apis/meta/v1/helpers.go` (`LabelSelectorAsSelector`),
`k8s.io/apimachinery/pkg/labels/selector.go` (`NewRequirement`, `Requirement.Matches`) and
`k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go` (`nodeSelectorRequirementsAsSelector`):
- a LabelSelector's `matchLabels` and `matchExpressions` are ANDed; a nil selector selects nothing, one with
  neither (`{}`) selects everything;
- `matchLabels` k: v: the label exists with exactly that value (an empty value too);
- In: the label exists with one of the values; NotIn: the label is absent or has none of them; Exists /
  DoesNotExist: the label is present (an empty value is present) / absent;
- node selector requirements (node affinity, `node=True`) also take Gt / Lt: the label exists and, read as a
  64-bit decimal integer (Go's `strconv.ParseInt(s, 10, 64)`), is greater / less than the single value; a label
  or a value that is no such integer does not match (the scheduler's parser fails the requirement).

Malformed is what `NewRequirement` refuses and the API server's validation rejects: In / NotIn without values,
Exists / DoesNotExist with values, an operator it does not know (Gt / Lt in a LabelSelector), a key, value list or
requirement that is not of its type. `requirement` says None for it; a selector holding one anywhere (whatever
the order) *selects*: such a selector cannot be stored, and every caller asks in order to protect a pod or rule a
node out, where selecting is the safe error. Key and value syntax (qualified names, 63 characters) is not
checked: a label that breaks it cannot exist on an object, and a selector that does cannot be stored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# Go's strconv.ParseInt(s, 10, 64): an optional sign and ASCII digits only (no spaces, no underscores).
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_INT64 = range(-(2**63), 2**63)
NODE_ONLY = frozenset({"Gt", "Lt"})  # operators of node selector requirements only


def int64(text: str) -> int | None:
    """The text as Go's `strconv.ParseInt(text, 10, 64)` reads it, or None when that fails."""
    if not _DECIMAL.fullmatch(text):
        return None
    value = int(text)
    return value if value in _INT64 else None


def values(requirement: Mapping[str, Any]) -> list[str] | None:
    """A requirement's `values` (none: an empty list), or None when they are not a list of strings."""
    values = requirement.get("values") or []
    if type(values) is not list or not all(type(v) is str for v in values):
        return None
    return values


def requirement(requirement: Any, labels: Mapping[str, str], *, node: bool = False) -> bool | None:
    """Whether the labels meet one requirement (`key`, `operator`, `values`): True, False, or None when it is
    malformed (see the module). `node`: a node selector requirement, which may also be Gt / Lt."""
    if not isinstance(requirement, Mapping):
        return None
    key, operator, wanted = requirement.get("key"), requirement.get("operator"), values(requirement)
    if type(key) is not str or wanted is None:
        return None
    label = labels.get(key)
    if operator == "In":
        return label in wanted if wanted else None
    if operator == "NotIn":
        return label not in wanted if wanted else None
    if operator == "Exists":
        return label is not None if not wanted else None
    if operator == "DoesNotExist":
        return label is None if not wanted else None
    if node and operator in NODE_ONLY:
        if len(wanted) != 1:
            return None
        bound = int64(wanted[0])
        have = None if label is None else int64(label)
        if bound is None or have is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return None


def has_labels(wanted: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """`matchLabels` (and a nodeSelector, and the operator's label rules): every wanted label, with its value."""
    return all(labels.get(key) == value for key, value in wanted.items())


def matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a metav1 LabelSelector selects these labels (None: nothing; `{}`: everything; malformed: selects)."""
    return compile_selector(selector)(labels)


def compile_selector(selector: Any) -> Callable[[Mapping[str, str]], bool]:
    """`matches` for one selector, read once: for callers that try it on many pods."""
    if selector is None:
        return _nothing
    if not isinstance(selector, Mapping):
        return _everything
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or type(expressions) is not list:
        return _everything
    if not all(type(v) is str for v in match_labels.values()):
        return _everything
    if any(requirement(r, {}) is None for r in expressions):  # malformed whatever the labels: refused as a whole
        return _everything
    wanted = tuple(match_labels.items())
    tests = tuple(map(_compiled, expressions))
    return lambda labels: (all(labels.get(key) == value for key, value in wanted)
                           and all(test(labels) for test in tests))


def _compiled(requirement: Mapping[str, Any]) -> Callable[[Mapping[str, str]], bool]:
    """A well-formed label selector requirement as a predicate (`requirement`'s answer)."""
    key, operator, wanted = requirement["key"], requirement["operator"], frozenset(values(requirement) or ())
    if operator == "In":
        return lambda labels: labels.get(key) in wanted
    if operator == "NotIn":
        return lambda labels: labels.get(key) not in wanted
    if operator == "Exists":
        return lambda labels: key in labels
    return lambda labels: key not in labels  # DoesNotExist: the only other well-formed operator


def _nothing(labels: Mapping[str, str]) -> bool:
    return False


def _everything(labels: Mapping[str, str]) -> bool:
    return True
