"""`gpu-steward explain POD --cluster STATE.json`: what admission adds, with the controller alive or down."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from gpu_steward import cli
from tests import builders


def write(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    document = {"kind": "List", "items": [builders.gpu_node("big", gpus=8, domains=[range(4), range(4, 8)]),
                                          *builders.tier_classes(), builders.namespace("default")]}
    state, pod = tmp_path / "state.json", tmp_path / "pod.json"
    state.write_text(json.dumps(document))
    pod.write_text(json.dumps(builders.pod("train", gpus=4)))
    return state, pod


@pytest.mark.parametrize(
    ("flags", "gated", "release", "line"),
    [
        pytest.param([], True, "gated", "release:  gated, placed at release", id="controller-alive-by-default"),
        pytest.param(["--controller", "down"], False, "controller-down", "release:  not gated, controller down",
                     id="controller-down"),
    ],
)
def test_explain_says_whether_admission_gates_the_pod_for_release(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], flags: list[str], gated: bool, release: str, line: str
) -> None:
    state, pod = write(tmp_path)

    assert cli.main(["explain", str(pod), "--cluster", str(state), *flags]) == 0
    assert line in capsys.readouterr().out.splitlines()
    assert cli.main(["explain", str(pod), "--cluster", str(state), "--output", "json", *flags]) == 0
    answer = json.loads(capsys.readouterr().out)

    assert (answer["gated"], answer["release"]) == (gated, release)
    ops = {op["path"]: op["value"] for op in answer["patch"]}
    assert ("/spec/schedulingGates" in ops, "/spec/affinity" in ops) == (gated, not gated)


def test_explain_shows_where_release_would_place_the_pod_now(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The brief's worked examples, at release: a 1-GPU pod goes to the 2-GPU node with one GPU used (250),
    before an empty 8-GPU node of two domains (40); a tainted node says why not."""
    taint = [{"key": "team", "value": "a", "effect": "NoSchedule"}]
    document = {"kind": "List", "items": [
        builders.gpu_node("small", gpus=2), builders.gpu_node("big", gpus=8, domains=[range(4), range(4, 8)]),
        builders.gpu_node("theirs", gpus=8, mutate=lambda n: n["spec"].update(taints=taint)),
        builders.pod("one", gpus=1, node="small", phase="Running"), *builders.tier_classes()]}
    state, pod, config = tmp_path / "state.json", tmp_path / "pod.json", tmp_path / "config.yaml"
    state.write_text(json.dumps(document))
    pod.write_text(json.dumps(builders.pod("new", gpus=1)))
    config.write_text("admission:\n  release_min_gpus: 1\n")  # 1-GPU pods are not governed by default

    assert cli.main(["explain", str(pod), "--cluster", str(state), "--config", str(config), "--output", "json"]) == 0
    where = json.loads(capsys.readouterr().out)["release_placement"]
    assert [(w["node"], w["fits"]) for w in where] == [("small", True), ("big", True), ("theirs", False)]
    assert where[0]["why"].startswith("NVLink score 250 ")
    assert where[1]["why"].startswith("NVLink score 40 ")
    assert where[2]["why"] == "taint team=a:NoSchedule not tolerated"
    assert cli.main(["explain", str(pod), "--cluster", str(state), "--config", str(config)]) == 0
    assert "at release now: small (NVLink score 250 " in capsys.readouterr().out


def _host_port(port: int) -> builders.Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": port}]

    return mutate


def _guard(pod: dict[str, Any]) -> None:
    pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "train"}}}]}}


@pytest.mark.parametrize(
    ("mutate", "labels", "expected"),
    [
        pytest.param(_host_port(8080), {}, [("free", True), ("guarded", True), ("ports", False)], id="host-port"),
        pytest.param(_host_port(8081), {}, [("free", True), ("guarded", True), ("ports", True)], id="other-port"),
        pytest.param(None, {"app": "train"}, [("free", True), ("ports", True), ("guarded", False)],
                     id="selected-by-an-existing-pods-anti-affinity"),
    ],
)
def test_explain_never_places_where_ports_or_existing_anti_affinity_rule_the_node_out(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], mutate: builders.Mutator | None,
    labels: dict[str, str], expected: list[tuple[str, bool]],
) -> None:
    document = {"kind": "List", "items": [
        *(builders.gpu_node(n, gpus=8) for n in ("free", "guarded", "ports")),
        builders.pod("exporter", node="ports", phase="Running", mutate=_host_port(8080)),
        builders.pod("guard", node="guarded", phase="Running", mutate=_guard), builders.namespace("default"),
        *builders.tier_classes()]}
    state, pod = tmp_path / "state.json", tmp_path / "pod.json"
    state.write_text(json.dumps(document))
    pod.write_text(json.dumps(builders.pod("train", gpus=4, labels=labels, mutate=mutate)))

    assert cli.main(["explain", str(pod), "--cluster", str(state), "--output", "json"]) == 0
    where = json.loads(capsys.readouterr().out)["release_placement"]
    assert [(w["node"], w["fits"]) for w in where] == expected
    reasons = {
        "ports": "host port 8080/TCP in use",
        "guarded": "pod default/guard has required anti-affinity against it "
                   "(topologyKey kubernetes.io/hostname=guarded)",
    }
    assert {w["node"]: w["why"] for w in where if not w["fits"]} == {
        node: reasons[node] for node, fits in expected if not fits}


def test_explain_leaves_a_pod_with_a_claim_to_kube_scheduler(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = write(tmp_path)
    pod = tmp_path / "claim.json"
    pod.write_text(json.dumps(builders.pod("train", gpus=4, mutate=lambda p: p["spec"].update(
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]))))

    assert cli.main(["explain", str(pod), "--cluster", str(state), "--output", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["gated"], answer["release_placement"]) == (False, [])
    assert "volume data is persistentVolumeClaim" in json.dumps(answer)
