"""common.fit: taints/tolerations, nodeSelector and readiness — could this pod run on this node at all?"""

from __future__ import annotations

from typing import Any

import pytest

from common import fit, settings, snapshot
from tests import builders

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("tolerations", "taint", "tolerated"),
    [
        pytest.param([], GPU_TAINT, False, id="no-tolerations"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Exists"}], GPU_TAINT, True, id="exists-any-effect"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], GPU_TAINT, True,
                     id="exists-same-effect"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], GPU_TAINT, False,
                     id="exists-effect-mismatch"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}], GPU_TAINT, True,
                     id="equal-value"),
        pytest.param([{"key": "nvidia.com/gpu", "value": "present"}], GPU_TAINT, True, id="operator-defaults-equal"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}], GPU_TAINT, False,
                     id="equal-other-value"),
        pytest.param([{"key": "nvidia.com/gpu", "operator": "Equal"}], GPU_TAINT, False, id="equal-missing-value"),
        pytest.param([{"key": "dedicated", "operator": "Equal"}], {"key": "dedicated", "effect": "NoSchedule"}, True,
                     id="equal-both-values-empty"),
        pytest.param([{"key": "other", "operator": "Exists"}], GPU_TAINT, False, id="other-key"),
        pytest.param([{"operator": "Exists"}], GPU_TAINT, True, id="empty-key-exists-tolerates-all"),
        pytest.param([{"key": "", "operator": "Exists", "effect": "NoExecute"}], GPU_TAINT, False,
                     id="empty-key-exists-effect-mismatch"),
        pytest.param([{"operator": "Equal", "value": "present"}], GPU_TAINT, False, id="empty-key-equal"),
        pytest.param([{"key": "other", "operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists"}],
                     GPU_TAINT, True, id="second-toleration-matches"),
    ],
)
def test_tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any], tolerated: bool) -> None:
    assert fit.tolerates(tolerations, taint) is tolerated


def _node(*, taints: list[dict[str, Any]] | None = None, ready: bool = True, cordoned: bool = False,
          labels: dict[str, str] | None = None) -> snapshot.Node:
    def mutate(node: dict[str, Any]) -> None:
        if taints:
            node["spec"]["taints"] = taints
        if cordoned:
            node["spec"]["unschedulable"] = True

    raw = builders.gpu_node("n", gpus=4, labels=labels, ready=ready, mutate=mutate)
    return snapshot.build(nodes=[raw], pods=[], names=settings.Names(), taken_at=None).nodes["n"]


PRODUCT = "nvidia.com/gpu.product"


@pytest.mark.parametrize(
    ("pod_spec", "node", "reason"),
    [
        pytest.param({}, _node(), None, id="plain-node"),
        pytest.param({}, _node(ready=False), "node not ready or cordoned", id="not-ready"),
        pytest.param({}, _node(cordoned=True), "node not ready or cordoned", id="cordoned"),
        pytest.param({"tolerations": [{"operator": "Exists"}]}, _node(ready=False), "node not ready or cordoned",
                     id="tolerating-everything-does-not-help-not-ready"),
        pytest.param({}, _node(taints=[GPU_TAINT]), "taint nvidia.com/gpu=present:NoSchedule not tolerated",
                     id="untolerated-noschedule"),
        pytest.param({}, _node(taints=[{"key": "maintenance", "effect": "NoExecute"}]),
                     "taint maintenance=:NoExecute not tolerated", id="untolerated-noexecute-no-value"),
        pytest.param({}, _node(taints=[{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}]), None,
                     id="prefer-no-schedule-ignored"),
        pytest.param({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
                     _node(taints=[GPU_TAINT]), None, id="tolerated"),
        pytest.param({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
                     _node(taints=[GPU_TAINT, {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
                     "taint dedicated=ml:NoSchedule not tolerated", id="second-taint-untolerated"),
        pytest.param({"nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}},
                     _node(labels={PRODUCT: "NVIDIA-H100-80GB-HBM3"}), None, id="node-selector-match"),
        pytest.param({"nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}},
                     _node(labels={PRODUCT: "Tesla-T4"}),
                     f"nodeSelector {PRODUCT}=NVIDIA-H100-80GB-HBM3 does not match", id="node-selector-other-value"),
        pytest.param({"nodeSelector": {"pool": "a100"}}, _node(), "nodeSelector pool=a100 does not match",
                     id="node-selector-label-missing"),
        pytest.param({"nodeSelector": {"pool": "a100"}}, _node(taints=[GPU_TAINT]),
                     "taint nvidia.com/gpu=present:NoSchedule not tolerated", id="taint-reported-before-selector"),
    ],
)
def test_why_not(pod_spec: dict[str, Any], node: snapshot.Node, reason: str | None) -> None:
    assert fit.why_not(pod_spec, node) == reason
