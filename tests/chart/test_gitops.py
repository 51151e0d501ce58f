"""The chart as GitOps tools and parent charts use it: stable renders, `global`, a subchart, a generated README,
and the webhook's matchConditions naming what the code reads."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import sys
from types import ModuleType
from typing import Any

import pytest
import yaml

from common import gangs, gpu, settings
from tests.chart import helm


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, helm.CHART / "hack" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


README = _load("gen_readme")


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"tls": {"mode": "cert-manager"}, "prometheusRule": {"enabled": True},
                      "grafanaDashboard": {"enabled": True}, "serviceMonitor": {"enabled": True}}, id="everything-on"),
    ],
)
def test_two_renders_are_identical(values: dict[str, Any]) -> None:
    """Argo CD and Flux render on every sync: nothing random (certificates) may be rendered."""
    args = ["template", "gs", str(helm.CHART), "--namespace", "gpu-steward", "--kube-version", helm.KUBE_VERSION]
    first, second = helm.helm(*args, values=values), helm.helm(*args, values=values)
    assert first == second
    assert "caBundle" not in first and "BEGIN CERTIFICATE" not in first


def test_global_values_are_accepted() -> None:
    objects = helm.template({"global": {"imageRegistry": "registry.example.com", "storageClass": "fast"}})
    assert any(o["kind"] == "MutatingWebhookConfiguration" for o in objects)


def test_works_as_a_subchart_of_a_parent_chart(tmp_path: pathlib.Path) -> None:
    """A parent chart depends on gpu-steward; Helm hands the subchart `global` and the parent's section."""
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    shutil.copytree(helm.CHART, parent / "charts" / "gpu-steward", ignore=shutil.ignore_patterns("hack"))
    (parent / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "platform", "version": "1.0.0",
        "dependencies": [{"name": "gpu-steward", "version": "0.1.0", "condition": "gpu-steward.enabled"}],
    }))
    (parent / "values.yaml").write_text(yaml.safe_dump({
        "global": {"imageRegistry": "registry.example.com"},
        "gpu-steward": {"webhook": {"replicas": 3}, "labeler": {"enabled": False}},
    }))
    out = helm.helm("template", "platform", str(parent), "--namespace", "platform", "--kube-version", helm.KUBE_VERSION)
    objects = [doc for doc in yaml.safe_load_all(out) if doc]
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    assert deployments["platform-gpu-steward-webhook"]["spec"]["replicas"] == 3
    assert not [o for o in objects if o["kind"] == "DaemonSet"]


def test_readme_is_generated_from_the_values() -> None:
    assert (helm.CHART / "README.md").read_text() == README.render(), "run charts/gpu-steward/hack/gen_readme.py"
    assert README.undocumented() == []


def test_readme_generator_takes_the_last_doc_comment_and_skips_free_text() -> None:
    lines = ["# free text", "# -- The port.", "# more of it", "port: 1", "", "# A settings-style comment", "a:",
             "  # -- Nested.", "  b: []"]
    assert README._docs(lines) == {"port": "The port. more of it", "a": "A settings-style comment", "a.b": "Nested."}


def test_match_conditions_name_every_gang_key_and_gpu_resource_the_code_reads() -> None:
    """The CEL filter and common/gangs.py + common/gpu.py must agree, or gang pods would skip the webhook."""
    prefix = "gpu.example.com/"
    objects = helm.template({"settings": {"names": {"prefix": prefix}}})
    (configuration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    expression = configuration["webhooks"][0]["matchConditions"][0]["expression"]
    names = settings.Names(prefix=prefix)
    for key in (names.gang_name, gangs.KUEUE_GROUP_LABEL, gangs.COSCHEDULING_LABEL, gangs.VOLCANO_ANNOTATION,
                gpu.FULL_GPU, gpu.MIG_PREFIX, "schedulingGroup", "initContainers"):
        assert key in expression, key
    assert "gpu-steward.io/" not in expression


def test_filter_off_registers_no_match_conditions() -> None:
    """Only the one that keeps gang members for their own entry (tests/chart/test_gang_entry.py) stays."""
    objects = helm.template({"webhook": {"filterPods": False}})
    (configuration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    assert [c["name"] for c in configuration["webhooks"][0]["matchConditions"]] == ["not-a-gated-gang-member"]
    objects = helm.template({"webhook": {"filterPods": False, "gangs": {"enabled": False}}})
    (configuration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    assert "matchConditions" not in configuration["webhooks"][0]
