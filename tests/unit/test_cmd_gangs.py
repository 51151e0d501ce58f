"""`gpu-steward gangs --cluster STATE.json`: the gang controller's view, GPU-less members included."""

from __future__ import annotations

import datetime
import json
import pathlib
from typing import Any

import pytest

from common import settings
from gpu_steward import cli
from tests import builders

NAMES = settings.Names()
GATED = {"schedulingGates": [{"name": NAMES.gate}]}


def state(tmp_path: pathlib.Path) -> pathlib.Path:
    """An MPI job: a launcher without GPUs and 2 GPU workers, all counted in a gang of 3, all gated."""
    labels = {NAMES.gang_name: "j", NAMES.gang_size: "3"}
    pods = [builders.pod(name, namespace="team", gpus=gpus, labels=labels, mutate=lambda p: p["spec"].update(GATED))
            for name, gpus in (("j-launcher", 0), ("j-worker-0", 4), ("j-worker-1", 4))]
    pods.append(builders.pod("web", namespace="team"))  # no GPU, no gang: not part of the picture
    document = {"kind": "List", "items": [builders.gpu_node("big", gpus=8, domains=[range(4), range(4, 8)]), *pods]}
    path = tmp_path / "state.json"
    path.write_text(json.dumps(document))
    return path


def test_text_lists_the_member_without_gpus(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gangs", "--cluster", str(state(tmp_path))]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "gang team/j  members 3/3  priority 0  release",
        "  why: 2 members on 1 node(s) (big): one node; each member within one NVLink domain; "
        "un-gated with them, not pinned (no GPU): team/j-launcher",
        "  - team/j-launcher  no GPU  gated",
        "  - team/j-worker-0  4 GPU  gated  node big",
        "  - team/j-worker-1  4 GPU  gated  node big",
    ]


def test_json_lists_the_member_without_gpus(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gangs", "--cluster", str(state(tmp_path)), "--output", "json"]) == 0
    [gang] = json.loads(capsys.readouterr().out)["gangs"]
    members: list[dict[str, Any]] = gang["members"]
    assert (gang["gang"], gang["state"], gang["size"]) == ("team/j", "release", 3)
    assert members[0] == {"pod": "team/j-launcher", "gpus": "no GPU", "gated": True, "node": None}
    assert [m["node"] for m in members[1:]] == ["big", "big"]


def test_a_gated_single_pod_is_shown_as_a_gang_of_one(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod the webhook gated for placement at release (no gang labels) waits in the same queue."""
    document = {"kind": "List", "items": [
        builders.gpu_node("big", gpus=8, domains=[range(4), range(4, 8)]),
        builders.pod("solo", namespace="team", gpus=4, mutate=lambda p: p["spec"].update(GATED)),
        builders.pod("huge", namespace="team", gpus=16, mutate=lambda p: p["spec"].update(GATED))]}
    path = tmp_path / "state.json"
    path.write_text(json.dumps(document))
    assert cli.main(["gangs", "--cluster", str(path), "--output", "json"]) == 0
    shown = {g["gang"]: g for g in json.loads(capsys.readouterr().out)["gangs"]}
    assert (shown["team/solo"]["kind"], shown["team/solo"]["state"]) == ("pod", "release")
    assert shown["team/solo"]["why"].startswith("placed on big: NVLink score ")
    # Created long before now and no node can ever hold it: past its max wait it goes unpinned, with a warning.
    assert (shown["team/huge"]["kind"], shown["team/huge"]["state"], shown["team/huge"]["event"]) == (
        "pod", "release-alone", {"type": "Warning", "reason": "ReleasedUnplaced"})
    assert shown["team/huge"]["why"].startswith("not placed within 300s (complete; team/huge can run on no node")
    assert cli.main(["gangs", "--cluster", str(path)]) == 0
    assert "pod (placed at release) team/solo  members 1/1" in capsys.readouterr().out


def test_a_stuck_pin_is_a_line_with_its_cause_and_recovery(tmp_path: pathlib.Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A pod released pinned to a node that is gone: `gangs` says so, and what the controller does about it."""

    def mutate(pod: dict[str, Any]) -> None:
        pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web-1", "controller": True}]
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gone"]}]}]}}}

    pod = builders.pod("infer", namespace="team", gpus=4, mutate=mutate,
                       annotations={NAMES.release: "2026-11-21T10:00:00Z placed on gone: NVLink score 90"})
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"kind": "List", "items": [builders.gpu_node("big", gpus=8), pod]}))
    assert cli.main(["gangs", "--cluster", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "stuck pin team/infer  node-gone  recovering: evict",
        "  why: pinned to gone, not bound: its node gone is gone; recovered: team/infer: its ReplicaSet web-1 "
        "re-creates it",
        "no gangs",
    ]
    assert cli.main(["gangs", "--cluster", str(path), "--output", "json"]) == 0
    [stuck] = json.loads(capsys.readouterr().out)["stuck_pins"]
    assert (stuck["unit"], stuck["cause"], stuck["recovery"]) == ("team/infer", "node-gone", "evict")
    assert stuck["pods"] == [{"pod": "team/infer", "node": "gone", "bound": False, "cause": "node-gone",
                             "recovery": "evict"}]


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        pytest.param(["-n", "team"], ["team/j"], id="its-namespace"),
        pytest.param(["--namespace", "other"], [], id="another-namespace-hides-it"),
        pytest.param(["-n", "tea"], [], id="a-prefix-is-not-the-namespace"),
        pytest.param([], ["team/j"], id="all-namespaces"),
    ],
)
def test_namespace_filters_what_is_shown(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], flags: list[str], shown: list[str]
) -> None:
    assert cli.main(["gangs", "--cluster", str(state(tmp_path)), "-o", "json", *flags]) == 0
    assert [g["gang"] for g in json.loads(capsys.readouterr().out)["gangs"]] == shown


def test_a_pin_recovery_waits_on_is_a_line_with_its_wait(tmp_path: pathlib.Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Past its deadline, nominated by kube-scheduler to its node where it fits: shown as waited on, not stuck."""

    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["big"]}]}]}}}
        pod["status"].update(nominatedNodeName="big", conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])

    now = datetime.datetime.now(datetime.UTC)
    released = (now - datetime.timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = builders.pod("infer", namespace="team", gpus=4, mutate=mutate,
                       annotations={NAMES.release: f"{released} placed on big: NVLink score 90"})
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"kind": "List", "items": [builders.gpu_node("big", gpus=8), pod]}))
    assert cli.main(["gangs", "--cluster", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "waited pin team/infer  retry-due  on big",
        "  why: kube-scheduler nominated it to big, where no pod is terminating and it fits now: its retry is due; "
        "waited on until 360s after its release",
        "no gangs",
    ]
    assert cli.main(["gangs", "--cluster", str(path), "--output", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    [waited] = shown["waited_pins"]
    assert shown["stuck_pins"] == [] and (waited["pod"], waited["node"], waited["wait"]) == (
        "team/infer", "big", "retry-due")
