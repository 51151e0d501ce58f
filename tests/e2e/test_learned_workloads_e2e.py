"""Learned idle windows find a pod's workload by owner references, on the real control plane: what the
Deployment, ReplicaSet, StatefulSet, Job and CronJob controllers write into `ownerReferences`, what the
descheduler lists (`idle_history.api_controllers`), and the names the API server generates for the pods."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

from descheduler.reclaim import idle_history, idle_learning
from gpu_steward_lab import localcluster

pytestmark = pytest.mark.e2e

LABELS = {"app": "serve"}


def template(role: str) -> dict[str, Any]:
    return {"metadata": {"labels": {**LABELS, "role": role}},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}


def objects(namespace: str) -> list[dict[str, Any]]:
    """Deployment serve, and three controllers whose pods' names begin as its pods' do."""
    def selector(role: str) -> dict[str, Any]:
        return {"matchLabels": {**LABELS, "role": role}}

    meta = {"namespace": namespace}
    job = {"template": {**template("cron"), "spec": {**template("cron")["spec"], "restartPolicy": "Never"}}}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "name": "serve"},
         "spec": {"replicas": 1, "selector": selector("web"), "template": template("web")}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {**meta, "name": "serve-cache"},
         "spec": {"replicas": 1, "serviceName": "serve-cache", "selector": selector("cache"),
                  "template": template("cache")}},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {**meta, "name": "serve-canary"},
         "spec": {"replicas": 1, "selector": selector("canary"), "template": template("canary")}},
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {**meta, "name": "serve"},
         "spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {"spec": job}}},
    ]


async def test_owner_references_name_each_workload_and_never_by_its_name(
    control_plane: localcluster.LocalCluster, plain_namespace: str, kube_api: client.ApiClient,
) -> None:
    ns = plain_namespace
    control_plane.apply(objects(ns))
    control_plane.kubectl("create", "job", "serve-29400000", "--from=cronjob/serve", "-n", ns)  # a run of it
    pods: dict[str, Any] = {}
    for _ in range(120):  # the controllers create the pods within seconds
        pods = {p["metadata"]["labels"]["role"]: p
                for p in control_plane.kubectl_json("get", "pods", "-n", ns)["items"]}
        if len(pods) == 4:
            break
        await asyncio.sleep(0.5)
    assert sorted(pods) == ["cache", "canary", "cron", "web"]
    uids = {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["uid"] for o in control_plane.kubectl_json(
        "get", "deployments,statefulsets,replicasets,cronjobs,jobs", "-n", ns)["items"]}

    controllers = await idle_history.api_controllers(kube_api, timeout_seconds=10)([ns])
    found = {role: idle_learning.workload_of(
        ns, idle_learning.controller_ref(pod), pod=(pod["metadata"]["name"], pod["metadata"]["uid"]),
        controllers=controllers) for role, pod in pods.items()}
    assert {role: (w.kind, w.name, w.uid) for role, w in found.items()} == {
        "web": ("Deployment", "serve", uids["Deployment/serve"]),
        "cache": ("StatefulSet", "serve-cache", uids["StatefulSet/serve-cache"]),
        "canary": ("ReplicaSet", "serve-canary", uids["ReplicaSet/serve-canary"]),
        "cron": ("CronJob", "serve", uids["CronJob/serve"]),
    }
    # The names the API server generated are what `series_workload` reads a gone pod's owner from.
    gone = {role: idle_learning.series_workload(ns, pod["metadata"]["name"], controllers=controllers)
            for role, pod in pods.items()}
    assert gone == {**{role: found[role] for role in ("web", "canary", "cron")}, "cache": None}
