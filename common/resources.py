"""Resource requests and allocatable amounts as kube-scheduler's NodeResourcesFit filter counts them.

Read in Kubernetes 1.37.2: `pkg/scheduler/framework/plugins/noderesources/fit.go` (`fitsRequest`),
`k8s.io/component-helpers/resource/helpers.go` (`PodRequests`) and apimachinery's `resource.Quantity`:
- a pod's request is the sum over its containers plus its restartable (sidecar) init containers, or the
  peak of any one init container run (with the sidecars started before it) if larger, plus
  `spec.overhead`; pod-level `spec.resources.requests` (PodLevelResources) replace cpu and memory;
- a container's requests default to its limits (the API server's defaulting, done before admission);
- cpu counts in millicores (rounded up), everything else in whole units (rounded up);
- a node offers `status.allocatable` (else capacity), including how many pods it may run (`pods`).

Pure: plain dicts in, plain integers out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
# The resources a pod-level `spec.resources` may set (the rest stay per container).
POD_LEVEL = frozenset({CPU, MEMORY})

Vector = Mapping[str, int]  # resource name -> amount (cpu in millicores)

_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE]?)$")
_SUFFIX = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


class QuantityError(ValueError):
    """A resource quantity the API server would not have accepted."""


def parse(value: Any, *, resource: str) -> int:
    """One quantity in the unit the scheduler compares: millicores for cpu, whole units (rounded up) else."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{resource}: {text!r} is not a Kubernetes quantity")
    number, suffix = match.groups()
    amount = Fraction(number)
    if suffix[:1] in ("e", "E"):
        amount *= Fraction(10) ** int(suffix[1:])
    else:
        amount *= _SUFFIX[suffix]
    if amount < 0:
        raise QuantityError(f"{resource}: {text!r} is negative")
    return math.ceil(amount * 1000) if resource == CPU else math.ceil(amount)


def _vector(resources: Any, *, where: str) -> dict[str, int]:
    if not resources:
        return {}
    if not isinstance(resources, Mapping):
        raise QuantityError(f"{where}: not a mapping of resources")
    return {str(name): parse(amount, resource=str(name)) for name, amount in resources.items()}


def add(*vectors: Vector) -> dict[str, int]:
    total: dict[str, int] = {}
    for vector in vectors:
        for name, amount in vector.items():
            total[name] = total.get(name, 0) + amount
    return total


def subtract(a: Vector, b: Vector) -> dict[str, int]:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0) - amount
    return out


def _peak(a: Vector, b: Vector) -> dict[str, int]:
    return {name: max(a.get(name, 0), b.get(name, 0)) for name in {*a, *b}}


def _container(container: Mapping[str, Any], where: str) -> dict[str, int]:
    resources = container.get("resources") or {}
    limits = _vector(resources.get("limits"), where=f"{where} limits")
    requests = _vector(resources.get("requests"), where=f"{where} requests")
    return {**limits, **requests}  # a request defaults to its limit


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's request vector as the scheduler's fit filter sees it (without the pod slot itself).
    Raises QuantityError for a quantity the API server would reject."""
    spec = pod.get("spec") or {}
    containers = add(*(_container(c, "container") for c in spec.get("containers") or ()))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in spec.get("initContainers") or ():
        request = _container(container, "initContainer")
        if container.get("restartPolicy") == "Always":
            sidecars = add(sidecars, request)
        else:
            init_peak = _peak(init_peak, add(sidecars, request))
    total = _peak(add(containers, sidecars), init_peak)
    pod_level = _vector((spec.get("resources") or {}).get("requests"), where="pod resources requests")
    total.update({name: amount for name, amount in pod_level.items() if name in POD_LEVEL})
    total = add(total, _vector(spec.get("overhead"), where="pod overhead"))
    return {name: amount for name, amount in total.items() if amount}


def node_allocatable(node: Mapping[str, Any]) -> dict[str, int]:
    """What the node offers (allocatable, else capacity); a malformed entry counts as none of that resource."""
    status = node.get("status") or {}
    offered = status.get("allocatable") or status.get("capacity") or {}
    out: dict[str, int] = {}
    if isinstance(offered, Mapping):
        for name, amount in offered.items():
            try:
                out[str(name)] = parse(amount, resource=str(name))
            except QuantityError:
                continue
    return out


def shortages(request: Vector, free: Vector) -> list[str]:
    """The scheduler's "Insufficient <resource>" reasons for a request against what a node has free
    (the pod slot included: a request always takes one `pods`)."""
    out = []
    if free.get(PODS, 0) < 1:
        out.append("Too many pods")
    for name in sorted(request):
        if request[name] > 0 and request[name] > free.get(name, 0):
            out.append(f"Insufficient {name}")
    return out


def describe(vector: Vector, names: Iterable[str]) -> str:
    return ", ".join(f"{name}={vector.get(name, 0)}" for name in names)


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the capacity model reads of a pod that is no GPU pod or gang member: enough to count what it
    holds on its node (requests, node, nomination, phase, deletion), how it rules newcomers out there (its
    host ports, its required pod anti-affinity) and how newcomers' own anti-affinity selects it (its labels), so
    stores of every bound pod stay small."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}

    def resources_only(containers: Any) -> list[dict[str, Any]]:
        out = []
        for c in containers or ():
            if not isinstance(c, Mapping):
                continue
            kept = {k: c[k] for k in ("resources", "restartPolicy") if k in c}
            ports = [p for p in c.get("ports") or () if isinstance(p, Mapping) and p.get("hostPort")]
            out.append({**kept, "ports": ports} if ports else kept)
        return out

    affinity = spec.get("affinity") or {}
    anti = (affinity.get("podAntiAffinity") or {}) if isinstance(affinity, Mapping) else {}
    required = anti.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(anti, Mapping) else None
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp",
                                          "creationTimestamp", "labels") if k in meta},
        "spec": {
            **{k: spec[k] for k in ("nodeName", "priority", "overhead", "resources") if k in spec},
            "containers": resources_only(spec.get("containers")),
            "initContainers": resources_only(spec.get("initContainers")),
            **({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}
               if required else {}),
        },
        "status": {k: status[k] for k in ("phase", "nominatedNodeName") if k in status},
    }
