"""`gpu-steward release-gates` against the real API server: our gate goes, another controller's stays, a
second run has nothing to do, a gate list that moved since it was read is re-read (never a wrong removal),
and a pod the API server refuses to change makes the command exit 1 naming it."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from common import gate_patch, settings
from common import kube as kube_client
from gpu_steward import cmd_release_gates
from gpu_steward_lab import localcluster
from tests.e2e.conftest import REPO
from tests.support import kube

OTHER = "kueue.x-k8s.io/admission"  # a peer's gate: never ours to remove
FROZEN = "e2e.gpu-steward.io/frozen"  # pods labelled so are refused every update (a ValidatingAdmissionPolicy)
UNFROZEN = f"!has(oldObject.metadata.labels) || !('{FROZEN}' in oldObject.metadata.labels)"


def release_gates(cluster: localcluster.LocalCluster, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_steward", "release-gates", "--kubeconfig", str(cluster.kubeconfig), *flags],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def gates_of(cluster: localcluster.LocalCluster, namespace: str) -> dict[str, list[str]]:
    return {name: kube.gates(pod) for name, pod in kube.pods(cluster, namespace).items()}


@pytest.fixture
def other_namespace(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    name = f"e2e-{secrets.token_hex(4)}"
    control_plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
    control_plane.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s")
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


GATES = {
    "ours": ["GATE"],
    "other-then-ours": [OTHER, "GATE"],
    "ours-then-other": ["GATE", OTHER],
    "other-only": [OTHER],
    "none": [],
}


def test_only_our_gate_goes_in_every_namespace_and_a_second_run_does_nothing(
    control_plane: localcluster.LocalCluster, plain_namespace: str, other_namespace: str, names: settings.Names
) -> None:
    gate = names.gate
    control_plane.apply(
        [kube.pod(name, namespace=plain_namespace, gates=[gate if g == "GATE" else g for g in gated])
         for name, gated in GATES.items()]
        + [kube.pod("ours", namespace=other_namespace, gates=[gate])]
    )  # fmt: skip
    mine = {f"{plain_namespace}/{n}" for n in ("ours", "other-then-ours", "ours-then-other")}
    mine.add(f"{other_namespace}/ours")

    dry = release_gates(control_plane, "--dry-run", "--output", "json")
    assert dry.returncode == 0, dry.stderr
    assert mine <= set(json.loads(dry.stdout)["released"])  # other tests' leftovers may be listed too
    assert f"{plain_namespace}/other-only" not in json.loads(dry.stdout)["released"]
    assert gates_of(control_plane, plain_namespace)["ours"] == [gate]  # a dry run changes nothing

    done = release_gates(control_plane, "--output", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert mine <= set(result["released"]) and result["failed"] == {}
    assert gates_of(control_plane, plain_namespace) == {
        "ours": [], "other-then-ours": [OTHER], "ours-then-other": [OTHER], "other-only": [OTHER], "none": [],
    }  # fmt: skip
    assert gates_of(control_plane, other_namespace) == {"ours": []}

    again = release_gates(control_plane, "--output", "json")
    assert again.returncode == 0, again.stderr
    assert not mine & set(json.loads(again.stdout)["released"])


def test_one_namespace_only_with_a_summary(
    control_plane: localcluster.LocalCluster, plain_namespace: str, other_namespace: str, names: settings.Names
) -> None:
    control_plane.apply([kube.pod("a", namespace=plain_namespace, gates=[names.gate, OTHER]),
                         kube.pod("b", namespace=other_namespace, gates=[names.gate])])
    done = release_gates(control_plane, "-n", plain_namespace)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"released {plain_namespace}/a",
        f"1 pod(s) carried {names.gate}: 1 released, 0 gone, 0 failed",
    ]
    assert gates_of(control_plane, plain_namespace) == {"a": [OTHER]}
    assert gates_of(control_plane, other_namespace) == {"b": [names.gate]}


async def test_a_gate_list_that_moved_is_read_again_never_removing_the_wrong_gate(
    control_plane: localcluster.LocalCluster, plain_namespace: str, names: settings.Names,
    kube_api: client.ApiClient,
) -> None:
    control_plane.apply([kube.pod("p", namespace=plain_namespace, gates=[OTHER, names.gate])])
    stale: dict[str, Any] = kube.pods(control_plane, plain_namespace)["p"]  # our gate at index 1
    # The peer removes its own gate meanwhile: ours is now at index 0, and index 1 does not exist.
    control_plane.kubectl("patch", "pod", "p", "-n", plain_namespace, "--type=json",
                          "-p", '[{"op": "remove", "path": "/spec/schedulingGates/0"}]')
    path = f"/api/v1/namespaces/{plain_namespace}/pods/p"
    with pytest.raises(kube_client.ApiError) as refused:  # the stale patch's `test` fails: nothing removed
        await kube_client.request(kube_api, "PATCH", path, body=gate_patch.ungate(stale, gate=names.gate),
                                  content_type=cmd_release_gates.JSON_PATCH, timeout_seconds=10)
    assert refused.value.status == 422
    assert gates_of(control_plane, plain_namespace) == {"p": [names.gate]}

    assert await cmd_release_gates.release_pod(kube_api, stale, gate=names.gate, timeout_seconds=10) is True
    assert gates_of(control_plane, plain_namespace) == {"p": []}
    # Gone meanwhile: not an error.
    control_plane.kubectl("delete", "pod", "p", "-n", plain_namespace, "--wait=true")
    assert await cmd_release_gates.release_pod(kube_api, stale, gate=names.gate, timeout_seconds=10) is False


@pytest.fixture
def frozen_pods(control_plane: localcluster.LocalCluster, plain_namespace: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy refusing every update of a pod labelled FROZEN in `plain_namespace`."""
    name = f"e2e-frozen-{plain_namespace}"
    control_plane.apply([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["UPDATE"], "resources": ["pods"]}]},
                  "validations": [{"expression": UNFROZEN, "message": "this pod is frozen"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": plain_namespace}}}}},
    ])  # fmt: skip
    try:
        yield
    finally:
        control_plane.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
                              check=False)


def test_a_pod_that_cannot_be_released_is_named_and_the_exit_code_is_1(
    control_plane: localcluster.LocalCluster, plain_namespace: str, names: settings.Names, frozen_pods: None
) -> None:
    control_plane.apply([kube.pod("frozen", namespace=plain_namespace, gates=[names.gate], labels={FROZEN: "1"}),
                         kube.pod("free", namespace=plain_namespace, gates=[names.gate])])

    def refused() -> bool:  # a new policy takes a moment to reach the API server's admission chain
        probe = control_plane.kubectl("annotate", "--overwrite", "pod", "frozen", "-n", plain_namespace,
                                      f"probe={secrets.token_hex(4)}", check=False)
        return probe.returncode != 0 and "this pod is frozen" in probe.stderr

    kube.poll("the policy refuses updates of the frozen pod", refused)
    done = release_gates(control_plane, "-n", plain_namespace, "--output", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["released"] == [f"{plain_namespace}/free"]
    assert list(result["failed"]) == [f"{plain_namespace}/frozen"]
    assert "this pod is frozen" in result["failed"][f"{plain_namespace}/frozen"]
    assert gates_of(control_plane, plain_namespace) == {"free": [], "frozen": [names.gate]}
