"""Helm driving for the chart tests and the end-to-end suite: render, install, uninstall, local webhook.

The end-to-end suite (a real control plane, no kubelet that can run our image) installs the chart with
`local_webhook_values(port)`: the MutatingWebhookConfiguration then calls `https://127.0.0.1:PORT/mutate`
with the chart's own CA, and `webhook_files()` hands back the chart-rendered settings and the chart-made
TLS Secret as files, so `gpu-steward webhook` runs on this machine exactly as the chart configured it:

    helm.install(kubeconfig=kc, release="gs", namespace="gpu-steward", values=helm.local_webhook_values(port))
    files = helm.webhook_files(kubeconfig=kc, release="gs", namespace="gpu-steward", dest=tmp_path)
    env = {**os.environ, **files.env, "GPU_STEWARD_KUBERNETES__KUBECONFIG": str(kc)}
    # python -m gpu_steward webhook --host 127.0.0.1 --port PORT   (with env=env), wait for /readyz
    # (trust files.ca), then create pods: the API server calls it through the chart's configuration.
    helm.uninstall(kubeconfig=kc, release="gs", namespace="gpu-steward")

Checked by hand against the 1.36.3 control plane (localcluster): install, a GPU pod created with kubectl got
its tier from the locally running webhook, a `gpu-steward.io/skip=true` pod was not sent to it, an upgrade
kept the CA and serving certificate (`lookup`), and uninstall removed the configuration and the classes.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpu-steward"
# Where hack/controlplane/build.sh puts helm (built from Go modules: it reports Kubernetes v1.20 as its
# default, so every render passes --kube-version).
BUILT_HELM = pathlib.Path.home() / ".cache" / "gpu-steward" / "k8s-1.37.2" / "bin" / "helm"
KUBE_VERSION = "1.30.0"
TIMEOUT_SECONDS = 120


class HelmError(Exception):
    """helm is missing or exited non-zero; the message carries its stderr."""


def helm_binary() -> pathlib.Path:
    """$HELM, else the control-plane build's helm, else helm on PATH."""
    for candidate in (os.environ.get("HELM"), str(BUILT_HELM), shutil.which("helm")):
        if candidate and pathlib.Path(candidate).is_file():
            return pathlib.Path(candidate)
    raise HelmError(f"no helm binary: set $HELM or run hack/controlplane/build.sh (expects {BUILT_HELM})")


def helm(*args: str, values: Mapping[str, Any] | None = None, timeout_seconds: float = TIMEOUT_SECONDS) -> str:
    """Run helm; `values` go in as a values file on stdin (`-f -`), which keeps YAML types exactly."""
    stdin = None
    if values is not None:
        args = (*args, "--values", "-")
        stdin = yaml.safe_dump(dict(values))
    result = subprocess.run(
        [str(helm_binary()), *args], input=stdin, capture_output=True, text=True, timeout=timeout_seconds, check=False
    )
    if result.returncode != 0:
        raise HelmError(f"helm {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def template(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "gs",
    namespace: str = "gpu-steward",
    kube_version: str = KUBE_VERSION,
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` of the chart; the rendered objects, in order."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", kube_version, *extra]
    out = helm(*args, values=values)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def install(
    *,
    kubeconfig: pathlib.Path,
    release: str,
    namespace: str,
    values: Mapping[str, Any] | None = None,
    wait: bool = False,
) -> str:
    """`helm upgrade --install` (so a second call is an upgrade) into the cluster of `kubeconfig`."""
    args = ["upgrade", "--install", release, str(CHART), "--namespace", namespace, "--create-namespace",
            "--kubeconfig", str(kubeconfig)]
    if wait:
        args += ["--wait", f"--timeout={TIMEOUT_SECONDS}s"]
    return helm(*args, values=values)


def uninstall(*, kubeconfig: pathlib.Path, release: str, namespace: str) -> str:
    return helm("uninstall", release, "--namespace", namespace, "--kubeconfig", str(kubeconfig), "--wait")


def local_webhook_values(port: int, **overrides: Any) -> dict[str, Any]:
    """Values that register the webhook at https://127.0.0.1:PORT/mutate (a process on this machine).

    No in-cluster webhook replicas, labeler or descheduler: on kwok nothing would really run them.
    """
    values: dict[str, Any] = {
        "webhook": {
            "url": f"https://127.0.0.1:{port}/mutate",
            "replicas": 0,
            "podDisruptionBudget": {"enabled": False},
        },
        "tls": {"selfSigned": {"ipAddresses": ["127.0.0.1"]}},
        "descheduler": {"enabled": False},
        "labeler": {"enabled": False},
    }
    return _merge(values, overrides)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


@dataclasses.dataclass(frozen=True)
class WebhookFiles:
    config: pathlib.Path  # the chart's config.yaml (ConfigMap)
    cert: pathlib.Path  # tls.crt of the chart's Secret
    key: pathlib.Path
    ca: pathlib.Path  # what the MutatingWebhookConfiguration's caBundle holds
    env: dict[str, str]  # the chart's environment for the webhook container, with local file paths


def webhook_files(*, kubeconfig: pathlib.Path, release: str, namespace: str, dest: pathlib.Path,
                  kubectl: pathlib.Path | None = None) -> WebhookFiles:
    """Write the installed release's settings file and webhook TLS material under `dest`."""
    binary = str(kubectl or BUILT_HELM.with_name("kubectl"))
    prefix = release if "gpu-steward" in release else f"{release}-gpu-steward"

    def get(kind: str, name: str) -> dict[str, Any]:
        result = subprocess.run(
            [binary, "--kubeconfig", str(kubeconfig), "-n", namespace, "get", kind, name, "-o", "json"],
            capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False,
        )
        if result.returncode != 0:
            raise HelmError(f"kubectl get {kind} {name}: {result.stderr.strip()}")
        document: dict[str, Any] = json.loads(result.stdout)
        return document

    dest.mkdir(parents=True, exist_ok=True)
    config = dest / "config.yaml"
    config.write_text(get("configmap", f"{prefix}-config")["data"]["config.yaml"])
    secret = get("secret", f"{prefix}-webhook-tls")["data"]
    paths = {}
    for field, name in (("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("ca.crt", "ca.crt")):
        path = dest / name
        path.write_bytes(base64.b64decode(secret[field]))
        paths[field] = path
    paths["tls.key"].chmod(0o600)
    container = get("deployment", f"{prefix}-webhook")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env.update({"GPU_STEWARD_CONFIG": str(config), "GPU_STEWARD_WEBHOOK__CERT_FILE": str(paths["tls.crt"]),
                "GPU_STEWARD_WEBHOOK__KEY_FILE": str(paths["tls.key"])})
    return WebhookFiles(config=config, cert=paths["tls.crt"], key=paths["tls.key"], ca=paths["ca.crt"], env=env)
