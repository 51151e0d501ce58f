"""The demo tells the truth of the configuration it runs: each workload's announced tier is the tier the webhook,
with the demo's own settings, gives its pods."""

from __future__ import annotations

from typing import Any

import pytest

from admission import tiers
from common import settings
from gpu_steward_lab import demo


def _pod(workload: demo.Workload) -> dict[str, Any]:
    manifest = demo.manifests(workload)[0]
    if manifest["kind"] == "Pod":
        return manifest
    template: dict[str, Any] = manifest["spec"]["template"]
    return {"metadata": {**template["metadata"], "namespace": demo.NAMESPACE}, "spec": template["spec"]}


def _tier(workload: demo.Workload, config: settings.Settings) -> settings.Tier | None:
    decision = tiers.decide(pod=_pod(workload), namespace=demo.NAMESPACE, namespace_labels={},
                            priority_classes={}, tiers=config.tiers, names=config.names)
    return decision.tier


@pytest.mark.parametrize("workload", [pytest.param(w, id=w.name) for w in (*demo.PLACEMENT_PHASE, demo.URGENT)])
def test_every_announced_tier_is_the_tier_the_demo_configures(workload: demo.Workload) -> None:
    config = settings.validate(demo.steward_settings("http://127.0.0.1:9090"), source="demo")
    assert _tier(workload, config) == settings.Tier(workload.tier)


def test_without_the_demo_claim_the_inference_service_would_not_be_critical() -> None:
    """The claim is what makes the announcement true: default settings refuse a label that raises the tier."""
    [inference] = [w for w in demo.PLACEMENT_PHASE if w.tier == "critical"]
    assert _tier(inference, settings.Settings()) is settings.Tier.NORMAL
