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
        "un-gated with them, not nominated (no GPU): team/j-launcher",
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
    # Created long before now and no node can ever hold it: past its max wait: released, with a warning.
    assert (shown["team/huge"]["kind"], shown["team/huge"]["state"], shown["team/huge"]["event"]) == (
        "pod", "release-alone", {"type": "Warning", "reason": "ReleasedUnplaced"})
    assert shown["team/huge"]["why"].startswith("not placed within 300s (complete; team/huge can run on no node")
    assert cli.main(["gangs", "--cluster", str(path)]) == 0
    assert "pod (placed at release) team/solo  members 1/1" in capsys.readouterr().out


def test_a_pod_an_older_release_pinned_is_reported_never_recovered(tmp_path: pathlib.Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Upgrade: a pod released pinned (required metadata.name term) to a node that is gone, still Pending: `gangs` says
    so, and that gpu-steward does nothing to it."""

    def mutate(pod: dict[str, Any]) -> None:
        pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web-1", "controller": True}]
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gone"]}]}]}}}

    pod = builders.pod("infer", namespace="team", gpus=4, mutate=mutate,
                       annotations={NAMES.release: "2026-11-21T10:00:00Z placed on gone: NVLink score 90"})
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"kind": "List", "items": [builders.gpu_node("big", gpus=8), pod]}))
    assert cli.main(["gangs", "--cluster", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "released team/infer  not-bound" and lines[-1] == "no gangs"
    assert lines[1].startswith("  why: released without a nomination, not bound ")
    assert lines[1].endswith("; an older release pinned it to gone (a required metadata.name term): gpu-steward no "
                             "longer deletes or re-creates pods, delete it yourself so that its controller creates it "
                             "afresh")
    assert cli.main(["gangs", "--cluster", str(path), "--output", "json"]) == 0
    [found] = json.loads(capsys.readouterr().out)["outcomes"]
    assert (found["pod"], found["gang"], found["cause"], found["event"]) == ("team/infer", None, "not-bound",
                                                                            "NotBoundInTime")


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


def test_a_pod_bound_elsewhere_than_nominated_is_a_line(tmp_path: pathlib.Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.datetime.now(datetime.UTC)
    released = (now - datetime.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = builders.pod("infer", namespace="team", gpus=4, node="small", phase="Running",
                       annotations={NAMES.release: f"{released} planned=big domains=1 placed on big: NVLink score 90"})
    nodes = [builders.gpu_node("big", gpus=8), builders.gpu_node("small", gpus=4)]
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"kind": "List", "items": [*nodes, pod]}))
    assert cli.main(["gangs", "--cluster", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "released team/infer  placed-elsewhere",
        "  why: nominated to big at release, bound to small (the node no longer fitted it when kube-scheduler "
        "tried it)",
        "no gangs",
    ]
