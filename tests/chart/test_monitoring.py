"""The chart's PrometheusRule and Grafana dashboard query only metrics, labels and label values that the
code exports, and the rules pass `promtool check rules`."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import prometheus_client
import pytest
import yaml

from admission import metrics as admission_metrics
from common import feeder
from descheduler import evictor
from descheduler.reclaim import loop as reclaim_loop
from descheduler.release import controller, outcomes
from tests.chart import helm

METRIC = re.compile(r"\b(gpu_steward_[a-z0-9_]*[a-z0-9])\b(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"([^"]*)"')
TARGET_LABELS = {"job", "namespace", "pod", "instance"}  # added by the scrape, not by the code
# Label values the queries name, with the code's set of values for that label.
KNOWN_VALUES = {
    ("gpu_steward_admission_requests_total", "result"): {r.value for r in admission_metrics.Result},
    ("gpu_steward_reclaim_evictions_total", "result"): {r.value for r in evictor.Result},
    ("gpu_steward_feeder_errors_total", "source"): {"occupancy", *(kind.name for kind in feeder.KINDS)},
    ("gpu_steward_release_outcomes_total", "cause"): {c.value for c in outcomes.Cause},
}


def exported() -> dict[str, set[str]]:
    """Every sample name the webhook and the descheduler expose, with its label names."""
    registry = prometheus_client.CollectorRegistry()
    admission_metrics.Metrics(snapshot_age=lambda: None, registry=registry)
    feeder._Metrics(registry)
    controller.Metrics(registry)
    reclaim_loop.Metrics(registry)
    names: dict[str, set[str]] = {}
    for family in registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
        labels = set(_declared_labels(registry, family.name))
        for suffix in suffixes.get(family.type, ("",)):
            names[family.name + suffix] = labels
    return names


def _declared_labels(registry: prometheus_client.CollectorRegistry, name: str) -> tuple[str, ...]:
    for collector in registry._collector_to_names:  # labelled metrics without children have no samples yet
        if getattr(collector, "_name", None) == name:
            return tuple(getattr(collector, "_labelnames", ()))
    return ()


def _rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    return helm.template(values)


def rule_group() -> dict[str, Any]:
    objects = _rendered({"prometheusRule": {"enabled": True}})
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    spec: dict[str, Any] = rule["spec"]
    return spec


def dashboard() -> dict[str, Any]:
    objects = _rendered({"grafanaDashboard": {"enabled": True}})
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    board: dict[str, Any] = json.loads(configmap["data"]["gpu-steward.json"])
    return board


def _queries() -> Iterator[tuple[str, str]]:
    for rule in rule_group()["groups"][0]["rules"]:
        yield rule["alert"], rule["expr"]
    board = dashboard()
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", variable["query"]


def test_every_queried_metric_label_and_value_is_exported() -> None:
    known = exported()
    problems, seen = [], set()
    for where, query in _queries():
        found = METRIC.findall(query)
        if not found:
            problems.append(f"{where}: queries no gpu-steward metric: {query}")
        for name, selector in found:
            seen.add(name)
            if name not in known:
                problems.append(f"{where}: {name} is not exported")
                continue
            for label, value in MATCHER.findall(selector):
                if label in TARGET_LABELS:
                    continue
                if label not in known[name]:
                    problems.append(f"{where}: {name} has no label {label}")
                values = KNOWN_VALUES.get((name, label))
                if values is not None and not set(value.split("|")) <= values:
                    problems.append(f"{where}: {name}{{{label}}} takes {sorted(values)}, not {value!r}")
    assert problems == []
    # The dashboard covers the webhook, gang release, reclaim and the feeder.
    assert {n.split("_")[2] for n in seen} >= {"admission", "gang", "gangs", "reclaim", "feeder"}


def test_the_checker_catches_a_misspelt_metric_and_a_wrong_label_value() -> None:
    known = exported()
    assert "gpu_steward_admission_requests_total" in known and "gpu_steward_admission_request_total" not in known
    assert "result" in known["gpu_steward_reclaim_evictions_total"]
    assert "pdb" not in KNOWN_VALUES[("gpu_steward_reclaim_evictions_total", "result")]


@pytest.mark.prometheus
def test_alert_rules_pass_promtool(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_group()))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


@pytest.mark.parametrize("alert", ["GpuStewardWebhookErrors", "GpuStewardReclaimBlocked",
                                   "GpuStewardPrometheusUnreachable", "GpuStewardGangsWaitingTooLong",
                                   "GpuStewardReleasedNotBound"])
def test_the_issue_s_alerts_exist_with_a_description(alert: str) -> None:
    rules = {r["alert"]: r for r in rule_group()["groups"][0]["rules"]}
    assert rules[alert]["annotations"]["summary"] and rules[alert]["annotations"]["description"]
    assert "{{ $value" not in rules[alert]["annotations"]["summary"]  # Helm left Prometheus' templates intact


def test_not_bound_alert_fires_on_a_late_release_and_not_on_one_placed_elsewhere(tmp_path: pathlib.Path) -> None:
    """`promtool test rules`: a released pod told not bound fires GpuStewardReleasedNotBound while the count rose in
    the last 15 minutes; pods placed elsewhere (bound, a placement report) never fire it."""
    group = rule_group()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(group))
    rule = next(r for r in group["groups"][0]["rules"] if r.get("alert") == "GpuStewardReleasedNotBound")
    fired = {"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}
    series = 'gpu_steward_release_outcomes_total{{job="d", cause="{}"}}'
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": series.format("placed-elsewhere"), "values": "0 1 2 3 4 5 6 7 8 9 10"},
                         {"series": series.format("gang-not-bound"), "values": "0 0 0 0 0 1 1 1 1 1 1"}],
        "alert_rule_test": [{"eval_time": "4m", "alertname": "GpuStewardReleasedNotBound", "exp_alerts": []},
                            {"eval_time": "7m", "alertname": "GpuStewardReleasedNotBound", "exp_alerts": [fired]}],
    }]}
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
