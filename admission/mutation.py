"""The admission engine: one pure function from an admission request's pod to a patch and its reasons.

No I/O, no clock: the HTTP shell (`admission.server`) passes the snapshot and `now`. The pod is
mutated as a working copy of the raw request object and the patch is the diff of the two over the
fields we own (`admission.patches`), so fields we do not model are never touched. A pod that
already carries our decision record is left alone, which makes admission idempotent (reinvocation,
retries).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from admission import affinity, gating, patches, scoring, tiers
from common import domain_claim, gpu, label_values, resources, settings, snapshot

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclasses.dataclass(frozen=True)
class Outcome:
    patch: list[dict[str, Any]]  # RFC 6902 operations; empty => nothing to change
    changes: tuple[str, ...]  # kinds of mutation made: tier, affinity-preferred, gate, domain-claim, decision
    record: str  # the decision record (also written to the decision annotation when anything changed)
    warnings: tuple[str, ...]  # returned to the client as AdmissionResponse warnings
    skipped: str | None  # why the pod was left alone entirely (None: it was considered)
    tier: str | None = None
    gated: bool = False
    release: gating.Release | None = None  # governed single pods: gated for release, or not (controller down)


def _skip(reason: str, *warnings: str) -> Outcome:
    return Outcome(patch=[], changes=(), record=reason, warnings=tuple(warnings), skipped=reason)


def _why_skip(
    *, operation: str, namespace: str, pod: Mapping[str, Any], config: settings.Settings
) -> str | None:
    if operation != "CREATE":
        return f"operation {operation} is never mutated"
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror pod"
    if namespace in config.admission.excluded_namespaces:
        return f"namespace {namespace} is excluded"
    skip = label_values.flag(label_values.value(meta, config.names.skip), key=config.names.skip)
    if skip.value:
        return f"opted out with {config.names.skip}" + (f" ({skip.problem})" if skip.problem else "")
    if config.names.decision in (meta.get("annotations") or {}):
        return "already mutated (decision record present)"
    return None


def decide(
    *,
    operation: str,
    namespace: str | None,
    pod: Mapping[str, Any],
    cluster: snapshot.Snapshot,
    config: settings.Settings,
    now: float,
    controller_seen_at: float | None = None,
    request_uid: str = "",
) -> Outcome:
    """`controller_seen_at`: when the descheduler's leader Lease was last seen renewed, on the same clock as `now`
    (None: not seen; no pod is then gated for release). `request_uid`: the admission request's uid, which names a
    claim of the pod's own (`common.domain_claim`; "": none is made)."""
    # kube-apiserver sends decoded Pods; anything else is left alone (a patch into it might not apply).
    if not isinstance(pod, Mapping) or not all(isinstance(pod.get(k), Mapping) for k in ("metadata", "spec")):
        return _skip("request object is not a pod with metadata and a spec",
                     "gpu-steward: could not read the pod; unchanged")
    ns = namespace or (pod.get("metadata") or {}).get("namespace") or "default"
    skip = _why_skip(operation=operation, namespace=ns, pod=pod, config=config)
    if skip:
        return _skip(skip)
    try:
        gpu.pod_request(pod)
    except gpu.QuantityError as exc:
        return _skip(f"unreadable GPU request: {exc}", f"gpu-steward: {exc}; pod unchanged")
    try:
        # DRA GPUs (resource claims of a GPU DeviceClass) count as whole GPUs (`snapshot.gpu_requests`).
        request, requests, claims = snapshot.gpu_requests(pod, cluster.dra, names=config.names)
    except resources.QuantityError as exc:  # the API server rejects it after admission anyway
        return _skip(f"unreadable resource request: {exc}", f"gpu-steward: {exc}; pod unchanged")
    gpu_pod = request.any or claims.any
    warnings: list[str] = []
    mode = (_placement_mode(pod.get("metadata") or {}, config, warnings) if gpu_pod
            else config.admission.default_placement)
    lease = config.descheduler.leader_election
    controller = gating.Controller(seen_at=controller_seen_at, lease=f"{lease.lease_namespace}/{lease.lease_name}")
    gate = gating.decide(pod=pod, request=request, placement=mode, controller=controller, config=config, now=now,
                         pod_groups=cluster.pod_groups, claims=claims)
    if not gpu_pod and not gate.add:
        # Without GPUs only a gang member we gate changes: any other mutation here would reach every pod.
        why = "requests no GPU" if gate.gang is None else f"requests no GPU; {gate.reason}"
        warned = (f"gpu-steward: {gate.warning}",) if gate.warning else ()
        return _skip(why, *warned)

    mutated = patches.working_copy(pod)
    changes: list[str] = []
    notes: list[str] = [f"{request.describe()}"]
    if claims.count or claims.left:
        notes.append(f"{claims.count} of them through resource claims" if not claims.left
                     else f"resource claims left to kube-scheduler: {claims.left}")

    tier_name = None
    if gpu_pod:
        tier_name = _apply_tier(mutated, ns=ns, cluster=cluster, config=config, notes=notes, warnings=warnings,
                                changes=changes)
    if claims.left:  # its GPUs cannot be told: no ranking, no gate for placement
        notes.append("placement: none, kube-scheduler places a pod whose claims the model cannot evaluate")
    elif request.any:
        _apply_placement(mutated, request=request, requests=requests, mode=mode, gate=gate, cluster=cluster,
                         config=config, now=now, notes=notes, warnings=warnings, changes=changes)
    else:
        # Tiers carry GPU reclaim policies and GPU preemption; the pod holds no GPU: it only starts with its gang.
        notes.append("no tier, no NVLink affinity: a gang member without GPUs only waits for its gang")
    if gate.add:
        mutated["spec"]["schedulingGates"] = [*(pod["spec"].get("schedulingGates") or []), {"name": config.names.gate}]
        changes.append("gate")
    notes.append(f"gate {config.names.gate} {'added' if gate.add else 'not added'}: {gate.reason}")
    if claims.count:
        sizes = [len(d) for n in cluster.nodes.values() for d in n.topology.domains]
        own = domain_claim.plan(pod=pod, namespace=ns, inventory=cluster.dra, claims=claims,
                                extended_gpus=request.full - claims.count, for_release=gate.for_release,
                                enabled=config.dra.domain_claims, domain_sizes=sizes, request_uid=request_uid)
        if own.record is not None:
            domain_claim.rewrite(mutated, record=own.record, annotation=config.names.domain_claim)
            changes.append("domain-claim")
        notes.append(f"one-domain claim: {own.reason}")
    # A snapshot never synced does not know which PodGroup API is served: no PodGroup named.
    served = cluster.pod_groups.version if cluster.taken_at is not None else None
    if pod_group := gating.native_binding(mutated, gate=gate, config=config, served=served):
        mutated["spec"]["schedulingGroup"] = {"podGroupName": pod_group}
        changes.append("pod-group")
        notes.append(f"PodGroup {pod_group}: made at release, kube-scheduler binds the gang all-or-nothing")
    if gate.warning:
        warnings.append(gate.warning)

    record = "; ".join(notes)
    annotations = mutated["metadata"].get("annotations") or {}
    mutated["metadata"]["annotations"] = {**annotations, config.names.decision: record}
    changes.append("decision")
    return Outcome(
        patch=patches.diff(pod, mutated),
        changes=tuple(changes),
        record=record,
        warnings=tuple(f"gpu-steward: {w}" for w in warnings),
        skipped=None,
        tier=tier_name,
        gated=gate.add,
        release=gate.release,
    )


def _apply_tier(
    mutated: dict[str, Any],
    *,
    ns: str,
    cluster: snapshot.Snapshot,
    config: settings.Settings,
    notes: list[str],
    warnings: list[str],
    changes: list[str],
) -> str | None:
    choice = tiers.decide(pod=mutated, namespace=ns, namespace_labels=cluster.namespaces.get(ns, {}),
                          priority_classes=cluster.priority_classes, tiers=config.tiers, names=config.names)
    warnings.extend(choice.warnings)
    tier = choice.tier.value if choice.tier else None
    if choice.keep_user_class or choice.tier is None:
        notes.append(f"tier {tier or 'none'}: {choice.reason}")
        return tier
    wanted = config.tiers.for_tier(choice.tier).name
    existing = cluster.priority_classes.get(wanted)
    if existing is None:
        # Setting a class the API server does not know would make it reject the pod.
        warnings.append(f"PriorityClass {wanted} for tier {tier} does not exist; priority left unchanged")
        notes.append(f"tier {tier}: {choice.reason}; class {wanted} missing, not applied")
        return tier
    spec = mutated["spec"]
    spec["priorityClassName"] = existing.name
    # The Priority admission plugin rejects a class whose value/policy the pod contradicts.
    spec["priority"] = existing.value
    spec["preemptionPolicy"] = existing.preemption_policy
    changes.append("tier")
    notes.append(f"tier {tier}: {choice.reason}; class {existing.name} (priority {existing.value}, "
                 f"{existing.preemption_policy})")
    return tier


def _placement_mode(meta: Mapping[str, Any], config: settings.Settings, warnings: list[str]) -> settings.Placement:
    key = config.names.placement
    mode = label_values.choice(label_values.value(meta, key), settings.Placement, key=key,
                              default=config.admission.default_placement)
    if mode.problem:
        warnings.append(mode.problem)
    return mode.value


def _apply_placement(
    mutated: dict[str, Any],
    *,
    request: gpu.GpuRequest,
    requests: Mapping[str, int],
    mode: settings.Placement,
    gate: gating.GateDecision,
    cluster: snapshot.Snapshot,
    config: settings.Settings,
    now: float,
    notes: list[str],
    warnings: list[str],
    changes: list[str],
) -> None:
    """Preferred terms for the best-scored nodes, never a required term (see `admission.affinity`)."""
    if mode is settings.Placement.OFF:
        notes.append("placement off")
        return
    if request.full == 0:
        notes.append("placement: MIG slices only, NVLink domains do not apply")
        return
    node_name = mutated["spec"].get("nodeName")
    if node_name:
        notes.append(f"placement: none, the pod names its node ({node_name})")
        return
    if gate.for_release:
        notes.append(f"placement {mode.value}: at release, no preferred terms")
        return
    age = cluster.age(now)
    if age is None or age > config.admission.max_snapshot_age_seconds:
        known = "never synced" if age is None else f"{age:.0f}s old"
        warnings.append(f"cluster snapshot {known}; NVLink affinity not added")
        notes.append(f"placement skipped: snapshot {known}")
        return

    parts = [f"placement {mode.value}"]
    # Ranked against the spec as the scheduler will see it, so that no preferred term goes to a node the
    # pod's own selectors, tolerations or required affinity rule out.
    ranking = scoring.rank(gpus=request.full, pod_spec=mutated["spec"], cluster=cluster, cfg=config.scoring,
                           limit=config.admission.preferred_terms, requests=requests)
    terms = affinity.preferred_terms(ranking.scores, config.admission.preferred_terms)
    if affinity.add_preferred(mutated, terms):
        changes.append("affinity-preferred")
        best = ", ".join(f"{s.node}={s.score:g}->{s.normalized}" for s in ranking.scores[: len(terms)])
        parts.append(f"preferred {best}")
    else:
        why = f"no node can take {request.full} GPUs now"
        if ranking.excluded:  # nodes with room the pod may not use (taints, nodeSelector, required affinity)
            name, reason = next(iter(ranking.excluded.items()))
            why += f" ({len(ranking.excluded)} with room ruled out, e.g. {name}: {reason})"
        parts.append(why)
    notes.append("; ".join(parts))
