"""A claim of the pod's own that keeps its DRA GPUs in one NVLink domain (`dra.domain_claims`, default off).

kube-scheduler's allocator gives a claim the first free devices in the slice's order, whatever NVLink domains they
are in (docs/placement.md); only the claim's spec can keep them in one domain, and a claim's spec cannot change once
it exists. So, for a pod we place at release:

- at CREATE the webhook (no API call) rewrites the pod's one GPU claim entry from `resourceClaimTemplateName: T` to
  `resourceClaimName: <pod-specific name>` (`spec.resourceClaims` cannot change later) and records the entry, the
  claim's name and T in the annotation `<prefix>domain-claim` (`Record`); `plan` says which pods and why not;
- whatever lifts our gate first creates that claim (`common.claims.ensure`), owned by the pod (deleted with it by
  garbage collection), from T's spec (`body`): release with `firstAvailable: [the planned domain's devices, T's
  request]` (the allocator takes the domain when it is free and falls back to what the pod would have got without
  us), every other lifter with T's request alone. A claim already there is used as it is when it is ours (a
  restart between its creation and the un-gating); one with another owner is not touched (`judge`).

Which pods (`plan`): gated by us for release, asking 2 or more GPUs through exactly one claim entry, a template
whose one request is `exactly` a configured GPU class, `ExactCount`, no selectors, constraints, `firstAvailable`,
`adminAccess` or `All` (what the capacity model counts and a sub-request can copy), GPUs no extended resource also
asks (its claim is kube-scheduler's), and fitting one NVLink domain of some node. The claim's name is the pod's name
(or its `generateName`: a pod made from one has no name yet at admission), the entry's name and 8 hex digits of the
admission request's uid, unique per request, so a Job's re-created pod never meets its predecessor's claim.

Pure: plain dicts in, plain dicts out; no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from common import dra

API_VERSION = "resource.k8s.io/v1"
DOMAIN, ANY = "domain", "any"  # the sub-requests of a release's claim
MAX_NAME = 253


@dataclasses.dataclass(frozen=True)
class Plan:
    record: dra.Record | None  # None: the pod keeps its claim entry
    reason: str


@dataclasses.dataclass(frozen=True)
class Domain:
    """The planned NVLink domain: its GPUs' `index` values on the node, published by `driver`."""

    driver: str
    indices: tuple[int, ...]

    def selector(self) -> str:
        return f"device.attributes['{self.driver}'].index in [{', '.join(map(str, self.indices))}]"


def claim_name(pod: Mapping[str, Any], *, entry: str, request_uid: str) -> str:
    """`<pod name or generateName>-<entry>-<8 hex of the request uid>`, a valid object name."""
    meta = pod.get("metadata") or {}
    tail = f"-{entry}-{request_uid[:8]}"  # the uid is a UUID: 8 lower-case hex digits first
    base = str(meta.get("name") or meta.get("generateName") or "")[: MAX_NAME - len(tail)].rstrip("-.")
    return (base or "pod") + tail


def _not_copied(devices: Mapping[str, Any]) -> str | None:
    """Why the template's request cannot be copied into sub-requests, or None. Called once the model counted its GPUs
    (`dra.asked`): a request it counts is `exactly` a GPU class, ExactCount, without adminAccess."""
    requests = [r for r in devices.get("requests") or () if isinstance(r, Mapping)]
    if len(requests) != 1:
        return f"{len(requests)} requests in its template (one is rewritten)"
    if devices.get("constraints"):
        return "its template has constraints of its own"
    if requests[0]["exactly"].get("selectors"):
        return f"request {requests[0].get('name')} has selectors of its own"
    return None


def plan(
    *,
    pod: Mapping[str, Any],
    namespace: str,
    inventory: dra.Inventory,
    claims: dra.PodGpus,
    extended_gpus: int,
    for_release: bool,
    enabled: bool,
    domain_sizes: Sequence[int],
    request_uid: str,
) -> Plan:
    """Whether the webhook rewrites the pod's (in `namespace`) GPU claim entry to a claim of its own, and why (not).
    `claims`: what the DRA model makes of its claims; `extended_gpus`: GPUs it asks as extended resources;
    `for_release`: gated by us to be placed at release; `domain_sizes`: the GPU counts of the cluster's NVLink
    domains."""
    if not enabled:
        return Plan(None, "one-domain claims are off (dra.domain_claims)")
    if not for_release:
        return Plan(None, "not placed at release by us: whatever places it, not us, would choose its domain")
    if claims.left:
        return Plan(None, f"claims left to kube-scheduler ({claims.left})")
    if extended_gpus:
        return Plan(None, f"{extended_gpus} GPUs asked as an extended resource: that claim is kube-scheduler's")
    if not request_uid:
        return Plan(None, "no admission request uid to name the claim by")
    entries = [e for e in (pod.get("spec") or {}).get("resourceClaims") or () if isinstance(e, Mapping)]
    gpu_entries = []
    for entry in entries:  # a claim the pod names asks no GPUs here: the model leaves a pod naming a GPU claim
        template = inventory.templates.get(f"{namespace}/{entry.get('resourceClaimTemplateName')}")
        if template is not None and dra.asked(template, inventory.classes, "").count:
            gpu_entries.append((entry, template))
    if len(gpu_entries) != 1:
        return Plan(None, f"{len(gpu_entries)} claim entries ask GPUs (one is rewritten)")
    entry, template = gpu_entries[0]
    why = _not_copied(template)
    if why:
        return Plan(None, why)
    count = int(template["requests"][0]["exactly"].get("count") or 1)
    if count < 2:
        return Plan(None, f"{count} GPU: always in one domain")
    if not any(size >= count for size in domain_sizes):
        return Plan(None, f"{count} GPUs fit no NVLink domain of the cluster (largest {max(domain_sizes, default=0)})")
    name = str(entry.get("name") or "")
    record = dra.Record(name, claim_name(pod, entry=name, request_uid=request_uid),
                    str(entry["resourceClaimTemplateName"]))
    return Plan(record, f"claim entry {name} made claim {record.claim} of its own from template {record.template} "
                        f"({count} GPUs): release creates it for the planned NVLink domain")


def rewrite(mutated: dict[str, Any], *, record: dra.Record, annotation: str) -> None:
    """Point the pod's claim entry at its own claim and record it (on the working copy the patch is diffed from)."""
    for entry in mutated["spec"].get("resourceClaims") or ():
        if isinstance(entry, dict) and entry.get("name") == record.entry:
            entry.pop("resourceClaimTemplateName", None)
            entry["resourceClaimName"] = record.claim
    annotations = mutated["metadata"].get("annotations") or {}
    mutated["metadata"]["annotations"] = {**annotations, annotation: record.text()}


def body(*, pod: Mapping[str, Any], record: dra.Record, template: Mapping[str, Any], domain: Domain | None,
         ) -> dict[str, Any]:
    """The pod's claim: `template`'s (the raw ResourceClaimTemplate) spec, its one request turned into
    `firstAvailable: [the domain's devices, the request]` when `domain` is planned, owned by the pod."""
    meta = pod.get("metadata") or {}
    own = template.get("spec") or {}
    spec = json.loads(json.dumps(own.get("spec") or {}))
    devices = spec.setdefault("devices", {})
    if domain is not None and domain.indices:
        request = devices["requests"][0]
        exactly = request.pop("exactly")
        request["firstAvailable"] = [
            {"name": DOMAIN, **exactly, "selectors": [{"cel": {"expression": domain.selector()}}]},
            {"name": ANY, **exactly},
        ]
    labels = (own.get("metadata") or {}).get("labels")
    annotations = (own.get("metadata") or {}).get("annotations")
    return {
        "apiVersion": API_VERSION, "kind": "ResourceClaim",
        "metadata": {
            "name": record.claim, "namespace": meta.get("namespace") or "default",
            **({"labels": dict(labels)} if labels else {}),
            **({"annotations": dict(annotations)} if annotations else {}),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid"),
                                 "controller": True}],
        },
        "spec": spec,
    }


def judge(*, claim: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    """An existing claim of the pod's name: None when it is the pod's own (ours, made before a restart: used as it
    is, its spec cannot change and any version of it places the pod), else why it is not ours to use."""
    uid = (pod.get("metadata") or {}).get("uid")
    owners = (claim.get("metadata") or {}).get("ownerReferences") or ()
    if any(isinstance(o, Mapping) and o.get("kind") == "Pod" and o.get("uid") == uid for o in owners):
        return None
    named = ", ".join(f"{o.get('kind')} {o.get('name')}" for o in owners if isinstance(o, Mapping)) or "no owner"
    return (f"claim {(claim.get('metadata') or {}).get('name')} exists with {named}, not this pod: not ours, "
            "kube-scheduler allocates it as it is")
