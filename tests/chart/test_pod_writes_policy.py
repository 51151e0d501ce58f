"""templates/webhook-pod-policy.yaml: the ValidatingAdmissionPolicy that narrows the webhook's `patch` on pods follows
the configured names (`settings.names.prefix`) and the release, and can be turned off. What it allows and refuses
on the real API server: tests/e2e/test_chart_e2e.py::test_the_webhook_may_lift_our_gate_and_change_nothing_else."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import helm

POLICY = ["--show-only", "templates/webhook-pod-policy.yaml"]


def _variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


@pytest.mark.parametrize(("prefix", "gate", "release"), [
    pytest.param("example.com/", "'example.com/gang'", "'example.com/release'", id="configured-prefix"),
    pytest.param(None, "'gpu-steward.io/gang'", "'gpu-steward.io/release'", id="default-prefix"),
])
def test_the_policy_follows_the_configured_names(prefix: str | None, gate: str, release: str) -> None:
    values = {"settings": {"names": {"prefix": prefix}}} if prefix else {}
    policy, binding = helm.template(values, release="ours", namespace="ops", extra=POLICY)
    assert (policy["kind"], binding["kind"]) == ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    variables = _variables(policy)
    assert (variables["gate"], variables["release"]) == (gate, release)
    assert policy["spec"]["matchConditions"] == [{
        "name": "the-webhook-service-account",
        "expression": "request.userInfo.username == 'system:serviceaccount:ops:ours-gpu-steward-webhook'"}]
    assert (policy["spec"]["failurePolicy"], binding["spec"]) == (
        "Fail", {"policyName": "ours-gpu-steward-webhook-pod-writes", "validationActions": ["Deny"]})


@pytest.mark.parametrize("values", [
    pytest.param({"webhook": {"podPolicy": {"enabled": False}}}, id="turned-off"),
    pytest.param({"webhook": {"enabled": False}}, id="no-webhook"),
])
def test_no_policy_when_off(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError, match="could not find template"):
        helm.template(values, extra=POLICY)
