"""templates/pod-writes-policy.yaml: the ValidatingAdmissionPolicy that narrows the `patch` on pods of our gate lifters
(the webhook's ServiceAccount, the uninstall hook's) follows the configured names (`settings.names.prefix`), the
release and the components turned on, and can be turned off. What it allows and refuses on the real API server:
tests/e2e/test_chart_e2e.py::test_the_webhook_may_lift_our_gate_and_change_nothing_else and
::test_the_uninstall_hook_may_lift_our_gate_and_nothing_more."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import helm

POLICY = ["--show-only", "templates/pod-writes-policy.yaml"]
WEBHOOK = "'system:serviceaccount:ops:ours-gpu-steward-webhook'"
HOOK = "'system:serviceaccount:ops:ours-gpu-steward-release-gates'"


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
    assert (policy["spec"]["failurePolicy"], binding["spec"]) == (
        "Fail", {"policyName": "ours-gpu-steward-pod-writes", "validationActions": ["Deny"]})


@pytest.mark.parametrize(("values", "users"), [
    pytest.param({"webhook": {"enabled": False}}, [HOOK], id="hook-alone"),
    pytest.param({"releaseGates": {"enabled": False}}, [WEBHOOK], id="webhook-alone"),
    pytest.param({}, [WEBHOOK, HOOK], id="both-by-default"),
])
def test_the_policy_binds_each_gate_lifter_turned_on_and_no_other(values: dict[str, Any], users: list[str]) -> None:
    policy, _ = helm.template(values, release="ours", namespace="ops", extra=POLICY)
    assert policy["spec"]["matchConditions"] == [{
        "name": "our-gate-lifters", "expression": f"request.userInfo.username in [{', '.join(users)}]"}]


@pytest.mark.parametrize("values", [
    pytest.param({"podPolicy": {"enabled": False}}, id="turned-off"),
    pytest.param({"webhook": {"enabled": False}, "releaseGates": {"enabled": False}}, id="no-gate-lifter"),
])
def test_no_policy_when_off(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError, match="could not find template"):
        helm.template(values, extra=POLICY)
