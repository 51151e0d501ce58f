"""The README's "Install on your cluster" and its uninstall, run as written on the project's real control plane,
ending with `helm test` passing, then `gpu-steward release-gates` and `helm uninstall`.

What differs from a real cluster, and only that: kwok nodes cannot run our image (and no Docker engine builds
it here: the `docker buildx bake` line is checked offline by tests/chart/test_readme.py). So, as in
tests/e2e/test_chart_e2e.py, the README's `helm install` gets one extra values file, `helm.local_values(port)`:
the webhook is registered by URL at a process on this machine, and its Deployment has no replicas. The
descheduler's Deployment keeps its replica (kwok reports it Running and Ready, so `rollout status` waits for it)
while the real descheduler runs here. Both processes run with the release's own settings file and environment,
under the chart's ServiceAccounts. `helm test`'s pod is run the way a kubelet would: its container's command
runs here (the Service's DNS name and the mounted CA file mapped to this machine's port and a file with the same
CA), and its exit code becomes the pod's phase.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from common import settings
from gpu_steward import cmd_check
from gpu_steward_lab import localcluster
from tests.chart import helm, readme
from tests.e2e import test_chart_e2e
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
TEAM = "team"


@pytest.fixture(scope="module")
def cluster() -> Iterator[localcluster.LocalCluster]:
    """A cluster of its own: the chart's webhook and PriorityClasses are cluster-wide."""
    own = localcluster.LocalCluster(localcluster.ensure_binaries()).start()
    try:
        own.add_nodes(localcluster.gpu_nodes("2x8g2d", names=NAMES))
        yield own
    finally:
        own.stop()


def _words(command: readme.Command, kubeconfig: pathlib.Path) -> list[str]:
    """The command's words with this cluster's kubeconfig, and the chart path resolved from the repository."""
    words = [str(helm.CHART) if (readme.REPO / w).resolve() == helm.CHART else w for w in command.words[1:]]
    return [*words, "--kubeconfig", str(kubeconfig)]


def _run_test_pod(cluster: localcluster.LocalCluster, *, namespace: str, port: int, ca_file: pathlib.Path,
                  config: pathlib.Path, log: pathlib.Path) -> int:
    """Play kubelet for the release's `helm test` pod: run its container here, then report its exit code."""
    def started() -> dict[str, Any] | None:
        for pod in cluster.kubectl_json("get", "pods", "-n", namespace)["items"]:
            if (pod["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test" \
                    and pod["status"].get("phase") == "Running":  # kwok made it Running: it will not touch it again
                return dict(pod)
        return None

    pod = kube.poll("helm test pod running", started, timeout_seconds=60)
    (container,) = pod["spec"]["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    args = []
    for arg in container["args"]:
        name, _, value = arg.partition("=")
        if name == "--webhook":
            assert value.endswith(f".{namespace}.svc:443"), value  # the Service, by its cluster DNS name
            arg = f"--webhook=https://127.0.0.1:{port}"
        elif name == "--ca-file":
            assert mounts[str(pathlib.PurePosixPath(value).parent)] == "ca", mounts  # the TLS Secret's ca.crt
            arg = f"--ca-file={ca_file}"
        args.append(arg)
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    assert "GPU_STEWARD_CONFIG" in env, env
    env["GPU_STEWARD_CONFIG"] = str(config)  # the ConfigMap's file: the same file here
    done = subprocess.run([sys.executable, "-m", "gpu_steward", *args], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, **env})
    log.write_text(done.stdout + done.stderr)
    terminated = {"exitCode": done.returncode, "reason": "Completed" if done.returncode == 0 else "Error",
                  "startedAt": pod["status"].get("startTime"), "finishedAt": pod["status"].get("startTime")}
    status = {"phase": "Succeeded" if done.returncode == 0 else "Failed", "containerStatuses": [{
        "name": container["name"], "image": container["image"], "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": terminated}}]}
    cluster.kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": status}))
    return done.returncode


def test_the_readme_install_runs_as_written_and_helm_test_passes(
    cluster: localcluster.LocalCluster, tmp_path: pathlib.Path
) -> None:
    commands = readme.blocks()["install"]
    install = readme.one(commands, "helm", "install")
    release, namespace = install.positional()[2], install.option("--namespace")
    assert namespace
    prefix = release if "gpu-steward" in release else f"{release}-gpu-steward"
    port = localcluster.free_port()
    local = helm.local_values(port, descheduler={"replicas": 1})

    helm.helm(*_words(install, cluster.kubeconfig), values=local)
    files = helm.release_files(kubeconfig=cluster.kubeconfig, release=release, namespace=namespace,
                               dest=tmp_path / "release")

    def account(component: str) -> pathlib.Path:
        return helm.service_account_kubeconfig(kubeconfig=cluster.kubeconfig, namespace=namespace,
                                               service_account=f"{prefix}-{component}",
                                               dest=tmp_path / f"{component}.kubeconfig")

    webhook = test_chart_e2e._python("webhook", log=tmp_path / "webhook.log",
                                     args=("--host", "127.0.0.1", "--port", str(port)),
                                     env={**files.webhook_env, "GPU_STEWARD_KUBERNETES__KUBECONFIG": str(account(
                                         "webhook"))})
    descheduler = test_chart_e2e._python("descheduler", log=tmp_path / "descheduler.log", env={
        **files.descheduler_env, "GPU_STEWARD_KUBERNETES__KUBECONFIG": str(account("descheduler"))})
    try:
        webhook.start()
        descheduler.start()

        def secret() -> dict[str, str]:
            data: dict[str, str] = cluster.kubectl_json("get", "secret", f"{prefix}-webhook-tls", "-n",
                                                        namespace).get("data") or {}
            return data

        kube.poll("webhook TLS Secret filled in", lambda: "ca.crt" in secret(), timeout_seconds=60)
        ca_file = tmp_path / "ca.crt"
        ca_file.write_bytes(base64.b64decode(secret()["ca.crt"]))

        for command in commands:
            if command.words[:1] == ["kubectl"]:
                cluster.kubectl(*command.words[1:], "--timeout=120s", timeout_seconds=150)
        # kwok reports the descheduler's pod Ready at once; its process here is ready once it leads.
        lease = settings.Settings().descheduler.leader_election.lease_name

        def leads() -> bool:
            assert descheduler.running(), descheduler.log_tail(40)
            holder = cluster.kubectl("get", "lease", lease, "-n", namespace, "-o",
                                     "jsonpath={.spec.holderIdentity}", check=False)
            return holder.stdout.startswith(prefix)

        kube.poll("descheduler leads", leads, timeout_seconds=60)

        def webhook_saw_it() -> bool:
            """The webhook counts the descheduler from its next Lease renewal after the webhook's own start (the
            first sight of a Lease proves nothing): what `helm test` checks, polled, not raced."""
            context = ssl.create_default_context(cafile=str(ca_file))
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=10) as answer:
                return cmd_check.lease_check(answer.read().decode(), stale_after=3600)[0]

        kube.poll("webhook has seen the Lease renewed", webhook_saw_it, timeout_seconds=60)

        test = readme.one(commands, "helm", "test")
        outcome: dict[str, Any] = {}

        def run_helm_test() -> None:
            try:
                outcome["stdout"] = helm.helm(*_words(test, cluster.kubeconfig), "--timeout=120s",
                                              timeout_seconds=150)
            except helm.HelmError as exc:
                outcome["error"] = str(exc)

        runner = threading.Thread(target=run_helm_test, name="helm-test")
        runner.start()
        try:
            check_log = tmp_path / "check.log"
            code = _run_test_pod(cluster, namespace=namespace, port=port, ca_file=ca_file, config=files.config,
                                 log=check_log)
        finally:
            runner.join(timeout=180)
        assert code == 0, f"{check_log.read_text()}\ndescheduler log:\n{descheduler.log_tail(40)}"
        assert "ok   a descheduler leads" in check_log.read_text()  # not skipped: the chart has a descheduler
        assert "error" not in outcome, outcome
        assert "Succeeded" in outcome["stdout"], outcome

        # The uninstall block, with a gang member the webhook gated: release-gates lifts our gate first.
        cluster.kubectl("create", "namespace", TEAM)
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", TEAM, "--timeout=30s")
        member = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(kube.pod(
            "waiting", namespace=TEAM, gpus=1, labels={NAMES.gang_name: "g", NAMES.gang_size: "2"}))).stdout)
        assert NAMES.gate in kube.gates(member)
        admin = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        for command in readme.blocks()["uninstall"]:
            if command.words[0] == "gpu-steward":
                done = subprocess.run([sys.executable, "-m", "gpu_steward", *command.words[1:]], env=admin,
                                      capture_output=True, text=True, timeout=120, check=False)
                assert done.returncode == 0, done.stdout + done.stderr
                assert f"{TEAM}/waiting" in done.stdout, done.stdout
            else:
                assert command.words[:2] == ["helm", "uninstall"], command.words
                assert NAMES.gate not in kube.gates(cluster.kubectl_json("get", "pod", "waiting", "-n", TEAM))
                webhook.stop()
                descheduler.stop()
                helm.helm(*_words(command, cluster.kubeconfig), "--wait")
        left = cluster.kubectl("get", "mutatingwebhookconfigurations,priorityclasses", "-o", "name").stdout
        assert prefix not in left and "gpu-steward-normal" not in left, left
    finally:
        webhook.stop()
        descheduler.stop()
        with contextlib.suppress(helm.HelmError):
            helm.uninstall(kubeconfig=cluster.kubeconfig, release=release, namespace=namespace)
