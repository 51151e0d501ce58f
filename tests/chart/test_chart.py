"""The Helm chart: values ⇔ settings model one to one, lint, renders for several value sets, Kubernetes
schema validation of every rendered object, and values.schema.json refusing bad values."""

from __future__ import annotations

import importlib.util
import itertools
import json
import pathlib
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
import yaml

from common import settings, settings_loader
from tests.chart import helm

NAMESPACE = "gpu-steward"
RELEASE = "gs"
PREFIX = f"{RELEASE}-gpu-steward"
DEFAULTS = settings.Settings().model_dump(mode="json")
KUBE_VERSIONS = ("1.30.0", "1.37.0")  # the chart's floor (Chart.yaml kubeVersion) and the tested control plane
# Kinds of CRDs (cert-manager, Prometheus Operator) that have no schema in kubernetes-validate.
CRD_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate"),
             ("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
Objects = list[dict[str, Any]]


def _gen_schema() -> Any:
    spec = importlib.util.spec_from_file_location("gen_schema", helm.CHART / "hack" / "gen_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _gen_schema()


# --- values ⇔ settings model ---------------------------------------------------------------------


def test_values_settings_are_the_model_defaults() -> None:
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    assert values["settings"] == DEFAULTS


def test_generated_parts_are_fresh() -> None:
    """values.schema.json's `settings` and values.yaml's settings section are what the generator writes."""
    schema_text, values_text = GEN.render()
    assert (helm.CHART / "values.schema.json").read_text() == schema_text, "run charts/gpu-steward/hack/gen_schema.py"
    assert (helm.CHART / "values.yaml").read_text() == values_text, "run charts/gpu-steward/hack/gen_schema.py"


def test_schema_settings_is_the_model_schema_with_refs_inlined() -> None:
    schema = json.loads((helm.CHART / "values.schema.json").read_text())
    settings_schema = schema["properties"]["settings"]
    assert settings_schema == GEN.settings_schema()
    assert "$ref" not in json.dumps(settings_schema)
    assert settings_schema["properties"].keys() == settings.Settings.model_fields.keys()


def _objects_without_closed_properties(node: Any, path: str = "") -> list[str]:
    found = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "/")
        for key, value in node.items():
            found += _objects_without_closed_properties(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _objects_without_closed_properties(value, f"{path}/{i}")
    return found


def test_schema_closes_every_object() -> None:
    schema = json.loads((helm.CHART / "values.schema.json").read_text())
    # `global` is shared with a parent chart and its other subcharts: keys of theirs are not typos of ours.
    assert _objects_without_closed_properties(schema) == ["/properties/global"]


def test_every_settings_key_is_documented_in_values() -> None:
    """Every generated settings key line is preceded by a comment line (its description)."""
    section = (helm.CHART / "values.yaml").read_text().partition(GEN.SETTINGS_MARKER)[2].splitlines()[1:]
    assert section[0] == "settings:"
    leaves = [(before.strip(), line.strip()) for before, line in itertools.pairwise(section)
              if not line.strip().startswith("#") and not line.strip().endswith(":")]
    assert len(leaves) > 80
    assert [line for before, line in leaves if not before.startswith("# ")] == []


# --- lint and render ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"tls": {"mode": "cert-manager"}, "serviceMonitor": {"enabled": True}}, id="cert-manager"),
    ],
)
def test_helm_lint(values: dict[str, Any]) -> None:
    out = helm.helm("lint", "--strict", str(helm.CHART), "--kube-version", helm.KUBE_VERSION, values=values)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def _one(objects: Objects, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _kinds(objects: Objects) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def _container(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    container: dict[str, Any] = _one(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # apiGroups, resources, verbs


def _rules(objects: Objects, kind: str, name: str) -> list[Rule]:
    rules = _one(objects, kind, name)["rules"]
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in rules]


def _webhook(objects: Objects) -> dict[str, Any]:
    hook: dict[str, Any] = _one(objects, "MutatingWebhookConfiguration")["webhooks"][0]
    return hook


def _config(objects: Objects) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(_one(objects, "ConfigMap", f"{PREFIX}-config")["data"]["config.yaml"])
    return data


DRA_KINDS = ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates", "devicetaintrules")
READ = ("list", "watch")


def check_defaults(objects: Objects) -> None:
    assert _kinds(objects) == {
        ("ConfigMap", f"{PREFIX}-config"),
        # filled in at run time, owned by the release (tests/chart/test_platform.py); the helm test Pod
        ("Secret", f"{PREFIX}-webhook-tls"), ("Lease", "gpu-steward-descheduler"),
        ("Lease", "gpu-steward-reclaim-cooldowns"), ("Pod", f"{PREFIX}-check"),
        ("PriorityClass", "gpu-steward-critical"), ("PriorityClass", "gpu-steward-normal"),
        ("PriorityClass", "gpu-steward-scavenger"),
        ("MutatingWebhookConfiguration", PREFIX),
        *((kind, f"{PREFIX}-{c}") for c in ("webhook", "descheduler", "labeler", "release-gates")
          for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")),
        ("Role", f"{PREFIX}-webhook"), ("RoleBinding", f"{PREFIX}-webhook"), ("Job", f"{PREFIX}-release-gates"),
        ("Service", f"{PREFIX}-webhook"), ("Deployment", f"{PREFIX}-webhook"),
        ("PodDisruptionBudget", f"{PREFIX}-webhook"),
        # narrows our gate lifters' patch on pods to lifting our gate (tests/chart/test_pod_writes_policy.py)
        ("ValidatingAdmissionPolicy", f"{PREFIX}-pod-writes"),
        ("ValidatingAdmissionPolicyBinding", f"{PREFIX}-pod-writes"),
        ("Deployment", f"{PREFIX}-descheduler"), ("Service", f"{PREFIX}-descheduler-metrics"),
        ("Role", f"{PREFIX}-descheduler"), ("RoleBinding", f"{PREFIX}-descheduler"),
        ("Role", f"{PREFIX}-webhook"), ("RoleBinding", f"{PREFIX}-webhook"),
        ("DaemonSet", f"{PREFIX}-labeler"),
    }
    # The settings file is values.settings, key for key, and loads as the default settings.
    assert _config(objects) == DEFAULTS

    hook = _webhook(objects)
    assert {k: hook[k] for k in ("name", "admissionReviewVersions", "sideEffects", "failurePolicy", "timeoutSeconds",
                                 "reinvocationPolicy", "rules")} == {
        "name": "pods.gpu-steward.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": "Ignore", "timeoutSeconds": 3, "reinvocationPolicy": "Never",
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                   "scope": "Namespaced"}],
    }
    assert hook["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]}
    assert hook["objectSelector"] == {"matchExpressions": [
        {"key": "gpu-steward.io/skip", "operator": "NotIn", "values": ["true", "True", "yes", "1"]}]}
    assert hook["clientConfig"]["service"] == {"name": f"{PREFIX}-webhook", "namespace": NAMESPACE,
                                               "path": "/mutate", "port": 443}
    assert "caBundle" not in hook["clientConfig"]  # the webhook writes it (tls.mode managed): renders are stable
    assert [c["name"] for c in hook["matchConditions"]] == ["gpu-or-gang", "not-a-gated-gang-member"]

    webhook = _one(objects, "Deployment", f"{PREFIX}-webhook")
    assert webhook["spec"]["replicas"] == 2
    pod = webhook["spec"]["template"]["spec"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    container = pod["containers"][0]
    assert container["args"] == ["webhook"]
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] == 90
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    service = f"{PREFIX}-webhook"
    assert _env(container) == {
        "GPU_STEWARD_CONFIG": "/etc/gpu-steward/config/config.yaml", "GPU_STEWARD_LOG_FORMAT": "text",
        "GPU_STEWARD_WEBHOOK__CERT_FILE": "/etc/gpu-steward/tls/tls.crt",
        "GPU_STEWARD_WEBHOOK__KEY_FILE": "/etc/gpu-steward/tls/tls.key",
        "GPU_STEWARD_ADMISSION__EXCLUDED_NAMESPACES": '["kube-system","gpu-steward"]',
        # the descheduler's leader Lease, watched to gate for release only while the controller lives
        "GPU_STEWARD_DESCHEDULER__LEADER_ELECTION__LEASE_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "GPU_STEWARD_WEBHOOK__MANAGED_TLS__ENABLED": "true",
        "GPU_STEWARD_WEBHOOK__MANAGED_TLS__SECRET_NAME": f"{PREFIX}-webhook-tls",
        "GPU_STEWARD_WEBHOOK__MANAGED_TLS__SECRET_NAMESPACE": NAMESPACE,
        "GPU_STEWARD_WEBHOOK__MANAGED_TLS__WEBHOOK_CONFIGURATION": PREFIX,
        "GPU_STEWARD_WEBHOOK__MANAGED_TLS__DNS_NAMES": json.dumps(
            [service, *(f"{service}.{NAMESPACE}{suffix}" for suffix in ("", ".svc", ".svc.cluster.local"))],
            separators=(",", ":")),
    }
    # The pair is written by the process into a writable in-memory volume.
    assert {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in pod["volumes"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert _one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1

    descheduler = _container(objects, "Deployment", f"{PREFIX}-descheduler")
    assert descheduler["args"] == ["descheduler", "--metrics-port=9090"]
    assert descheduler["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    # Liveness: a minute of failed probes, longer than the loop is ever busy parsing a big cluster's lists.
    assert descheduler["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10,
                                            "timeoutSeconds": 5, "failureThreshold": 6}
    assert descheduler["readinessProbe"] == {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 10,
                                             "timeoutSeconds": 5, "failureThreshold": 3}
    assert _env(descheduler) == {
        "GPU_STEWARD_CONFIG": "/etc/gpu-steward/config/config.yaml", "GPU_STEWARD_LOG_FORMAT": "text",
        "GPU_STEWARD_DESCHEDULER__LEADER_ELECTION__LEASE_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "GPU_STEWARD_DESCHEDULER__LEADER_ELECTION__IDENTITY": {"fieldRef": {"fieldPath": "metadata.name"}},
    }

    labeler = _one(objects, "DaemonSet", f"{PREFIX}-labeler")["spec"]["template"]["spec"]
    assert labeler["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert labeler["priorityClassName"] == "system-node-critical"
    assert _one(objects, "Deployment", f"{PREFIX}-descheduler")["spec"]["template"]["spec"]["priorityClassName"] == (
        "system-cluster-critical")
    assert labeler["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert labeler["containers"][0]["args"] == ["label-node", "--interval=300", "--nvidia-smi=nvidia-smi",
                                                "--nvidia-smi-timeout=30"]
    assert _env(labeler["containers"][0])["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "nvidia.com/gpu" not in json.dumps(labeler["containers"][0]["resources"])  # must not take a GPU

    # Least privilege, per component.
    assert _rules(objects, "ClusterRole", f"{PREFIX}-webhook") == [
        (("",), ("nodes", "pods", "namespaces"), READ),
        (("",), ("pods",), ("patch",)),  # the gate lifter (admission/gate_lifter.py)
        (("scheduling.k8s.io",), ("priorityclasses", "podgroups"), READ),
        (("scheduling.k8s.io",), ("podgroups",), ("create", "get", "patch")),  # our gangs' own, before a gate goes
        (("resource.k8s.io",), DRA_KINDS, ("get", *READ)),  # DRA GPUs (common/dra.py)
        (("admissionregistration.k8s.io",), ("mutatingwebhookconfigurations",), ("get", "update"))]
    assert _one(objects, "ClusterRole", f"{PREFIX}-webhook")["rules"][5]["resourceNames"] == [PREFIX]
    # The leader Lease, watched to gate for release only while the controller lives; the TLS Secret.
    role = _one(objects, "Role", f"{PREFIX}-webhook")["rules"]
    assert role == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "watch"]},
                    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                    {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{PREFIX}-webhook-tls"],
                     "verbs": ["get", "update"]}]
    assert _one(objects, "RoleBinding", f"{PREFIX}-webhook")["roleRef"]["name"] == f"{PREFIX}-webhook"
    # events get + patch: a repeated Event is aggregated (common/events.py), as client-go's recorder does.
    # pods/status patch: release nominates gated pods; no pod create or delete, no Job read (no recovery).
    assert _rules(objects, "ClusterRole", f"{PREFIX}-descheduler") == [
        (("",), ("nodes", "namespaces"), READ), (("",), ("pods",), (*READ, "patch")),
        (("",), ("pods/status",), ("patch",)),
        (("scheduling.k8s.io",), ("priorityclasses", "podgroups"), READ),
        (("scheduling.k8s.io",), ("podgroups",), ("create", "get", "patch")),  # release makes our gangs' own PodGroups
        (("resource.k8s.io",), DRA_KINDS, ("get", *READ)),
        (("",), ("pods/eviction",), ("create",)),
        (("",), ("pods",), ("get",)), (("policy",), ("poddisruptionbudgets",), READ),
        (("apps",), ("replicasets",), ("list",)), (("batch",), ("jobs",), ("list",)),
        (("",), ("events",), ("create", "get", "patch"))]
    assert _rules(objects, "ClusterRole", f"{PREFIX}-release-gates") == [
        (("",), ("pods",), ("get", "list", "patch")),
        (("scheduling.k8s.io",), ("podgroups",), ("create", "get", "patch"))]
    # Uninstall: a pre-delete hook with objects of its own, deleted when it succeeded.
    job = _one(objects, "Job", f"{PREFIX}-release-gates")
    hook = {"helm.sh/hook": "pre-delete", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
            # Argo CD runs no Helm hook: the same as its own PreDelete hook (tests/chart/test_platform.py)
            "argocd.argoproj.io/hook": "PreDelete",
            "argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation,HookSucceeded"}
    assert job["metadata"]["annotations"] == {**hook, "helm.sh/hook-weight": "0", "argocd.argoproj.io/sync-wave": "0"}
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert _one(objects, kind, f"{PREFIX}-release-gates")["metadata"]["annotations"] == {
            **hook, "helm.sh/hook-weight": "-10", "argocd.argoproj.io/sync-wave": "-10"}, kind  # before the Job
    pod = job["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["restartPolicy"]) == (f"{PREFIX}-release-gates", "Never")
    assert pod["containers"][0]["args"] == ["release-gates"]
    assert _env(pod["containers"][0]) == {"GPU_STEWARD_NAMES__PREFIX": "gpu-steward.io/",
                                          "GPU_STEWARD_LOG_FORMAT": "text"}
    assert _rules(objects, "Role", f"{PREFIX}-descheduler") == [
        (("coordination.k8s.io",), ("leases",), ("get", "create", "update"))]  # no ConfigMap journal (no recovery)
    assert _rules(objects, "ClusterRole", f"{PREFIX}-labeler") == [(("",), ("nodes",), ("get", "patch"))]

    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PriorityClass"}
    reclaim = "reclaim-idle-resource.scheduling.x-k8s.io/"
    assert {name: (c["value"], c["preemptionPolicy"], c["metadata"].get("annotations", {}))
            for name, c in classes.items()} == {
        "gpu-steward-critical": (100_000, "PreemptLowerPriority", {}),  # reclaim: {enabled: false}
        "gpu-steward-normal": (10_000, "PreemptLowerPriority", {
            f"{reclaim}resource-idle-seconds": "10800", f"{reclaim}resource-idle-usage-threshold": "5",
            f"{reclaim}toleration-seconds": "1800"}),
        "gpu-steward-scavenger": (100, "Never", {
            f"{reclaim}resource-idle-seconds": "600", f"{reclaim}resource-idle-usage-threshold": "5",
            f"{reclaim}toleration-seconds": "300"}),
    }


def check_cert_manager(objects: Objects) -> None:
    assert not [o for o in objects if o["kind"] == "Secret"]
    # No Secret permissions: only the descheduler's Lease is watched in the release namespace.
    assert _rules(objects, "Role", f"{PREFIX}-webhook") == [(("coordination.k8s.io",), ("leases",), ("list", "watch"))]
    env = _env(_container(objects, "Deployment", f"{PREFIX}-webhook"))
    assert not [name for name in env if "MANAGED_TLS" in name]
    volume = _one(objects, "Deployment", f"{PREFIX}-webhook")["spec"]["template"]["spec"]["volumes"][1]
    assert volume == {"name": "tls", "secret": {"secretName": f"{PREFIX}-webhook-tls"}}
    name = f"{PREFIX}-webhook"
    assert _one(objects, "Issuer", name)["spec"] == {"selfSigned": {}}
    certificate = _one(objects, "Certificate", name)["spec"]
    assert certificate["secretName"] == f"{PREFIX}-webhook-tls"
    assert f"{name}.{NAMESPACE}.svc" in certificate["dnsNames"]
    assert certificate["issuerRef"] == {"name": name, "kind": "Issuer", "group": "cert-manager.io"}
    configuration = _one(objects, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{name}"}
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]


def check_existing_issuer(objects: Objects) -> None:
    assert not [o for o in objects if o["kind"] == "Issuer"]
    assert _one(objects, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


def check_no_priority_classes(objects: Objects) -> None:
    assert not [o for o in objects if o["kind"] == "PriorityClass"]
    assert _config(objects)["tiers"] == DEFAULTS["tiers"]  # the webhook still assigns the existing classes


def check_no_labeler(objects: Objects) -> None:
    assert not [o for o in objects if "labeler" in o["metadata"]["name"]]
    assert _one(objects, "Deployment", f"{PREFIX}-webhook")


def check_excluded_namespaces(objects: Objects) -> None:
    expected = ["kube-system", NAMESPACE, "team-a", "batch"]
    assert _webhook(objects)["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": expected},
        {"key": "gpu-steward.io/enabled", "operator": "In", "values": ["true"]},
    ]
    env = _env(_container(objects, "Deployment", f"{PREFIX}-webhook"))
    assert json.loads(env["GPU_STEWARD_ADMISSION__EXCLUDED_NAMESPACES"]) == expected
    assert _config(objects)["admission"]["excluded_namespaces"] == ["kube-system", "team-a", "batch"]


CUSTOM = {
    "names": {"prefix": "gpu.example.com/"},
    "scoring": {"base": 40, "exact_domain_fit": 35.5},
    "tiers": {"critical": {"name": "prod-gpu", "value": 500_000, "preemption_policy": "PreemptLowerPriority"},
              "rules": [{"name": "inference", "tier": "critical", "namespaces": ["serving"]}]},
    "prometheus": {"url": "http://prometheus.monitoring:9090", "labels": {"hostname": ["node"]}},
    "descheduler": {"reclaim": {"dry_run": True, "limits": {"per_node": 1}}, "gangs": {"enabled": False}},
}


def check_custom_settings(objects: Objects) -> None:
    config = _config(objects)
    expected = settings.Settings(**{**DEFAULTS, **CUSTOM}).model_dump(mode="json")
    assert settings.Settings(**config).model_dump(mode="json") == expected
    assert config["scoring"]["base"] == 40 and config["scoring"]["exact_domain_fit"] == 35.5
    assert config["prometheus"]["labels"] == {**DEFAULTS["prometheus"]["labels"], "hostname": ["node"]}
    critical = _one(objects, "PriorityClass", "prod-gpu")
    assert (critical["value"], critical["metadata"]["labels"]["gpu.example.com/tier"]) == (500_000, "critical")
    hook = _webhook(objects)
    assert hook["name"] == "pods.gpu.example.com"
    assert hook["objectSelector"]["matchExpressions"][0]["key"] == "gpu.example.com/skip"
    # Gang release off: the descheduler may no longer patch pods.
    assert (("",), ("pods",), READ) in _rules(objects, "ClusterRole", f"{PREFIX}-descheduler")


def check_reclaim_off(objects: Objects) -> None:
    """Release alone never evicts (nothing repairs a placement by deleting a pod): no eviction right."""
    rules = _rules(objects, "ClusterRole", f"{PREFIX}-descheduler")
    assert not [r for r in rules if "pods/eviction" in r[1]]
    assert (("",), ("pods/status",), ("patch",)) in rules


def check_reclaim_and_release_off(objects: Objects) -> None:
    rules = _rules(objects, "ClusterRole", f"{PREFIX}-descheduler")
    assert not [r for r in rules if "pods/eviction" in r[1] or "pods/status" in r[1]]


def check_learned_idle_window(objects: Objects) -> None:
    """On for the normal tier under a custom prefix: our own annotation there, the plugin's keys unchanged."""
    classes = {o["metadata"]["name"]: o["metadata"].get("annotations", {})
               for o in objects if o["kind"] == "PriorityClass"}
    reclaim = "reclaim-idle-resource.scheduling.x-k8s.io/"
    assert classes["gpu-steward-normal"] == {
        "gpu.example.com/learned-idle-window": "true", f"{reclaim}resource-idle-seconds": "10800",
        f"{reclaim}resource-idle-usage-threshold": "5", f"{reclaim}toleration-seconds": "1800"}
    assert "gpu.example.com/learned-idle-window" not in classes["gpu-steward-scavenger"]  # learnedIdleWindow unset


def check_service_monitors(objects: Objects) -> None:
    webhook = _one(objects, "ServiceMonitor", f"{PREFIX}-webhook")["spec"]
    assert webhook["endpoints"][0]["scheme"] == "https"
    assert webhook["endpoints"][0]["tlsConfig"]["ca"] == {"secret": {"name": f"{PREFIX}-webhook-tls", "key": "ca.crt"}}
    descheduler = _one(objects, "ServiceMonitor", f"{PREFIX}-descheduler")["spec"]
    assert descheduler["endpoints"][0]["port"] == "metrics"
    assert _one(objects, "ServiceMonitor", f"{PREFIX}-webhook")["metadata"]["labels"]["release"] == "kube-prom"


def check_no_descheduler_endpoint(objects: Objects) -> None:
    descheduler = _container(objects, "Deployment", f"{PREFIX}-descheduler")
    assert descheduler["args"] == ["descheduler"]
    assert not {"ports", "livenessProbe", "readinessProbe"} & set(descheduler)
    services = {(kind, name) for kind, name in _kinds(objects) if kind in ("Service", "ServiceMonitor")}
    assert services == {("Service", f"{PREFIX}-webhook"), ("ServiceMonitor", f"{PREFIX}-webhook")}


def check_local_webhook(objects: Objects) -> None:
    hook = _webhook(objects)
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:18443/mutate"
    assert "service" not in hook["clientConfig"]
    assert _config(objects)["webhook"]["managed_tls"]["ip_addresses"] == ["127.0.0.1"]
    assert _one(objects, "Deployment", f"{PREFIX}-webhook")["spec"]["replicas"] == 0
    assert not [o for o in objects if o["kind"] in ("DaemonSet", "PodDisruptionBudget")]
    assert _one(objects, "Deployment", f"{PREFIX}-descheduler")["spec"]["replicas"] == 0


def _reclaim_annotations(objects: Objects) -> dict[str, dict[str, str]]:
    classes = [o for o in objects if o["kind"] == "PriorityClass"]
    return {o["metadata"]["name"]: o["metadata"].get("annotations", {}) for o in classes}


def check_reclaim_off_per_tier(objects: Objects) -> None:
    """`{enabled: false}` and `null` both leave a tier without reclaim annotations (an empty map would be
    merged with the defaults by Helm); the other tier keeps its defaults."""
    annotations = _reclaim_annotations(objects)
    assert annotations["gpu-steward-normal"] == {} and annotations["gpu-steward-scavenger"] == {}
    assert annotations["gpu-steward-critical"] == {"reclaim-idle-resource.scheduling.x-k8s.io/toleration-seconds": "60"}


def check_labeler_node_selector_replaced(objects: Objects) -> None:
    spec = _one(objects, "DaemonSet", f"{PREFIX}-labeler")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"node.example.com/gpu": "yes"}  # not ANDed with nvidia.com/gpu.present


def check_single_replica_has_no_pdb(objects: Objects) -> None:
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert _one(objects, "Deployment", f"{PREFIX}-webhook")["spec"]["replicas"] == 1


EXTRA_ENV = [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]
EXTRA_VOLUME = {"name": "prom-token", "secret": {"secretName": "prom-token"}}
EXTRA_MOUNT = {"name": "prom-token", "mountPath": "/var/run/prometheus", "readOnly": True}
SA_ANNOTATIONS = {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/gpu-steward"}
EXTRAS = {"extraEnv": EXTRA_ENV, "extraVolumes": [EXTRA_VOLUME], "extraVolumeMounts": [EXTRA_MOUNT],
          "serviceAccount": {"annotations": SA_ANNOTATIONS}, "priorityClassName": ""}


def check_extras(objects: Objects) -> None:
    for kind, component in (("Deployment", "webhook"), ("Deployment", "descheduler"), ("DaemonSet", "labeler")):
        name = f"{PREFIX}-{component}"
        spec = _one(objects, kind, name)["spec"]["template"]["spec"]
        container = spec["containers"][0]
        assert container["env"][-1] == EXTRA_ENV[0], component
        assert container["env"][0]["name"] == "GPU_STEWARD_CONFIG", component  # the chart's own stay
        assert container["volumeMounts"][-1] == EXTRA_MOUNT and spec["volumes"][-1] == EXTRA_VOLUME, component
        assert container["volumeMounts"][0]["name"] == "config", component
        assert "priorityClassName" not in spec, component
        assert _one(objects, "ServiceAccount", name)["metadata"]["annotations"] == SA_ANNOTATIONS


def check_monitoring(objects: Objects) -> None:
    rule = _one(objects, "PrometheusRule", PREFIX)
    assert rule["metadata"]["labels"]["release"] == "kube-prom"
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {f"GpuSteward{name}" for name in (
        "WebhookErrors", "SnapshotStale", "GangsWaitingTooLong", "ReleasedNotBound", "GangReleaseFailing",
        "ReclaimBlocked", "PrometheusUnreachable")}
    assert alerts["GpuStewardReclaimBlocked"]["for"] == "30m"
    assert alerts["GpuStewardWebhookErrors"]["labels"] == {"severity": "warning", "team": "ml-platform"}
    dashboard = _one(objects, "ConfigMap", f"{PREFIX}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["gpu-steward.json"])["uid"] == "gpu-steward"


def check_no_release_gates(objects: Objects) -> None:
    assert not [o for o in objects if "release-gates" in o["metadata"]["name"]]


def check_no_native_binding(objects: Objects) -> None:
    """Off: nothing may create a PodGroup; reading them (native gangs of users) stays."""
    for component in ("webhook", "descheduler", "release-gates"):
        rules = _rules(objects, "ClusterRole", f"{PREFIX}-{component}")
        assert not [r for r in rules if "podgroups" in r[1] and "create" in r[2]], component
    assert (("scheduling.k8s.io",), ("priorityclasses", "podgroups"), READ) in _rules(
        objects, "ClusterRole", f"{PREFIX}-webhook")


def check_everything_off(objects: Objects) -> None:
    assert objects == []


SCENARIOS = [
    pytest.param({}, check_defaults, id="defaults"),
    pytest.param({"tls": {"mode": "cert-manager"}}, check_cert_manager, id="cert-manager"),
    pytest.param({"tls": {"mode": "cert-manager", "certManager": {"issuerRef": {"name": "corp-ca",
                                                                                "kind": "ClusterIssuer"}}}},
                 check_existing_issuer, id="cert-manager-existing-issuer"),
    pytest.param({"priorityClasses": {"create": False}}, check_no_priority_classes, id="priority-classes-existing"),
    pytest.param({"labeler": {"enabled": False}}, check_no_labeler, id="labeler-off"),
    pytest.param({"settings": {"admission": {"excluded_namespaces": ["kube-system", "team-a", "batch"]}},
                  "webhook": {"namespaceSelectorExpressions": [
                      {"key": "gpu-steward.io/enabled", "operator": "In", "values": ["true"]}]}},
                 check_excluded_namespaces, id="excluded-namespaces"),
    pytest.param({"settings": CUSTOM}, check_custom_settings, id="custom-settings"),
    pytest.param({"settings": {"descheduler": {"reclaim": {"enabled": False}}}}, check_reclaim_off, id="reclaim-off"),
    pytest.param({"settings": {"descheduler": {"reclaim": {"enabled": False}, "gangs": {"enabled": False}}}},
                 check_reclaim_and_release_off, id="reclaim-and-release-off"),
    pytest.param({"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prom"}}}, check_service_monitors,
                 id="service-monitors"),
    pytest.param({"descheduler": {"metricsPort": 0}, "serviceMonitor": {"enabled": True}},
                 check_no_descheduler_endpoint, id="descheduler-metrics-port-0"),
    pytest.param(helm.local_values(18443), check_local_webhook, id="local-webhook-for-e2e"),
    pytest.param({"priorityClasses": {"normal": {"reclaim": {"enabled": False}}, "scavenger": {"reclaim": None},
                                      "critical": {"reclaim": {"enabled": True, "toleration-seconds": 60}}}},
                 check_reclaim_off_per_tier, id="reclaim-off-per-tier"),
    pytest.param({"priorityClasses": {"normal": {"reclaim": {"learnedIdleWindow": True}}},
                  "settings": {"names": {"prefix": "gpu.example.com/"}}}, check_learned_idle_window,
                 id="learned-idle-window-on"),
    pytest.param({"labeler": {"nodeSelector": {"node.example.com/gpu": "yes"}}}, check_labeler_node_selector_replaced,
                 id="labeler-node-selector-replaces"),
    pytest.param({"webhook": {"replicas": 1}}, check_single_replica_has_no_pdb, id="one-replica-no-pdb"),
    pytest.param({"webhook": EXTRAS, "descheduler": EXTRAS, "labeler": EXTRAS}, check_extras, id="extras"),
    pytest.param({"prometheusRule": {"enabled": True, "labels": {"release": "kube-prom"},
                                     "alertLabels": {"team": "ml-platform"}},
                  "grafanaDashboard": {"enabled": True}}, check_monitoring, id="alerts-and-dashboard"),
    pytest.param({"releaseGates": {"enabled": False}}, check_no_release_gates, id="release-gates-off"),
    pytest.param({"settings": {"descheduler": {"gangs": {"native_binding": False}}}}, check_no_native_binding,
                 id="native-binding-off"),
    pytest.param({"webhook": {"enabled": False}, "descheduler": {"enabled": False}, "labeler": {"enabled": False},
                  "priorityClasses": {"create": False}, "releaseGates": {"enabled": False}}, check_everything_off,
                 id="everything-off"),
]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize(("values", "check"), SCENARIOS)
def test_render(values: dict[str, Any], check: Callable[[Objects], None], version: str) -> None:
    """Rendered for, and validated against the schemas of, the oldest and newest Kubernetes we support."""
    objects = helm.template(values, release=RELEASE, namespace=NAMESPACE, kube_version=version)
    check(objects)
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue  # no offline schema; their fields are asserted by the checks above
        kubernetes_validate.validate(obj, version, strict=True)


def test_rendered_settings_load_in_the_program(tmp_path: pathlib.Path) -> None:
    """The ConfigMap's file, read the way the components read it, gives the settings the values say."""
    objects = helm.template({"settings": CUSTOM}, release=RELEASE, namespace=NAMESPACE)
    path = tmp_path / "config.yaml"
    path.write_text(_one(objects, "ConfigMap")["data"]["config.yaml"])
    loaded = settings_loader.load(config_file=path)
    assert loaded.names.prefix == "gpu.example.com/"
    assert loaded.tiers.rules[0].namespaces == ["serving"]
    assert loaded.descheduler.reclaim.limits.per_node == 1


def test_config_change_rolls_the_pods() -> None:
    def checksums(values: dict[str, Any]) -> set[str]:
        objects = helm.template(values, release=RELEASE, namespace=NAMESPACE)
        return {o["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
                for o in objects if o["kind"] in ("Deployment", "DaemonSet")}

    before, after = checksums({}), checksums({"settings": {"log_level": "DEBUG"}})
    assert len(before) == 1 and len(after) == 1 and before != after


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"settings": {"scoring": {"bogus": 1}}}, "at '/settings/scoring': additional properties 'bogus'",
                     id="unknown-settings-key"),
        pytest.param({"settings": {"webhook": {"port": "8443"}}},
                     "at '/settings/webhook/port': got string, want integer", id="settings-wrong-type"),
        pytest.param({"settings": {"prometheus": {"timeout_seconds": 0}}}, "/settings/prometheus/timeout_seconds",
                     id="settings-out-of-range"),
        pytest.param({"settings": {"tiers": {"default": "gold"}}}, "/settings/tiers/default", id="settings-bad-enum"),
        pytest.param({"settings": {"names": {"prefix": "No_Slash"}}}, "/settings/names/prefix",
                     id="settings-bad-pattern"),
        pytest.param({"setings": {}}, "additional properties 'setings' not allowed", id="unknown-top-level-key"),
        pytest.param({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy", id="bad-failure-policy"),
        pytest.param({"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds", id="timeout-above-30"),
        pytest.param({"tls": {"mode": "vault"}}, "/tls/mode", id="bad-tls-mode"),
        pytest.param({"tls": {"mode": "self-signed"}}, "/tls/mode", id="helm-generated-certificates-are-gone"),
        pytest.param({"priorityClasses": {"normal": {"reclaim": {"idle-seconds": 5}}}},
                     "additional properties 'idle-seconds'", id="unknown-reclaim-annotation"),
        pytest.param({"priorityClasses": {"normal": {"reclaim": {"learnedIdleWindow": "yes"}}}},
                     "/priorityClasses/normal/reclaim/learnedIdleWindow", id="learned-idle-window-not-boolean"),
        pytest.param({"settings": {"webhook": {"request_timeout_seconds": 3}}},
                     "settings.webhook.request_timeout_seconds must be below webhook.timeoutSeconds",
                     id="request-budget-not-below-webhook-timeout"),
        pytest.param({"descheduler": {"replicas": 2},
                      "settings": {"descheduler": {"leader_election": {"enabled": False}}}},
                     "descheduler.replicas > 1 needs settings.descheduler.leader_election.enabled",
                     id="replicas-without-leader-election"),
    ],
)
def test_bad_values_fail_the_render(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError) as caught:
        helm.template(values)
    assert message in str(caught.value)


def test_kubernetes_below_the_floor_is_refused() -> None:
    """Chart.yaml's kubeVersion (>= 1.30: matchConditions GA) stops a render for an older cluster."""
    with pytest.raises(helm.HelmError) as caught:
        helm.template({}, release=RELEASE, namespace=NAMESPACE, kube_version="1.29.9")
    assert "kubeVersion" in str(caught.value) or "incompatible" in str(caught.value), caught.value


CLAIMS = (("resource.k8s.io",), ("resourceclaims",), ("create",))  # a pod's claim of its own (common/claims.py)


@pytest.mark.parametrize(("dra", "made"), [
    pytest.param({"gpu_device_classes": [], "domain_claims": True}, False, id="no-gpu-classes-no-claims"),
    pytest.param({}, False, id="off-by-default"),
    pytest.param({"domain_claims": True}, True, id="on"),
])
def test_only_one_domain_claims_let_the_gate_lifters_create_claims(dra: dict[str, Any], made: bool) -> None:
    objects = helm.template({"settings": {"dra": dra}}, release=RELEASE, namespace=NAMESPACE)
    lifters = {f"{PREFIX}-webhook": [CLAIMS], f"{PREFIX}-descheduler": [CLAIMS], f"{PREFIX}-release-gates": [
        (("resource.k8s.io",), ("resourceclaimtemplates",), ("get",)),
        (("resource.k8s.io",), ("resourceclaims",), ("create", "get"))]}
    for name, rules in lifters.items():
        got = [r for r in _rules(objects, "ClusterRole", name) if r[0] == ("resource.k8s.io",) and "list" not in r[2]]
        assert got == (rules if made else []), name
    policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"] == f"{PREFIX}-claim-writes"]
    assert len(policies) == int(made)
    if made:
        users = policies[0]["spec"]["matchConditions"][0]["expression"]
        accounts = (f"'system:serviceaccount:{NAMESPACE}:{PREFIX}-{c}'" for c in ("webhook", "release-gates",
                                                                                  "descheduler"))
        assert users == f"request.userInfo.username in [{', '.join(accounts)}]"
