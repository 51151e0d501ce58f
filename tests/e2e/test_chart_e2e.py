"""The chart installed into a real control plane, its webhook and descheduler running on this machine
under the chart's own ServiceAccounts (bound tokens, no admin kubeconfig), so every API call they make is
checked against the RBAC the chart renders.

A cluster of its own: the chart registers a webhook for every namespace, which would also mutate the
other end-to-end tests' pods. The webhook is registered by URL (`webhook.url`, kwok cannot run our
image) and, in the default `tls.mode: managed`, creates its TLS Secret and writes its CA into the
chart's MutatingWebhookConfiguration itself. Covered: TLS bootstrap, admission, the API server's
matchConditions filter, an upgrade that keeps the caBundle, gang release, a reclaim eviction planned within a
PodDisruptionBudget it lists, and a repeated Event aggregated (GET + PATCH).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from common import dra, gate_patch, gpu, settings
from common import kube as kube_api
from descheduler import policy
from gpu_steward_lab import localcluster
from tests import builders
from tests.chart import helm
from tests.e2e import conftest, test_reclaim_e2e
from tests.support import kube, prometheus

pytestmark = pytest.mark.e2e

RELEASE, NAMESPACE, TEAM = "gs", "gpu-steward", "team"
PREFIX = f"{RELEASE}-gpu-steward"
NAMES = settings.Names()
NAMES_SETTINGS = settings.Settings()
REQUESTS = "gpu_steward_admission_requests_total"


@dataclasses.dataclass
class Release:
    cluster: localcluster.LocalCluster
    port: int
    files: helm.ReleaseFiles
    workdir: pathlib.Path
    webhook: localcluster.ManagedProcess

    def secret(self) -> dict[str, str]:
        data: dict[str, str] = self.cluster.kubectl_json("get", "secret", f"{PREFIX}-webhook-tls", "-n",
                                                          NAMESPACE)["data"]
        return data

    def ca_bundle(self) -> str | None:
        configuration = self.cluster.kubectl_json("get", "mutatingwebhookconfiguration", PREFIX)
        bundle: str | None = configuration["webhooks"][0]["clientConfig"].get("caBundle")
        return bundle

    def trust(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=base64.b64decode(self.secret()["ca.crt"]).decode())

    def requests_answered(self) -> float:
        """The webhook's own count of AdmissionReviews it answered (every result)."""
        with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/metrics", context=self.trust(), timeout=10) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(REQUESTS + "{"))

    def as_service_account(self, component: str) -> pathlib.Path:
        return as_service_account(self.cluster, component, self.workdir)


def as_service_account(cluster: localcluster.LocalCluster, component: str, workdir: pathlib.Path) -> pathlib.Path:
    """A kubeconfig with a bound token of the chart's ServiceAccount of `component`."""
    return helm.service_account_kubeconfig(kubeconfig=cluster.kubeconfig, namespace=NAMESPACE,
                                           service_account=f"{PREFIX}-{component}",
                                           dest=workdir / f"{component}.kubeconfig")


def values(port: int, *, log_level: str = "INFO") -> dict[str, Any]:
    # A short TLS re-check, so that a repair is seen within the test.
    return helm.local_values(port, settings={"log_level": log_level, "webhook": {"managed_tls": {"check_seconds": 1}}})


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[localcluster.LocalCluster]:
    cluster = localcluster.LocalCluster(localcluster.ensure_binaries()).start()
    try:
        cluster.add_nodes(localcluster.gpu_nodes("2x8g2d, 2x2g1d", names=NAMES))
        yield cluster
    finally:
        cluster.stop()


def _python(command: str, *, env: dict[str, str], log: pathlib.Path, args: tuple[str, ...] = ()
            ) -> localcluster.ManagedProcess:
    return localcluster.ManagedProcess(command, [sys.executable, "-m", "gpu_steward", command, *args], log_file=log,
                                       env={**os.environ, **env})


@pytest.fixture(scope="module")
def release(own_cluster: localcluster.LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    port = localcluster.free_port()
    helm.install(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE, values=values(port))
    workdir = tmp_path_factory.mktemp("chart")
    files = helm.release_files(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE,
                               dest=workdir / "release")
    sa = as_service_account(own_cluster, "webhook", workdir)
    webhook = _python("webhook", log=workdir / "webhook.log", args=("--host", "127.0.0.1", "--port", str(port)),
                      env={**files.webhook_env, "GPU_STEWARD_KUBERNETES__KUBECONFIG": str(sa)})
    installed = Release(own_cluster, port, files, workdir, webhook)
    webhook.start()
    try:
        # The chart made the Secret empty; the process fills it in (under the chart's Role) before it listens.
        kube.poll("webhook TLS Secret filled in", lambda: "ca.crt" in (own_cluster.kubectl_json(
            "get", "secret", f"{PREFIX}-webhook-tls", "-n", NAMESPACE).get("data") or {}) or None,
            timeout_seconds=60)
        webhook.wait_http_ok(f"https://127.0.0.1:{port}/readyz", ssl_context=installed.trust(), timeout_seconds=60)
        own_cluster.kubectl("create", "namespace", TEAM)
        own_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", TEAM, "--timeout=30s")
        yield installed
    finally:
        webhook.stop()
        with contextlib.suppress(helm.HelmError):
            helm.uninstall(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE)


def create(cluster: localcluster.LocalCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as admitted (the create's answer: a controller may change it right after)."""
    got: dict[str, Any] = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(pod)).stdout)
    return got


def test_webhook_keeps_its_own_tls_under_the_chart_rbac(release: Release) -> None:
    secret = release.secret()
    assert set(secret) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert release.ca_bundle() == secret["ca.crt"]  # written by the webhook through its ClusterRole
    served = (release.files.tls_dir / "tls.crt").read_bytes()
    assert served == base64.b64decode(secret["tls.crt"])


def test_a_dropped_ca_bundle_is_written_back(release: Release) -> None:
    """E.g. a tool that re-applied the configuration with its own (empty) caBundle."""
    expected = release.secret()["ca.crt"]
    release.cluster.kubectl("patch", "mutatingwebhookconfiguration", PREFIX, "--type=json",
                            "-p", '[{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}]')
    # (a `remove` of a missing path fails: it was there and is gone; the 1 s re-check may already have run)
    kube.poll("caBundle written back", lambda: release.ca_bundle() == expected, timeout_seconds=30)


def test_installed_webhook_mutates_gpu_pods_and_honours_the_opt_out_label(release: Release) -> None:
    cluster = release.cluster
    classes = cluster.kubectl_json("get", "priorityclasses")["items"]
    ours = {c["metadata"]["name"]: c["value"] for c in classes if c["metadata"]["name"].startswith("gpu-steward-")}
    assert ours == {"gpu-steward-critical": 100_000, "gpu-steward-normal": 10_000, "gpu-steward-scavenger": 100}

    mutated = create(cluster, kube.pod("train", namespace=TEAM, gpus=2))
    assert (mutated["spec"]["priorityClassName"], mutated["spec"]["priority"]) == ("gpu-steward-normal", 10_000)
    assert "tier normal: default tier" in mutated["metadata"]["annotations"][NAMES.decision]

    skipped = create(cluster, kube.pod("opted-out", namespace=TEAM, gpus=2, labels={NAMES.skip: "true"}))
    assert "priorityClassName" not in skipped["spec"]  # the objectSelector kept it from the webhook
    assert NAMES.decision not in (skipped["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    ("pod", "calls"),
    [
        pytest.param(kube.pod("plain", namespace=TEAM), 0, id="plain-pod-never-reaches-the-webhook"),
        pytest.param(kube.pod("init-plain", namespace=TEAM) | {"spec": {
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "main", "image": "busybox"}]}}, 0, id="plain-init-container"),
        pytest.param(kube.pod("gpu", namespace=TEAM, gpus=1), 1, id="gpu-pod"),
        pytest.param(kube.pod("mig", namespace=TEAM) | {"spec": {"containers": [{
            "name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}, 1,
            id="mig-pod"),
        pytest.param(kube.pod("gpu-init", namespace=TEAM) | {"spec": {
            "initContainers": [{"name": "init", "image": "cuda", "resources": {"limits": {gpu.FULL_GPU: "1"}}}],
            "containers": [{"name": "main", "image": "busybox"}]}}, 1, id="gpu-only-in-an-init-container"),
        pytest.param(kube.pod("kueue-member", namespace=TEAM, labels={"kueue.x-k8s.io/pod-group-name": "g"}), 1,
                     id="gang-member-without-gpu"),
        pytest.param(kube.pod("volcano-member", namespace=TEAM, annotations={"scheduling.k8s.io/group-name": "g"}), 1,
                     id="volcano-annotation"),
        # Taken by the fail-closed entry, and only by it: one call, not one per entry.
        pytest.param(kube.pod("our-member", namespace=TEAM, gpus=1,
                              labels={NAMES.gang_name: "g", NAMES.gang_size: "2"}), 1,
                     id="gated-gang-member-called-once"),
        pytest.param(kube.pod("kueue-counted", namespace=TEAM, labels={"kueue.x-k8s.io/pod-group-name": "g"},
                              annotations={"kueue.x-k8s.io/pod-group-total-count": "2"}), 1,
                     id="kueue-member-with-count-called-once"),
        # DRA: whether a claim's devices are GPUs is the webhook's to say (common/dra.py).
        pytest.param(kube.pod("claims", namespace=TEAM) | {"spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four-gpus"}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpus"}]}}]}}, 1,
            id="pod-with-resource-claims"),
        pytest.param(kube.pod("implicit", namespace=TEAM) | {"spec": {"containers": [{
            "name": "main", "image": "cuda",
            "resources": {"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}}}]}}, 1,
            id="implicit-deviceclass-extended-resource"),
    ],
)
def test_the_api_server_only_calls_the_webhook_for_gpu_and_gang_pods(
    release: Release, pod: dict[str, Any], calls: int
) -> None:
    """matchConditions (CEL) filter in the API server: counted by the webhook's own request metric."""
    before = release.requests_answered()
    release.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
    assert release.requests_answered() - before == calls


GANG_ENTRY = "gang-members-wait-for-the-gpu-steward-webhook-retry-when-up.gpu-steward.io"


def test_a_gang_member_gets_its_gate_through_the_fail_closed_entry(release: Release) -> None:
    member = create(release.cluster, kube.pod("entry-member", namespace=TEAM, gpus=1,
                                              labels={NAMES.gang_name: "entry", NAMES.gang_size: "2"}))
    assert NAMES.gate in kube.gates(member)
    hooks = release.cluster.kubectl_json("get", "mutatingwebhookconfiguration", PREFIX)["webhooks"]
    assert [(h["name"], h["failurePolicy"]) for h in hooks] == [
        ("pods.gpu-steward.io", "Ignore"), (GANG_ENTRY, "Fail")]
    assert len({h["clientConfig"].get("caBundle") for h in hooks}) == 1  # the webhook wrote its CA into both


@pytest.mark.parametrize(
    ("pod", "refused"),
    [
        pytest.param(kube.pod("down-member", namespace=TEAM, gpus=1,
                              labels={NAMES.gang_name: "d", NAMES.gang_size: "2"}), True, id="gang-member-refused"),
        pytest.param(kube.pod("down-member-annotated", namespace=TEAM, annotations={
            NAMES.gang_name: "d", NAMES.gang_size: "2"}), True, id="gang-member-by-annotation-without-gpu-refused"),
        pytest.param(kube.pod("down-kueue", namespace=TEAM, labels={"kueue.x-k8s.io/pod-group-name": "k"},
                              annotations={"kueue.x-k8s.io/pod-group-total-count": "2"}), True,
                     id="kueue-member-refused"),
        pytest.param(kube.pod("down-gpu", namespace=TEAM, gpus=1), False, id="plain-gpu-pod-created"),
        pytest.param(kube.pod("down-plain", namespace=TEAM), False, id="plain-pod-created"),
        pytest.param(kube.pod("down-volcano", namespace=TEAM, annotations={"scheduling.k8s.io/group-name": "v"}),
                     False, id="volcano-member-never-gated-by-us-created"),
        pytest.param(kube.pod("down-other-scheduler", namespace=TEAM,
                              labels={NAMES.gang_name: "o", NAMES.gang_size: "2"})
                     | {"spec": {"schedulerName": "volcano", "containers": [{"name": "main", "image": "busybox"}]}},
                     False, id="gang-of-another-scheduler-created"),
        pytest.param(kube.pod("down-skip", namespace=TEAM, annotations={
            NAMES.gang_name: "s", NAMES.gang_size: "2", NAMES.skip: "true"}), False,
            id="opted-out-by-annotation-created"),
    ],
)
def test_with_the_webhook_down_only_gated_gang_members_are_refused_saying_what_to_do(
    webhook_down: Release, pod: dict[str, Any], refused: bool
) -> None:
    """A member admitted without its gate would start alone; every other pod fails open as before."""
    done = webhook_down.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert (done.returncode != 0) is refused, done.stderr
    if refused:
        assert f'failed calling webhook "{GANG_ENTRY}"' in done.stderr, done.stderr


@pytest.fixture
def webhook_down(release: Release) -> Iterator[Release]:
    """The release with its webhook stopped (nothing listens on its port), started again afterwards."""
    release.webhook.stop()
    try:
        yield release
    finally:
        release.webhook.start()
        release.webhook.wait_http_ok(f"https://127.0.0.1:{release.port}/readyz", ssl_context=release.trust(),
                                     timeout_seconds=60)


def test_upgrade_keeps_the_tls_secret_and_the_injected_ca_bundle(release: Release) -> None:
    cluster = release.cluster
    before = release.secret()
    helm.install(kubeconfig=cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE,
                 values=values(release.port, log_level="DEBUG"))
    # Helm's three-way merge leaves a field the chart never renders: the API server still trusts the webhook.
    assert release.ca_bundle() == before["ca.crt"]
    assert release.secret() == before
    assert "log_level: DEBUG" in cluster.kubectl_json("get", "configmap", f"{PREFIX}-config", "-n",
                                                      NAMESPACE)["data"]["config.yaml"]
    mutated = create(cluster, kube.pod("after-upgrade", namespace=TEAM, gpus=1))
    assert mutated["spec"]["priorityClassName"] == "gpu-steward-normal"


@pytest.mark.parametrize(
    ("verb", "namespace", "allowed"),
    [
        pytest.param("list", NAMESPACE, "yes", id="list-in-the-release-namespace"),
        pytest.param("watch", NAMESPACE, "yes", id="watch-in-the-release-namespace"),
        pytest.param("update", NAMESPACE, "no", id="never-writes-it"),
        pytest.param("list", TEAM, "no", id="nowhere-else"),
    ],
)
def test_installed_webhook_may_watch_the_descheduler_lease_and_nothing_more(
    release: Release, verb: str, namespace: str, allowed: str,
) -> None:
    """It gates pods for placement at release only while it sees the descheduler's leader Lease renewed."""
    account = f"system:serviceaccount:{NAMESPACE}:{PREFIX}-webhook"
    done = release.cluster.kubectl("auth", "can-i", verb, "leases.coordination.k8s.io", "-n", namespace,
                                   "--as", account, check=False)
    assert done.stdout.strip() == allowed, done.stderr


@pytest.mark.parametrize("component", ["webhook", "descheduler"])
@pytest.mark.parametrize(("verb", "allowed"), [
    pytest.param("list", "yes", id="list"), pytest.param("watch", "yes", id="watch"),
    pytest.param("create", "no", id="never-creates")])
@pytest.mark.parametrize("kind", ["deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates",
                                  "devicetaintrules"])
def test_components_may_read_dra_objects_and_nothing_more(
    release: Release, component: str, verb: str, allowed: str, kind: str,
) -> None:
    """DRA GPUs (common/dra.py): the feeder lists and watches these kinds, cluster-wide, and never writes one."""
    account = f"system:serviceaccount:{NAMESPACE}:{PREFIX}-{component}"
    done = release.cluster.kubectl("auth", "can-i", verb, f"{kind}.resource.k8s.io", "-A", "--as", account,
                                   check=False)
    assert done.stdout.strip() == allowed, done.stderr


KUEUE_GATE = "kueue.x-k8s.io/admission"


def _as_webhook(kubeconfig: pathlib.Path, method: str, path: str, patch: list[dict[str, Any]] | None) -> None:
    """One call as the gate lifter makes it (`common.kube`, a JSON patch; no GET first, which RBAC refuses)."""

    async def call() -> None:
        api = await kube_api.api_client(settings.Kubernetes(kubeconfig=kubeconfig))
        async with api:
            await kube_api.request(api, method, path, body=patch, timeout_seconds=10,
                                   content_type="application/json-patch+json")

    asyncio.run(call())


def _escaped(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# What our gate lifters (the webhook's, the uninstall hook's) may not do to a pod, and the refusal that says so.
REFUSED_CHANGES = [
    pytest.param([{"op": "add", "path": "/metadata/labels/app", "value": "other"}], "labels, owners or finalizers",
                 id="a-label"),
    pytest.param([{"op": "test", "path": "/spec/schedulingGates/1/name", "value": KUEUE_GATE},
                  {"op": "remove", "path": "/spec/schedulingGates/1"}],
                 "may only remove the gpu-steward scheduling gate", id="another-controllers-gate"),
    pytest.param([{"op": "remove", "path": "/spec/schedulingGates/0"},
                  {"op": "replace", "path": "/spec/containers/0/image", "value": "example.com/other:1"}],
                 "may not change a pod's spec", id="our-gate-and-the-image"),
    pytest.param([{"op": "add", "path": f"/metadata/annotations/{_escaped('example.com/note')}", "value": "x"}],
                 "may only write the annotation", id="another-annotation"),
]


@pytest.mark.parametrize(("change", "refused_by"), REFUSED_CHANGES)
def test_the_webhook_may_lift_our_gate_and_change_nothing_else(
    release: Release, change: list[dict[str, Any]], refused_by: str,
) -> None:
    """RBAC grants the webhook `patch` on every pod (its gate lifter); the chart's ValidatingAdmissionPolicy
    (templates/pod-writes-policy.yaml) narrows that, in the API server, to what the lifter writes: our gate out and
    our release annotation (`gate_patch.ungate` + `gate_patch.annotate`, as admission/gate_lifter.py sends them)."""
    cluster = release.cluster
    name = f"held-{secrets.token_hex(3)}"
    pod = create(cluster, kube.pod(name, namespace=TEAM, gates=[NAMES.gate, KUEUE_GATE], labels={"app": "a"},
                                   annotations={"example.com/kept": "1"}))
    account = release.as_service_account("webhook")
    try:
        with pytest.raises(kube_api.ApiError, match="ValidatingAdmissionPolicy") as refused:
            _as_webhook(account, "PATCH", f"/api/v1/namespaces/{TEAM}/pods/{name}", change)
        assert (refused.value.status, refused_by in str(refused.value)) == (422, True), refused.value
        assert cluster.kubectl_json("get", "pod", name, "-n", TEAM)["metadata"]["resourceVersion"] == \
            pod["metadata"]["resourceVersion"], "refused: nothing changed"
        # What the gate lifter sends passes.
        lift = [gate_patch.annotate(pod, key=NAMES.release, value="released by the e2e"),
                *gate_patch.ungate(pod, gate=NAMES.gate)]
        _as_webhook(account, "PATCH", f"/api/v1/namespaces/{TEAM}/pods/{name}", lift)
        after = cluster.kubectl_json("get", "pod", name, "-n", TEAM)
        assert (kube.gates(after), after["metadata"]["annotations"][NAMES.release]) == (
            [KUEUE_GATE], "released by the e2e")
        with pytest.raises(kube_api.ApiError) as deleting:  # RBAC: no delete
            _as_webhook(account, "DELETE", f"/api/v1/namespaces/{TEAM}/pods/{name}", None)
        assert deleting.value.status == 403, deleting.value
        # Anyone else is not bound by the policy.
        cluster.kubectl("-n", TEAM, "label", "pod", name, "app=other", "--overwrite")
    finally:
        cluster.kubectl("delete", "pod", name, "-n", TEAM, "--ignore-not-found", "--wait=false", check=False)


@pytest.mark.parametrize(("change", "refused_by"), REFUSED_CHANGES)
def test_the_uninstall_hook_may_lift_our_gate_and_nothing_more(
    release: Release, change: list[dict[str, Any]], refused_by: str,
) -> None:
    """The pre-delete hook's ServiceAccount and RBAC (applied here as rendered, without the Job, which kwok
    cannot run) allow what `gpu-steward release-gates` does: list pods cluster-wide, JSON-patch our gate out. The
    chart's ValidatingAdmissionPolicy, re-rendered with the hook on, binds its ServiceAccount too: every other
    change it tries is refused by the API server."""
    cluster = release.cluster
    rendered = helm.template(helm.local_values(release.port, releaseGates={"enabled": True}), release=RELEASE,
                             namespace=NAMESPACE, extra=["--show-only", "templates/release-gates.yaml",
                                                         "--show-only", "templates/pod-writes-policy.yaml"])
    installed_policy = helm.template(helm.local_values(release.port), release=RELEASE, namespace=NAMESPACE,
                                     extra=["--show-only", "templates/pod-writes-policy.yaml"])
    hook_objects = [o for o in rendered if o["kind"] != "Job"]
    cluster.apply(hook_objects)
    name = f"held-{secrets.token_hex(3)}"
    try:
        gated = create(cluster, kube.pod(name, namespace=TEAM, gates=[NAMES.gate, KUEUE_GATE], labels={"app": "a"},
                                         annotations={"example.com/kept": "1"}))
        assert kube.gates(gated) == [NAMES.gate, KUEUE_GATE]
        hook = as_service_account(cluster, "release-gates", release.workdir)

        def as_hook(*args: str) -> str:
            return helm._kubectl(hook, *args)

        def refused(dry_run: bool) -> str | None:
            """The policy's refusal of `change`, or None if the API server took it."""
            try:
                as_hook("-n", TEAM, "patch", "pod", name, "--type=json", "-p", json.dumps(change),
                        *(["--dry-run=server"] if dry_run else []))
            except helm.HelmError as error:
                assert "ValidatingAdmissionPolicy" in str(error), error  # refused by the policy, nothing else
                return str(error)
            return None

        # The API server takes a changed policy in within a second or so: wait for it on server-side dry runs
        # (admission runs on them, nothing is stored), then try for real.
        kube.poll("the policy binds the hook's ServiceAccount", lambda: refused(True), timeout_seconds=30)
        said = refused(False)
        assert said is not None and refused_by in said, said
        assert cluster.kubectl_json("get", "pod", name, "-n", TEAM)["metadata"]["resourceVersion"] == \
            gated["metadata"]["resourceVersion"], "refused: nothing changed"

        listed = json.loads(as_hook("get", "pods", "-A", "-o", "json"))["items"]
        assert f"{TEAM}/{name}" in {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in listed}
        patch = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": NAMES.gate},
                 {"op": "remove", "path": "/spec/schedulingGates/0"}]  # as `gpu-steward release-gates` sends it
        as_hook("-n", TEAM, "patch", "pod", name, "--type=json", "-p", json.dumps(patch))
        after = cluster.kubectl_json("get", "pod", name, "-n", TEAM)
        assert (kube.gates(after), after["metadata"]["labels"]) == ([KUEUE_GATE], {"app": "a"})
        with pytest.raises(helm.HelmError, match="forbidden"):  # and nothing beyond pods
            as_hook("-n", TEAM, "delete", "pod", name)
    finally:
        cluster.apply(installed_policy)  # the release's own policy again (the webhook's ServiceAccount alone)
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [o for o in hook_objects
                                                            if not o["kind"].startswith("ValidatingAdmission")]}),
            check=False)
        cluster.kubectl("delete", "pod", name, "-n", TEAM, "--ignore-not-found", check=False)


@pytest.fixture
def descheduler(release: Release, prometheus_factory: prometheus.StartPrometheus) -> Iterator[
        tuple[localcluster.ManagedProcess, prometheus.PrometheusServer]]:
    """The descheduler as the chart configures it, under its ServiceAccount, with short intervals and a real
    Prometheus holding idle DCGM history of the pods that are running at start."""
    cluster = release.cluster
    dcgm = prometheus_factory(test_reclaim_e2e.dcgm_history(cluster, TEAM),
                              now=time.time() + test_reclaim_e2e.AHEAD_SECONDS)
    config = settings.merge(yaml.safe_load(release.files.config.read_text()), {
        "prometheus": {"url": dcgm.url, "occupancy_refresh_seconds": 1},
        "descheduler": {
            "leader_election": {"lease_duration_seconds": 6, "renew_deadline_seconds": 4, "retry_period_seconds": 1},
            "reclaim": {"interval_seconds": 1, "conventions": {"evict_bare_pods": True},  # the test's pods are bare
                        "cooldowns": {"preemptor_seconds": 0, "node_seconds": 0, "workload_seconds": 0}},
            "gangs": {"resync_seconds": 1},
        },
    })
    config_file = release.workdir / "descheduler.yaml"
    config_file.write_text(yaml.safe_dump(config))
    sa = release.as_service_account("descheduler")
    process = _python("descheduler", log=release.workdir / "descheduler.log", env={
        **release.files.descheduler_env, "GPU_STEWARD_CONFIG": str(config_file),
        "GPU_STEWARD_KUBERNETES__KUBECONFIG": str(sa)})
    process.start()
    try:
        lease = config["descheduler"]["leader_election"]["lease_name"]

        def leads() -> bool:
            holder = cluster.kubectl("get", "lease", lease, "-n", NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}",
                                     check=False)
            assert process.running(), process.log_tail(40)
            return holder.stdout.startswith(PREFIX)

        kube.poll("descheduler leads", leads, timeout_seconds=60)
        yield process, dcgm
    finally:
        process.stop()


@pytest.mark.prometheus
def test_descheduler_releases_a_gang_reclaims_an_idle_pod_and_aggregates_events_under_the_chart_rbac(
    release: Release, request: pytest.FixtureRequest
) -> None:
    cluster = release.cluster
    cluster.kubectl("delete", "pods", "--all", "-n", TEAM, "--grace-period=0", "--force")  # earlier tests' pods
    kube.wait_gpus_free(cluster)
    reclaimable = kube.priority_class("chart-e2e-reclaimable", value=1000)
    reclaimable["metadata"]["annotations"] = {
        policy.MIN_PRIORITY: "1000", policy.TOLERATION: "0", policy.IDLE_SECONDS[0]: "10", policy.THRESHOLD[0]: "5"}
    cluster.apply([reclaimable])
    small = sorted(n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes")["items"]
                   if n["status"]["capacity"].get(gpu.FULL_GPU) == "2")

    def pinned(name: str, node: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        return kube.pod(name, namespace=TEAM, gpus=2, labels=labels, priority_class="chart-e2e-reclaimable",
                        node_selector={"kubernetes.io/hostname": node})

    for obj in (pinned("idle-free", small[0]), pinned("idle-guarded", small[1], {"app": "guarded"}),
                kube.pod_disruption_budget("guard", namespace=TEAM, match_labels={"app": "guarded"}, min_available=1)):
        cluster.kubectl("create", "-f", "-", input=json.dumps(obj))
    for name in ("idle-free", "idle-guarded"):
        kube.poll(f"{name} running", test_reclaim_e2e.phase_is(cluster, TEAM, name, "Running"))
    cluster.kubectl("wait", "--for=jsonpath={.status.currentHealthy}=1", "pdb/guard", "-n", TEAM, "--timeout=30s")
    # A class whose reclaim policy cannot be read: each descheduler process says so once, in the same Event.
    broken = kube.priority_class("chart-e2e-broken", value=10)
    broken["metadata"]["annotations"] = {policy.IDLE_SECONDS[0]: "soon"}
    cluster.apply([broken])
    request.addfinalizer(lambda: cluster.kubectl("delete", "priorityclass", "chart-e2e-broken", "--ignore-not-found",
                                                 check=False))
    process, _ = request.getfixturevalue("descheduler")

    # A gang: the webhook gates both members at creation, the descheduler (pods patch) releases them together.
    labels = {NAMES.gang_name: "pair", NAMES.gang_size: "2"}
    gated = [create(cluster, kube.pod(f"pair-{i}", namespace=TEAM, gpus=4, labels=labels)) for i in range(2)]
    assert all(NAMES.gate in kube.gates(p) for p in gated)
    for name in ("want-free", "want-guarded"):  # the scheduler cannot preempt for equal priority
        node = small[0] if name == "want-free" else small[1]
        cluster.kubectl("create", "-f", "-", input=json.dumps(pinned(name, node)))

    guarded = f"PodDisruptionBudget {TEAM}/guard allows 0 disruption(s); evicting {TEAM}/idle-guarded needs 1"

    def outcome() -> dict[str, Any] | None:
        pods = kube.pods(cluster, TEAM)
        members = [pods.get(f"pair-{i}", {}) for i in range(2)]
        released = all(m and not kube.gates(m) and m["spec"].get("nodeName") for m in members)
        evicted = "idle-free" not in pods and pods["want-free"]["spec"].get("nodeName")
        # The budget listed under the chart's RBAC is in the plan: idle-guarded is no victim, and said so.
        told = guarded in process.log_file.read_text(errors="replace")
        return pods if released and evicted and told else None

    try:
        kube.poll("gang released, idle-free evicted, the budget told", outcome, timeout_seconds=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ndescheduler log:\n{process.log_tail(60)}") from None
    assert kube.events_about(cluster, TEAM, "idle-free", reason="IdleGPUReclaimed")
    assert not kube.events_about(cluster, TEAM, "idle-guarded", reason="EvictionBlocked")  # never tried

    # A second process (a new leader) says the same again: the Event is read (get) and its count patched.
    process.stop()
    process.start()

    def invalid() -> list[dict[str, Any]] | None:
        said = [e for e in kube.events(cluster, "default", reason="ReclaimPolicyInvalid")
                if e["involvedObject"].get("name") == "chart-e2e-broken"]
        return said if said and said[0].get("count", 1) > 1 else None

    try:
        assert len(kube.poll("ReclaimPolicyInvalid repeated", invalid, timeout_seconds=60)) == 1
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ndescheduler log:\n{process.log_tail(60)}") from None
    forbidden = [line for line in process.log_tail(400).splitlines() if "403" in line or "forbidden" in line]
    assert forbidden == []


def test_with_one_domain_claims_the_uninstall_hook_makes_a_pods_claim_and_no_other(release: Release) -> None:
    """`settings.dra.domain_claims`: the hook's ServiceAccount, RBAC and the chart's `<fullname>-claim-writes` policy
    (applied as rendered, without the Job) let `gpu-steward release-gates` make a pod's claim of its own before it
    lifts our gate, and refuse it a claim no pod owns; the webhook's and the descheduler's ServiceAccounts, under
    their ClusterRoles as rendered with the setting, may make a pod-owned claim and no other (server-side dry runs)."""
    cluster = release.cluster
    on = {"releaseGates": {"enabled": True}, "settings": {"dra": {"domain_claims": True}}}
    rendered = helm.template(helm.local_values(release.port, **on), release=RELEASE, namespace=NAMESPACE,
                             extra=["--show-only", "templates/release-gates.yaml",
                                    "--show-only", "templates/pod-writes-policy.yaml"])
    installed_policy = helm.template(helm.local_values(release.port), release=RELEASE, namespace=NAMESPACE,
                                     extra=["--show-only", "templates/pod-writes-policy.yaml"])
    lifters = (f"{PREFIX}-webhook", f"{PREFIX}-descheduler")  # their ClusterRoles, as rendered with the setting
    roles = [o for o in helm.template(helm.local_values(release.port, **on), release=RELEASE, namespace=NAMESPACE)
             if o["kind"] == "ClusterRole" and o["metadata"]["name"] in lifters]
    installed_roles = [o for o in helm.template(helm.local_values(release.port), release=RELEASE, namespace=NAMESPACE)
                       if o["kind"] == "ClusterRole" and o["metadata"]["name"] in lifters]
    hook_objects = [o for o in rendered if o["kind"] != "Job"] + roles
    assert f"{PREFIX}-claim-writes" in {o["metadata"]["name"] for o in hook_objects}
    name, claim = f"own-{secrets.token_hex(3)}", f"own-{secrets.token_hex(3)}-gpus-0a1b2c3d"
    template = builders.claim_template("t4", namespace=TEAM, spec=builders.claim_spec(4))
    cluster.apply([builders.device_class(), template, *hook_objects])
    try:
        pod = kube.pod(name, namespace=TEAM, gates=[NAMES.gate],
                       annotations={NAMES.domain_claim: dra.Record("gpus", claim, "t4").text()})
        pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
        pod["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": "gpus"}]
        create(cluster, pod)
        hook = as_service_account(cluster, "release-gates", release.workdir)
        stray = release.workdir / f"{name}-stray-claim.json"
        stray.write_text(json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                     "metadata": {"name": f"stray-{name}", "namespace": TEAM},
                                     "spec": template["spec"]["spec"]}))

        def refused() -> str | None:
            try:
                helm._kubectl(hook, "create", "--dry-run=server", "-f", str(stray))
            except helm.HelmError as error:
                assert "ValidatingAdmissionPolicy" in str(error), error  # refused by the policy, not RBAC
                return str(error)
            return None

        said = kube.poll("the claim policy binds the hook's ServiceAccount", refused, timeout_seconds=30)
        assert "may only create ResourceClaims that a pod owns" in said, said
        owned = release.workdir / f"{name}-owned-claim.json"
        uid = cluster.kubectl_json("get", "pod", name, "-n", TEAM)["metadata"]["uid"]
        owned.write_text(json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
            "name": f"owned-{name}", "namespace": TEAM, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}]},
            "spec": template["spec"]["spec"]}))
        for component in ("webhook", "descheduler"):  # the other lifters: a pod-owned claim, and no other
            account = as_service_account(cluster, component, release.workdir)
            helm._kubectl(account, "create", "--dry-run=server", "-f", str(owned))
            with pytest.raises(helm.HelmError, match="may only create ResourceClaims that a pod owns"):
                helm._kubectl(account, "create", "--dry-run=server", "-f", str(stray))
        done = subprocess.run([sys.executable, "-m", "gpu_steward", "release-gates", "-n", TEAM, "--kubeconfig",
                               str(hook)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(conftest.REPO)})
        assert done.returncode == 0, done.stdout + done.stderr
        made = cluster.kubectl_json("get", "resourceclaim", claim, "-n", TEAM)
        owner = cluster.kubectl_json("get", "pod", name, "-n", TEAM)
        assert [(o["kind"], o["uid"]) for o in made["metadata"]["ownerReferences"]] == [
            ("Pod", owner["metadata"]["uid"])]
        assert kube.gates(owner) == []
    finally:
        cluster.apply([*installed_policy, *installed_roles])
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [o for o in hook_objects if o not in roles
                                                            and not o["kind"].startswith("ValidatingAdmission")]}),
            check=False)
        for kind, objects in (("pod", name), ("resourceclaimtemplate", "t4")):
            cluster.kubectl("delete", kind, objects, "-n", TEAM, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "validatingadmissionpolicy,validatingadmissionpolicybinding",
                        f"{PREFIX}-claim-writes", "--ignore-not-found", check=False)


def test_uninstall_removes_the_tls_secret_and_the_leases(release: Release) -> None:
    """Last in this module: the Secret (the CA's private key) and the Leases belong to the release (rendered
    empty, filled in at run time), so uninstall deletes them."""
    cluster = release.cluster
    lease_names = [NAMES_SETTINGS.descheduler.leader_election.lease_name,
                   NAMES_SETTINGS.descheduler.reclaim.cooldown_lease_name]
    assert set(release.secret()) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}  # filled in by the webhook
    for name in lease_names:
        cluster.kubectl("get", "lease", name, "-n", NAMESPACE)
    release.webhook.stop()
    helm.uninstall(kubeconfig=cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE)
    left = cluster.kubectl("get", "secret,lease", "-n", NAMESPACE, "-o", "name", check=False).stdout.split()
    assert f"secret/{PREFIX}-webhook-tls" not in left
    assert not [name for name in lease_names if f"lease.coordination.k8s.io/{name}" in left], left
