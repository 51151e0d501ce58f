"""A claim of the pod's own that keeps its DRA GPUs in one NVLink domain (common/domain_claim.py): which pods the
webhook rewrites and why not, how the model counts a rewritten pod, and the claim whatever lifts our gate creates."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest

from admission import mutation
from common import capacity, domain_claim, dra, placement, settings, snapshot, snapshot_build
from tests import builders as b

NAMES = settings.Names()
ON = settings.Settings(dra=settings.Dra(domain_claims=True))
UID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
TWO_DOMAINS = [range(4), range(4, 8)]


def _template(name: str, **exactly: Any) -> dict[str, Any]:
    spec = b.claim_spec(exactly.pop("count", 4))
    spec["devices"]["requests"][0]["exactly"].update(exactly)
    return b.claim_template(name, spec=spec)


TEMPLATES = [
    _template("four"), _template("two", count=2), _template("one", count=1), _template("sixteen", count=16),
    b.claim_template("bare", spec={"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.nvidia.com"}}]}}),  # no count: ExactCount of 1
    b.claim_template("nics", spec=b.claim_spec(2, device_class_name="nic.example.com")),
    _template("picky", selectors=[{"cel": {"expression": "device.attributes['gpu.nvidia.com'].index < 4"}}]),
    b.claim_template("bound", spec={"devices": {**b.claim_spec(4)["devices"], "constraints": [
        {"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]}}),
    b.claim_template("all", spec=b.claim_spec(mode="All")),
    b.claim_template("admin", spec=b.claim_spec(4, admin=True)),
    b.claim_template("choice", spec={"devices": {"requests": [{"name": "gpus", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
        {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 2}]}]}}),
    b.claim_template("pair", spec={"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
        {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}),
]


def _cluster(*objects: dict[str, Any], names: settings.Names = NAMES) -> snapshot.Snapshot:
    items = [b.device_class(), *(b.dra_node(f"dra-{i}", domains=TWO_DOMAINS) for i in range(2)),
             *(b.resource_slice(f"dra-{i}", 8) for i in range(2)), *b.tier_classes(), *TEMPLATES,
             b.resource_claim("users", spec=b.claim_spec(4)),
             b.resource_claim("nic", spec=b.claim_spec(1, device_class_name="nic.example.com")), *objects]
    return snapshot_build.from_list({"kind": "List", "items": items}, names=names, taken_at=0.0)


def two_entries(body: dict[str, Any]) -> None:
    body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "two"},
                                      {"name": "more", "resourceClaimTemplateName": "two"}]


def named(body: dict[str, Any]) -> None:
    body["metadata"]["name"] = ""
    body["metadata"]["generateName"] = "train-7f9c-"


def and_nics(body: dict[str, Any]) -> None:
    body["spec"]["resourceClaims"].append({"name": "nics", "resourceClaimTemplateName": "nics"})


def no_namespace(body: dict[str, Any]) -> None:
    del body["metadata"]["namespace"]  # the request says it (`plan` is given it)


def and_a_nic(body: dict[str, Any]) -> None:
    body["spec"]["resourceClaims"].append({"name": "nic", "resourceClaimName": "nic"})


def in_team(body: dict[str, Any]) -> None:
    body["metadata"]["namespace"] = "team"


def plus_extended(body: dict[str, Any]) -> None:
    b.with_claim_template("four")(body)
    body["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "2"}


# Rows through `plan` directly: what the webhook asks once it has decided the gate.
@pytest.mark.parametrize(("mutate", "for_release", "uid", "reason"), [
    pytest.param(b.with_claim_template("picky"), True, UID, "request gpus has selectors of its own",
                 id="template-with-selectors-kept"),
    pytest.param(b.with_claim_template("bound"), True, UID, "its template has constraints of its own",
                 id="template-with-constraints-kept"),
    pytest.param(b.with_claim_template("choice"), True, UID, "claims left to kube-scheduler (claim template "
                 "default/choice request gpus: firstAvailable (the scheduler picks the alternative))",
                 id="template-with-first-available-kept"),
    pytest.param(b.with_claim_template("all"), True, UID, "claims left to kube-scheduler (claim template default/all "
                 "request gpus: allocationMode All)", id="template-all-mode-kept"),
    pytest.param(b.with_claim_template("admin"), True, UID, "claims left to kube-scheduler (claim template "
                 "default/admin request gpus: adminAccess)", id="template-admin-access-kept"),
    pytest.param(b.with_claim_template("pair"), True, UID, "2 requests in its template (one is rewritten)",
                 id="template-with-two-requests-kept"),
    pytest.param(two_entries, True, UID, "2 claim entries ask GPUs (one is rewritten)", id="two-gpu-claims-kept"),
    pytest.param(b.with_claim("users"), True, UID, "claims left to kube-scheduler (claim default/users is a "
                 "ResourceClaim of its own (it may be shared))", id="claim-the-user-named-kept"),
    pytest.param(b.with_claim_template("missing"), True, UID, "claims left to kube-scheduler (claim template "
                 "default/missing not found)", id="template-missing-at-admission-kept"),
    pytest.param(plus_extended, True, UID, "2 GPUs asked as an extended resource: that claim is kube-scheduler's",
                 id="extended-resource-gpus-too-kept"),
    pytest.param(b.with_claim_template("one"), True, UID, "1 GPU: always in one domain", id="one-gpu-kept"),
    pytest.param(b.with_claim_template("bare"), True, UID, "1 GPU: always in one domain",
                 id="no-count-is-one-gpu-kept"),
    pytest.param(b.with_claim_template("two"), True, UID, "claim entry gpus made claim p-gpus-0a1b2c3d of its own "
                 "from template two (2 GPUs): release creates it for the planned NVLink domain",
                 id="two-gpus-rewritten"),
    pytest.param(b.both(b.with_claim_template("four"), and_nics), True, UID, "claim entry gpus made claim "
                 "p-gpus-0a1b2c3d of its own from template four (4 GPUs): release creates it for the planned NVLink "
                 "domain", id="beside-a-template-of-no-gpus-rewritten"),
    pytest.param(b.both(b.with_claim_template("four"), no_namespace), True, UID, "claim entry gpus made claim "
                 "p-gpus-0a1b2c3d of its own from template four (4 GPUs): release creates it for the planned NVLink "
                 "domain", id="namespace-from-the-request-rewritten"),
    pytest.param(b.with_claim_template("sixteen"), True, UID, "16 GPUs fit no NVLink domain of the cluster "
                 "(largest 4)", id="larger-than-any-domain-kept"),
    pytest.param(b.with_claim_template("four"), False, UID, "not placed at release by us: whatever places it, not "
                 "us, would choose its domain", id="not-governed-kept"),
    pytest.param(b.with_claim_template("four"), True, "", "no admission request uid to name the claim by",
                 id="no-request-uid-kept"),
    pytest.param(b.with_claim_template("four"), True, UID, "claim entry gpus made claim p-gpus-0a1b2c3d of its own "
                 "from template four (4 GPUs): release creates it for the planned NVLink domain", id="four-rewritten"),
    pytest.param(b.both(b.with_claim_template("teams"), in_team), True, UID, "claim entry gpus made claim "
                 "p-gpus-0a1b2c3d of its own from template teams (4 GPUs): release creates it for the planned NVLink "
                 "domain", id="template-of-the-pods-namespace-rewritten"),
    pytest.param(b.both(b.with_claim_template("four"), and_a_nic), True, UID, "claim entry gpus made claim "
                 "p-gpus-0a1b2c3d of its own from template four (4 GPUs): release creates it for the planned NVLink "
                 "domain", id="beside-a-claim-of-no-gpus-rewritten"),
])
def test_plan(mutate: b.Mutator, for_release: bool, uid: str, reason: str) -> None:
    pod = b.pod("p", mutate=mutate)
    cluster = _cluster(b.claim_template("teams", namespace="team", spec=b.claim_spec(4)))
    claims = dra.pod_gpus(pod, cluster.dra, annotation=NAMES.domain_claim)
    extended = int(((pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
    namespace = pod["metadata"].get("namespace", "default")
    got = domain_claim.plan(pod=pod, namespace=namespace, inventory=cluster.dra, claims=claims,
                            extended_gpus=extended, for_release=for_release, enabled=True, domain_sizes=(4, 4),
                            request_uid=uid)
    assert (got.reason, got.record is not None) == (reason, reason.startswith("claim entry")), got


def test_plan_is_off_by_default_and_needs_a_domain() -> None:
    pod = b.pod("p", mutate=b.with_claim_template("four"))
    cluster = _cluster()
    claims = dra.pod_gpus(pod, cluster.dra, annotation=NAMES.domain_claim)
    got = [domain_claim.plan(pod=pod, namespace="default", inventory=cluster.dra, claims=claims, extended_gpus=0,
                             for_release=True, enabled=enabled, domain_sizes=sizes, request_uid=UID)
           for enabled, sizes in ((settings.Settings().dra.domain_claims, (4,)), (True, ()))]
    assert got == [domain_claim.Plan(None, "one-domain claims are off (dra.domain_claims)"),
                   domain_claim.Plan(None, "4 GPUs fit no NVLink domain of the cluster (largest 0)")]


@pytest.mark.parametrize(("meta", "name"), [
    pytest.param({"generateName": "train-7f9c-"}, "train-7f9c-gpus-0a1b2c3d",
                 id="generate-name-pod-has-no-name-at-admission"),
    pytest.param({"name": "a" * 300}, "a" * (253 - len("-gpus-0a1b2c3d")) + "-gpus-0a1b2c3d", id="long-name-cut"),
    pytest.param({}, "pod-gpus-0a1b2c3d", id="no-name-at-all"),
    pytest.param({"name": "a" * 238 + "." + "b" * 20}, "a" * 238 + "-gpus-0a1b2c3d", id="cut-at-a-dot-no-dot-left"),
])
def test_claim_name(meta: dict[str, Any], name: str) -> None:
    assert domain_claim.claim_name({"metadata": meta}, entry="gpus", request_uid=UID) == name


def test_a_jobs_recreated_pod_gets_a_claim_of_another_name() -> None:
    """A Job's pods share a generateName: the request uid tells them apart, so a new pod never meets its
    predecessor's claim (still there until garbage collection)."""
    first, second = (domain_claim.claim_name({"metadata": {"generateName": "job-"}}, entry="gpus", request_uid=u)
                     for u in (UID, "9f8e7d6c-0000-0000-0000-000000000000"))
    assert (first, second) == ("job-gpus-0a1b2c3d", "job-gpus-9f8e7d6c")


# Rows through the webhook's engine: the whole pod after its patch.
def _admitted(pod: dict[str, Any], config: settings.Settings = ON) -> tuple[mutation.Outcome, dict[str, Any]]:
    outcome = mutation.decide(operation="CREATE", namespace="default", pod=pod, cluster=_cluster(), config=config,
                              now=0.0, controller_seen_at=0.0, request_uid=UID)
    return outcome, jsonpatch.apply_patch(pod, outcome.patch)


def kueue(body: dict[str, Any]) -> None:
    b.with_claim_template("four")(body)
    body["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]


@pytest.mark.parametrize(("mutate", "config", "entry", "note"), [
    pytest.param(kueue, ON, {"name": "gpus", "resourceClaimTemplateName": "four"}, None, id="kueue-gated-pod-kept"),
    pytest.param(b.with_claim_template("four"), settings.Settings(), {"name": "gpus", "resourceClaimTemplateName":
                 "four"}, "one-domain claim: one-domain claims are off (dra.domain_claims)", id="setting-off-kept"),
    pytest.param(b.both(b.with_claim_template("four"), and_a_nic), ON, {"name": "gpus", "resourceClaimName":
                 "p-gpus-0a1b2c3d"}, "one-domain claim: claim entry gpus made claim p-gpus-0a1b2c3d",
                 id="only-the-gpu-entry-rewritten"),
    pytest.param(b.both(b.with_claim_template("four"), named), ON,
                 {"name": "gpus", "resourceClaimName": "train-7f9c-gpus-0a1b2c3d"},
                 "one-domain claim: claim entry gpus made claim train-7f9c-gpus-0a1b2c3d of its own from template four",
                 id="generate-name-pod-rewritten"),
])
def test_webhook_rewrites_the_claim_entry(mutate: b.Mutator, config: settings.Settings, entry: dict[str, Any],
                                          note: str | None) -> None:
    pod = b.pod("p", annotations={NAMES.placement: "strict"}, mutate=mutate)
    outcome, after = _admitted(pod, config)
    others = [e for e in pod["spec"]["resourceClaims"] if e["name"] != "gpus"]
    assert after["spec"]["resourceClaims"] == [entry, *others]
    assert after["metadata"]["annotations"][NAMES.placement] == "strict"
    rewritten = "resourceClaimName" in entry
    record = after["metadata"]["annotations"].get(NAMES.domain_claim)
    assert (json.loads(record) if record else None) == (
        {"claim": entry["resourceClaimName"], "entry": "gpus", "template": "four"} if rewritten else None)
    assert ("domain-claim" in outcome.changes, note is None or note in outcome.record) == (rewritten, True), outcome


def test_admitting_a_rewritten_pod_again_changes_nothing() -> None:
    pod = b.pod("p", annotations={NAMES.placement: "strict"}, mutate=b.with_claim_template("four"))
    _, after = _admitted(pod)
    again, _ = _admitted(after)
    assert again.patch == []


# How the model counts a rewritten pod, before and after its claim is made.
RECORD = dra.Record("gpus", "p-gpus-0a1b2c3d", "four")


def rewritten(body: dict[str, Any]) -> None:
    b.with_claim(RECORD.claim)(body)
    body["metadata"]["annotations"] = {NAMES.domain_claim: RECORD.text()}
    body["spec"]["schedulingGates"] = [{"name": NAMES.gate}]


def _own_claim(*, owner: str = "uid-p", domain: bool = True) -> dict[str, Any]:
    pod = b.pod("p", mutate=rewritten)
    pod["metadata"]["uid"] = owner
    made = domain_claim.body(pod=pod, record=RECORD, template=TEMPLATES[0],
                             domain=domain_claim.Domain("gpu.nvidia.com", (4, 5, 6, 7)) if domain else None)
    return {**made, "status": {}}


@pytest.mark.parametrize(("objects", "count", "left", "pending"), [
    pytest.param([_own_claim(owner="uid-someone-else")], 0, "claim default/p-gpus-0a1b2c3d request gpus: "
                 "firstAvailable (the scheduler picks the alternative)", False,
                 id="claim-of-that-name-owned-by-another-left-to-kube-scheduler"),
    pytest.param("no-template", 0, "claim template default/four not found (for claim default/p-gpus-0a1b2c3d)",
                 False, id="template-deleted-before-the-claim-was-made"),
    pytest.param([], 4, None, True, id="claim-not-made-yet-counts-its-template"),
    pytest.param([_own_claim()], 4, None, True, id="own-claim-with-the-domain-first-counts-its-alternatives"),
    pytest.param([_own_claim(domain=False)], 4, None, False, id="own-claim-of-the-template-request-alone"),
])
def test_the_model_counts_a_rewritten_pod(objects: Any, count: int, left: str | None, pending: bool) -> None:
    pod = b.pod("p", mutate=rewritten)
    templates = [] if objects == "no-template" else TEMPLATES
    inventory = dra.build(device_classes=[b.device_class()], slices=[], claims=[] if objects == "no-template"
                          else objects, templates=templates, gpu_classes=("gpu.nvidia.com",))
    got = dra.pod_gpus(pod, inventory, annotation=NAMES.domain_claim)
    assert (got.count, got.left, got.domain_claim) == (count, left, pending)


def test_release_plans_the_free_domain_of_a_fragmented_node_for_a_pod_with_its_own_claim() -> None:
    """First fit on a node whose device 1 is taken gives a 4-GPU pod 0, 2, 3, 4 (docs/placement.md); a pod whose
    claim asks the planned domain first gets the free domain 4-7."""
    holder = b.pod("holder", node="dra-0", phase="Running", mutate=b.with_claim("held"))
    held = b.resource_claim("held", devices=[("dra-0", 1)], reserved_for=["holder"])
    for mutate, expected in ((rewritten, ((4, 5, 6, 7), 1)), (b.with_claim_template("four"), ((0, 2, 3, 4), 2))):
        cluster = _cluster(holder, held, b.pod("p", mutate=mutate))
        placed = capacity.Room.of(cluster.nodes["dra-0"]).place_pod(cluster.pods["default/p"], one_domain=False)
        assert isinstance(placed, placement.Allocation) and (placed.indices, placed.spanned) == expected, mutate


# The claim whatever lifts our gate creates, and a claim found there already.
def test_the_claim_for_a_planned_domain_asks_it_first_then_the_templates_request() -> None:
    assert _own_claim() == {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "p-gpus-0a1b2c3d", "namespace": "default", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}]},
        "spec": {"devices": {"requests": [{"name": "gpus", "firstAvailable": [
            {"name": "domain", "deviceClassName": "gpu.nvidia.com", "count": 4, "selectors": [
                {"cel": {"expression": "device.attributes['gpu.nvidia.com'].index in [4, 5, 6, 7]"}}]},
            {"name": "any", "deviceClassName": "gpu.nvidia.com", "count": 4}]}]}},
        "status": {},
    }


def test_the_claim_is_made_in_the_pods_namespace() -> None:
    made = domain_claim.body(pod=b.pod("p", namespace="team"), record=RECORD, template=TEMPLATES[0], domain=None)
    assert made["metadata"]["namespace"] == "team"


def test_without_a_plan_the_claim_is_the_templates_request() -> None:
    template = b.claim_template("four", spec=b.claim_spec(4))
    template["spec"]["metadata"] = {"labels": {"team": "a"}, "annotations": {"note": "b"}}
    made = domain_claim.body(pod=b.pod("p"), record=RECORD, template=template, domain=None)
    assert (made["spec"], made["metadata"]["labels"], made["metadata"]["annotations"]) == (
        b.claim_spec(4), {"team": "a"}, {"note": "b"})


@pytest.mark.parametrize(("owner", "why"), [
    pytest.param({"kind": "Job", "name": "j", "uid": "uid-p"}, "claim p-gpus-0a1b2c3d exists with Job j, not this "
                 "pod: not ours, kube-scheduler allocates it as it is", id="owned-by-a-job-of-the-same-uid-not-ours"),
    pytest.param({"kind": "Pod", "name": "p", "uid": "uid-old-p"}, "claim p-gpus-0a1b2c3d exists with Pod p, not this "
                 "pod: not ours, kube-scheduler allocates it as it is", id="a-previous-pods-claim-not-ours"),
    pytest.param(None, "claim p-gpus-0a1b2c3d exists with no owner, not this pod: not ours, kube-scheduler allocates "
                 "it as it is", id="made-by-hand-not-ours"),
    pytest.param({"kind": "Pod", "name": "p", "uid": "uid-p"}, None, id="ours-made-before-a-restart-used-as-it-is"),
    pytest.param([{"kind": "Job", "name": "j", "uid": "u"}, {"kind": "Pod", "name": "p", "uid": "uid-old"}],
                 "claim p-gpus-0a1b2c3d exists with Job j, Pod p, not this pod: not ours, kube-scheduler allocates it "
                 "as it is", id="several-owners-none-this-pod-not-ours"),
])
def test_judge_an_existing_claim(owner: Any, why: str | None) -> None:
    owners = owner if isinstance(owner, list) else [owner] if owner else []
    claim = {"metadata": {"name": RECORD.claim, **({"ownerReferences": owners} if owners else {})}}
    assert domain_claim.judge(claim=claim, pod=b.pod("p")) == why


EXAMPLE = settings.Names(prefix="example.com/")


@pytest.mark.parametrize(("names", "annotations", "found"), [
    pytest.param(NAMES, {NAMES.domain_claim: "{not json"}, None, id="unreadable-record-ignored"),
    pytest.param(NAMES, {NAMES.domain_claim: '{"entry": "gpus", "claim": ""}'}, None, id="partial-record-ignored"),
    pytest.param(NAMES, {"gpu-steward.io/other-claim": RECORD.text()}, None, id="another-annotation-ignored"),
    pytest.param(NAMES, {NAMES.domain_claim: RECORD.text()}, RECORD, id="found-under-the-default-prefix"),
    pytest.param(EXAMPLE, {EXAMPLE.domain_claim: RECORD.text()}, RECORD, id="found-under-a-configured-prefix"),
    pytest.param(NAMES, {"other.example/domain-claim": RECORD.text()}, None,
                 id="another-products-domain-claim-not-ours"),
    pytest.param(EXAMPLE, {NAMES.domain_claim: RECORD.text()}, None,
                 id="the-default-prefix-not-ours-when-another-is-configured"),
    pytest.param(NAMES, {"other.example/domain-claim": "{not json", NAMES.domain_claim: RECORD.text()}, RECORD,
                 id="ours-read-beside-another-products-unreadable-one"),
])
def test_the_record_is_read_under_our_key_only(names: settings.Names, annotations: dict[str, str],
                                               found: dra.Record | None) -> None:
    assert dra.recorded(b.pod("p", annotations=annotations), annotation=names.domain_claim) == found


@pytest.mark.parametrize(("names", "expected"), [
    pytest.param(EXAMPLE, (4, None, True), id="read-by-the-names-that-wrote-it"),
    pytest.param(NAMES, (0, "claim default/p-gpus-0a1b2c3d not found", False),
                 id="not-read-by-the-default-names"),
])
def test_a_record_written_under_a_configured_prefix(names: settings.Names,
                                                    expected: tuple[int, str | None, bool]) -> None:
    """The webhook writes the record under its configured prefix; the model reads it only by the same names."""
    config = settings.Settings(names=EXAMPLE, dra=settings.Dra(domain_claims=True))
    _, after = _admitted(b.pod("p", annotations={EXAMPLE.placement: "strict"},
                               mutate=b.with_claim_template("four")), config)
    assert EXAMPLE.domain_claim in after["metadata"]["annotations"], after["metadata"]
    cluster = _cluster(after, names=names)
    claims = snapshot.gpu_requests(after, cluster.dra, names=names)[2]
    assert (claims.count, claims.left, claims.domain_claim) == expected
    parsed = cluster.pods.get("default/p")
    assert (parsed.dra if parsed else None) == (claims if claims.any else None), "the snapshot reads it by its names"
