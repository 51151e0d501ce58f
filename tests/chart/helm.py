"""Helm driving for the chart tests and the end-to-end suite: render, install, uninstall, and running the
chart's components on this machine under the chart's own ServiceAccounts.

The end-to-end suite (a real control plane, no kubelet that can run our image) installs the chart with
`local_values(port)`: the MutatingWebhookConfiguration then calls `https://127.0.0.1:PORT/mutate`, and
the webhook (tls.mode managed) creates its TLS Secret and writes its CA into that configuration itself.
`release_files()` hands back the chart-rendered settings file and each Deployment's environment, and
`service_account_kubeconfig()` a kubeconfig holding a token of one of the chart's ServiceAccounts, so
`gpu-steward webhook` and `gpu-steward descheduler` run here exactly as the chart configured them, with
only the permissions its RBAC grants:

    helm.install(kubeconfig=kc, release="gs", namespace="gpu-steward", values=helm.local_values(port))
    files = helm.release_files(kubeconfig=kc, release="gs", namespace="gpu-steward", dest=tmp_path)
    sa = helm.service_account_kubeconfig(kubeconfig=kc, namespace="gpu-steward",
                                         service_account="gs-gpu-steward-webhook", dest=tmp_path / "wh.kubeconfig")
    env = {**os.environ, **files.webhook_env, "GPU_STEWARD_KUBERNETES__KUBECONFIG": str(sa)}
    # python -m gpu_steward webhook --host 127.0.0.1 --port PORT   (with env=env)
    helm.uninstall(kubeconfig=kc, release="gs", namespace="gpu-steward")
"""

from __future__ import annotations

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


def local_values(port: int, **overrides: Any) -> dict[str, Any]:
    """Values that register the webhook at https://127.0.0.1:PORT/mutate (a process on this machine).

    No in-cluster pods: kwok would only pretend to run them. The descheduler's Deployment (0 replicas)
    still brings its ServiceAccount, RBAC and environment; the labeler and the pre-delete hook Job are off.
    """
    values: dict[str, Any] = {
        "webhook": {"url": f"https://127.0.0.1:{port}/mutate", "replicas": 0},
        "settings": {"webhook": {"managed_tls": {"ip_addresses": ["127.0.0.1"]}}},
        "descheduler": {"replicas": 0},
        "labeler": {"enabled": False},
        "releaseGates": {"enabled": False},
    }
    return _merge(values, overrides)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


@dataclasses.dataclass(frozen=True)
class ReleaseFiles:
    config: pathlib.Path  # the chart's config.yaml (ConfigMap)
    webhook_env: dict[str, str]  # the webhook container's environment, TLS files under dest/tls
    descheduler_env: dict[str, str]  # the descheduler container's, downward-API values filled in
    tls_dir: pathlib.Path  # where the webhook writes its serving pair


def _kubectl(kubeconfig: pathlib.Path, *args: str) -> str:
    result = subprocess.run([str(BUILT_HELM.with_name("kubectl")), "--kubeconfig", str(kubeconfig), *args],
                            capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)
    if result.returncode != 0:
        raise HelmError(f"kubectl {' '.join(args[:3])}: {result.stderr.strip()}")
    return result.stdout


def _container_env(container: dict[str, Any], *, namespace: str, pod_name: str) -> dict[str, str]:
    downward = {"metadata.namespace": namespace, "metadata.name": pod_name}
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = downward[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def release_files(*, kubeconfig: pathlib.Path, release: str, namespace: str, dest: pathlib.Path) -> ReleaseFiles:
    """Write the installed release's settings file under `dest`; return it with the containers' environments."""
    prefix = release if "gpu-steward" in release else f"{release}-gpu-steward"

    def get(kind: str, name: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(_kubectl(kubeconfig, "-n", namespace, "get", kind, name, "-o", "json"))
        return document

    tls_dir = dest / "tls"
    tls_dir.mkdir(parents=True, exist_ok=True)
    config = dest / "config.yaml"
    config.write_text(get("configmap", f"{prefix}-config")["data"]["config.yaml"])
    envs = {}
    for component in ("webhook", "descheduler"):
        container = get("deployment", f"{prefix}-{component}")["spec"]["template"]["spec"]["containers"][0]
        envs[component] = {**_container_env(container, namespace=namespace, pod_name=f"{prefix}-{component}-local"),
                           "GPU_STEWARD_CONFIG": str(config)}
    envs["webhook"].update({"GPU_STEWARD_WEBHOOK__CERT_FILE": str(tls_dir / "tls.crt"),
                            "GPU_STEWARD_WEBHOOK__KEY_FILE": str(tls_dir / "tls.key")})
    return ReleaseFiles(config=config, webhook_env=envs["webhook"], descheduler_env=envs["descheduler"],
                        tls_dir=tls_dir)


def service_account_kubeconfig(*, kubeconfig: pathlib.Path, namespace: str, service_account: str,
                               dest: pathlib.Path) -> pathlib.Path:
    """A kubeconfig for the cluster of `kubeconfig` that authenticates as the ServiceAccount (a bound token
    from the TokenRequest API, `kubectl create token`): the process gets exactly the chart's RBAC."""
    token = _kubectl(kubeconfig, "-n", namespace, "create", "token", service_account, "--duration=2h").strip()
    admin = json.loads(_kubectl(kubeconfig, "config", "view", "--raw", "--minify", "-o", "json"))
    cluster = admin["clusters"][0]["cluster"]
    document = {
        "apiVersion": "v1", "kind": "Config", "current-context": service_account,
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": service_account, "context": {"cluster": "cluster", "user": service_account}}],
    }  # fmt: skip
    dest.write_text(yaml.safe_dump(document))
    dest.chmod(0o600)
    return dest
