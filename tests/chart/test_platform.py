"""What a platform team needs from the chart beyond the components: uninstall under Argo CD and Flux, an uninstall
that leaves no secret or Lease behind, a NetworkPolicy, `helm test`, a registry mirror and pull secrets, and the
log format. Rendered, and validated against the Kubernetes schemas."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from common import settings
from tests.chart import helm

NAMESPACE = "gpu-steward"
PREFIX = "gs-gpu-steward"
Objects = list[dict[str, Any]]
DEFAULTS = settings.Settings()


def _render(values: dict[str, Any] | None = None) -> Objects:
    objects = helm.template(values, namespace=NAMESPACE, kube_version="1.37.0")
    for obj in objects:
        if not obj["apiVersion"].startswith(("monitoring.coreos.com", "cert-manager.io")):  # CRDs: no schema
            kubernetes_validate.validate(obj, "1.37.0", strict=True)
    return objects


def _kinds(objects: Objects, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _pod_specs(objects: Objects) -> dict[str, dict[str, Any]]:
    specs = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects
             if o["kind"] in ("Deployment", "DaemonSet", "Job")}
    specs |= {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Pod"}
    return specs


# --- uninstall under Argo CD and Flux ------------------------------------------------------------


def test_the_uninstall_hook_runs_under_helm_and_argo_cd_in_the_same_order() -> None:
    """Argo CD ignores helm.sh/hook: pre-delete (docs/design.md); its PreDelete hook runs the same objects, in the
    same order (sync waves mirror the hook weights). Flux's helm-controller runs Helm's hooks itself."""
    hooks = [o for o in _render({"releaseGates": {"enabled": True}})
             if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]
    hooks = [o for o in hooks if o["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"]
    assert sorted(o["kind"] for o in hooks) == ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    for obj in hooks:
        notes = obj["metadata"]["annotations"]
        assert notes["argocd.argoproj.io/hook"] == "PreDelete", obj["kind"]
        assert notes["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation,HookSucceeded"
        assert notes["argocd.argoproj.io/sync-wave"] == notes["helm.sh/hook-weight"]
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hooks}
    assert weights["Job"] > max(w for kind, w in weights.items() if kind != "Job")  # its RBAC exists first


@pytest.mark.parametrize(
    ("values", "secret", "leases"),
    [
        pytest.param({}, True, [DEFAULTS.descheduler.leader_election.lease_name,
                                DEFAULTS.descheduler.reclaim.cooldown_lease_name], id="defaults"),
        pytest.param({"tls": {"mode": "cert-manager"}}, False,
                     [DEFAULTS.descheduler.leader_election.lease_name,
                      DEFAULTS.descheduler.reclaim.cooldown_lease_name], id="cert-manager-owns-its-secret"),
        pytest.param({"settings": {"descheduler": {"reclaim": {"enabled": False},
                                                   "leader_election": {"lease_name": "lead"}}}},
                     True, ["lead"], id="no-reclaim-no-cooldown-lease"),
        pytest.param({"webhook": {"enabled": False}, "descheduler": {"enabled": False}}, False, [],
                     id="components-off"),
    ],
)
def test_what_the_components_write_belongs_to_the_release(values: dict[str, Any], secret: bool,
                                                          leases: list[str]) -> None:
    """The TLS Secret (with the CA's private key) and the Leases are rendered empty, so uninstall deletes them;
    the components fill in only fields the manifest never sets (an upgrade keeps them: tests/e2e)."""
    objects = _render(values)
    secrets = _kinds(objects, "Secret")
    if secret:
        rendered = secrets.pop(f"{PREFIX}-webhook-tls")
        assert rendered["type"] == "Opaque" and "data" not in rendered and "stringData" not in rendered
    assert f"{PREFIX}-webhook-tls" not in secrets
    rendered_leases = _kinds(objects, "Lease")
    assert sorted(rendered_leases) == sorted(leases)
    assert all(lease["spec"] == {} and lease["metadata"]["namespace"] == NAMESPACE
               for lease in rendered_leases.values())


# --- NetworkPolicy -------------------------------------------------------------------------------


def test_no_network_policy_by_default() -> None:
    assert _kinds(_render(), "NetworkPolicy") == {}


def test_network_policies_allow_what_each_component_serves_and_calls() -> None:
    prometheus_peer = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    policies = _kinds(_render({"networkPolicy": {"enabled": True, "prometheus": {"to": prometheus_peer}}}),
                      "NetworkPolicy")
    assert sorted(policies) == [f"{PREFIX}-{c}" for c in ("descheduler", "labeler", "webhook")]
    webhook, descheduler, labeler = (policies[f"{PREFIX}-{c}"]["spec"] for c in ("webhook", "descheduler", "labeler"))
    assert webhook["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    assert webhook["ingress"] == [{"ports": [{"port": DEFAULTS.webhook.port, "protocol": "TCP"}]}]
    assert descheduler["ingress"] == [{"ports": [{"port": 9090, "protocol": "TCP"}]}]
    assert labeler["ingress"] == []  # serves nothing: every ingress denied
    dns = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    api = {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    assert webhook["egress"] == labeler["egress"] == [dns, api]
    assert descheduler["egress"] == [dns, api, {"ports": [{"port": 9090, "protocol": "TCP"}], "to": prometheus_peer}]


def test_network_policy_peers_and_extra_rules_are_values() -> None:
    peer = [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    extra = [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 8080, "protocol": "TCP"}]}]
    policies = _kinds(_render({"networkPolicy": {"enabled": True, "ingressFrom": peer, "apiServer": {"to": peer},
                                                 "extraEgress": extra}, "labeler": {"enabled": False},
                               "descheduler": {"metricsPort": 0}}), "NetworkPolicy")
    assert sorted(policies) == [f"{PREFIX}-descheduler", f"{PREFIX}-webhook"]
    webhook, descheduler = policies[f"{PREFIX}-webhook"]["spec"], policies[f"{PREFIX}-descheduler"]["spec"]
    assert webhook["ingress"][0]["from"] == peer
    assert descheduler["ingress"] == []  # no metrics port: nothing served
    assert webhook["egress"][1]["to"] == peer and webhook["egress"][-1] == extra[0]


# --- helm test -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "skip_descheduler"),
    [pytest.param({}, False, id="descheduler-must-lead"),
     pytest.param({"descheduler": {"enabled": False}}, True, id="no-descheduler"),
     pytest.param({"descheduler": {"replicas": 0}}, True, id="descheduler-scaled-to-zero")],
)
def test_helm_test_checks_the_webhook_through_its_service_and_the_leader(values: dict[str, Any],
                                                                         skip_descheduler: bool) -> None:
    [pod] = [o for o in _render(values) if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    [container] = pod["spec"]["containers"]
    expected = ["check", f"--webhook=https://{PREFIX}-webhook.{NAMESPACE}.svc:443",
                "--ca-file=/etc/gpu-steward/tls/ca.crt"]
    assert container["args"] == expected + (["--no-descheduler"] if skip_descheduler else [])
    [ca] = [v for v in pod["spec"]["volumes"] if v["name"] == "ca"]
    assert ca["secret"] == {"secretName": f"{PREFIX}-webhook-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert pod["spec"]["automountServiceAccountToken"] is False  # it reads nothing from the API


def test_no_helm_test_without_the_webhook() -> None:
    assert not [o for o in _render({"webhook": {"enabled": False}}) if o["kind"] == "Pod"]


# --- images, pull secrets, log format -------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "image"),
    [
        pytest.param({}, "ghcr.io/gpu-steward/gpu-steward:0.1.0", id="default"),
        pytest.param({"global": {"imageRegistry": "mirror.example.com"}},
                     "mirror.example.com/gpu-steward/gpu-steward:0.1.0", id="mirror-replaces-the-registry"),
        pytest.param({"global": {"imageRegistry": "mirror.example.com:5000/"},
                      "image": {"repository": "team/gpu-steward", "digest": "sha256:" + "a" * 64}},
                     "mirror.example.com:5000/team/gpu-steward@sha256:" + "a" * 64, id="no-registry-to-replace"),
        pytest.param({"global": {"imageRegistry": "mirror.example.com"}, "image": {"repository": "localhost/gs"}},
                     "mirror.example.com/gs:0.1.0", id="localhost-is-a-registry"),
    ],
)
def test_every_pod_uses_the_image_through_the_global_registry(values: dict[str, Any], image: str) -> None:
    specs = _pod_specs(_render({"releaseGates": {"enabled": True}, **values}))
    assert len(specs) == 5  # webhook, descheduler, labeler, the uninstall hook, helm test
    assert {c["image"] for spec in specs.values() for c in spec["containers"]} == {image}


def test_pull_secrets_global_first_each_once_in_every_pod() -> None:
    specs = _pod_specs(_render({"releaseGates": {"enabled": True},
                                "global": {"imagePullSecrets": ["corp", {"name": "shared"}]},
                                "imagePullSecrets": [{"name": "shared"}, {"name": "team"}]}))
    assert {name: spec.get("imagePullSecrets") for name, spec in specs.items()} == {
        name: [{"name": "corp"}, {"name": "shared"}, {"name": "team"}] for name in specs}
    assert all("imagePullSecrets" not in spec for spec in _pod_specs(_render({"releaseGates": {"enabled": True}}))
               .values())


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_log_format_reaches_every_container(log_format: str) -> None:
    specs = _pod_specs(_render({"releaseGates": {"enabled": True}, "logFormat": log_format}))
    for name, spec in specs.items():
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["GPU_STEWARD_LOG_FORMAT"] == log_format, name


@pytest.mark.parametrize(
    ("values", "path"),
    [
        pytest.param({"logFormat": "yaml"}, "/logFormat", id="unknown-log-format"),
        pytest.param({"global": {"imagePullSecrets": [{"nme": "x"}]}}, "/global/imagePullSecrets/0",
                     id="pull-secret-typo"),
        pytest.param({"networkPolicy": {"enable": True}}, "/networkPolicy", id="network-policy-typo"),
        pytest.param({"networkPolicy": {"apiServer": {"ports": [0]}}}, "/networkPolicy/apiServer/ports/0",
                     id="port-zero"),
    ],
)
def test_schema_refuses(values: dict[str, Any], path: str) -> None:
    with pytest.raises(helm.HelmError) as caught:
        helm.template(values)
    assert path in str(caught.value), str(caught.value)
