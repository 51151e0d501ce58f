"""Where release puts a gang: the search in descheduler/release/layout.py, one row per documented rule (a match, a
no-match, a boundary), asserting the nodes chosen and what the layout says of them."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from common import settings, snapshot
from descheduler.release import layout
from tests import builders

NAMES = settings.Names()
NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC).timestamp()
SPLIT_8 = [range(4), range(4, 8)]


def node(name: str, *, clique: str | None = None, gpus: int = 8) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.clique": clique} if clique else None
    return builders.gpu_node(name, gpus=gpus, domains=SPLIT_8 if gpus == 8 else None, labels=labels)


def busy(name: str, *, on: str, gpus: int) -> dict[str, Any]:
    return builders.pod(name, namespace="other", gpus=gpus, node=on, phase="Running")


def members(count: int, *, gpus: int) -> list[dict[str, Any]]:
    return [builders.pod(f"m-{i}", namespace="team", gpus=gpus) for i in range(count)]


def search(nodes: Sequence[dict[str, Any]], running: Sequence[dict[str, Any]], gang: Sequence[dict[str, Any]],
           ) -> layout.Layout | None:
    cluster = snapshot.build(nodes=nodes, pods=[*running, *gang], names=NAMES, taken_at=NOW)
    pods = [cluster.pods[f"team/{p['metadata']['name']}"] for p in gang]
    candidates = {p.key: layout.candidates(p, cluster) for p in pods}
    found = layout.place(pods, candidates, layout.rooms(cluster), frozenset(cluster.nodes), scoring=settings.Scoring())
    return None if found is None else found[0]


def by_name(found: layout.Layout) -> Mapping[str, str]:
    return {key.split("/")[1]: name for key, name in found.nodes.items()}


THREE_EMPTY = [node("a"), node("b"), node("c")]


@pytest.mark.parametrize(
    ("nodes", "running", "gang", "want", "says"),
    [
        # A gang of 3x4 GPUs on three 8-GPU nodes uses 2 nodes (onto a node the gang already uses before a new one).
        pytest.param(THREE_EMPTY, [], members(3, gpus=4), {"m-0": "a", "m-1": "a", "m-2": "b"},
                     "3 members on 2 node(s) (a, b): no single node or NVLink clique could hold the gang: fewest nodes",
                     id="3x4-on-three-8-gpu-nodes/two-nodes/match"),
        pytest.param(THREE_EMPTY, [busy(f"x-{n}", on=n, gpus=4) for n in "abc"], members(3, gpus=4),
                     {"m-0": "a", "m-1": "b", "m-2": "c"}, "3 members on 3 node(s)",
                     id="3x4-on-three-half-used-nodes/three-nodes/no-match"),
        pytest.param(THREE_EMPTY, [busy("x", on="a", gpus=4)], members(3, gpus=4),
                     {"m-0": "b", "m-1": "b", "m-2": "c"}, "3 members on 2 node(s) (b, c)",
                     id="3x4-one-node-half-used/still-two-nodes-the-emptiest/boundary"),
        # A multi-node NVLink clique with room for the whole gang beats two tighter unrelated nodes.
        pytest.param([node("c1", clique="X"), node("c2", clique="X"), node("u1"), node("u2")],
                     [busy("x1", on="c1", gpus=2), busy("x2", on="c2", gpus=2),
                      busy("y1", on="u1", gpus=4), busy("y2", on="u2", gpus=4)],
                     members(2, gpus=4), {"m-0": "c1", "m-1": "c2"},
                     "2 members on 2 node(s) (c1, c2): one multi-node NVLink domain X",
                     id="clique-with-room/beats-tighter-unrelated-nodes/match"),
        pytest.param([node("c1", clique="X"), node("c2", clique="Y"), node("u1"), node("u2")],
                     [busy("x1", on="c1", gpus=2), busy("x2", on="c2", gpus=2),
                      busy("y1", on="u1", gpus=4), busy("y2", on="u2", gpus=4)],
                     # Not one domain: the gang is spread by the fewest-nodes rule (the emptiest new node first).
                     members(2, gpus=4), {"m-0": "c1", "m-1": "c2"},
                     "2 members on 2 node(s) (c1, c2): no single node or NVLink clique could hold the gang",
                     id="two-different-cliques/no-domain-claimed/no-match"),
        pytest.param([node("c1", clique="X"), node("c2", clique="X"), node("u1"), node("u2")],
                     [busy("x1", on="c1", gpus=2), busy("x2", on="c2", gpus=6),
                      busy("y1", on="u1", gpus=4), busy("y2", on="u2", gpus=4)],
                     members(2, gpus=4), {"m-0": "c1", "m-1": "u1"}, "no single node or NVLink clique could hold",
                     id="clique-without-room-for-all/fewest-nodes-without-it/boundary"),
        pytest.param([node(f"c{i}", clique="X", gpus=4) for i in range(1, 4)] + [node("u1"), node("u2", gpus=4)],
                     [], members(3, gpus=4), {"m-0": "c1", "m-1": "c2", "m-2": "c3"},
                     "3 members on 3 node(s) (c1, c2, c3): one multi-node NVLink domain X",
                     id="clique-of-three-beats-two-unrelated-nodes/match"),
        # One node that holds the whole gang beats any clique.
        pytest.param([node("c1", clique="X"), node("c2", clique="X"), node("solo")],
                     [busy("x1", on="c1", gpus=2), busy("x2", on="c2", gpus=2)],
                     members(2, gpus=4), {"m-0": "solo", "m-1": "solo"}, "2 members on 1 node(s) (solo): one node",
                     id="one-node-beats-a-clique"),
        pytest.param(THREE_EMPTY, [busy(f"x-{n}", on=n, gpus=5) for n in "abc"], members(3, gpus=4), None, "",
                     id="no-room-anywhere/none"),
    ],
)
def test_gang_layout(nodes: list[dict[str, Any]], running: list[dict[str, Any]], gang: list[dict[str, Any]],
                     want: Mapping[str, str] | None, says: str) -> None:
    found = search(nodes, running, gang)
    if want is None:
        assert found is None
        return
    assert found is not None
    assert (dict(by_name(found)), says in found.describe()) == (dict(want), True), found.describe()
    assert "each member within one NVLink domain" in found.describe()


def test_assumed_pods_hold_their_node_until_the_snapshot_shows_them() -> None:
    """`rooms(assumed=...)`: a pod we released to a node that the snapshot does not show there yet takes its GPUs
    from that node; a pod the snapshot already shows on a node is not counted twice."""
    cluster = snapshot.build(nodes=[node("a")], pods=[*members(1, gpus=4), busy("on-a", on="a", gpus=2)],
                             names=NAMES, taken_at=NOW)
    assert layout.rooms(cluster)["a"].free_gpus == 6
    assert layout.rooms(cluster, assumed={"team/m-0": "a"})["a"].free_gpus == 2
    assert layout.rooms(cluster, assumed={"other/on-a": "a"})["a"].free_gpus == 6, "already held: not twice"
    assert layout.rooms(cluster, assumed={"team/gone": "a"})["a"].free_gpus == 6, "a pod that is gone holds nothing"


def test_candidates_are_the_nodes_the_pod_could_ever_use() -> None:
    small = builders.gpu_node("small", gpus=2)
    cordoned = builders.gpu_node("cordoned", gpus=8, mutate=lambda n: n["spec"].update(unschedulable=True))
    cluster = snapshot.build(nodes=[node("a"), small, cordoned], pods=members(1, gpus=4), names=NAMES, taken_at=NOW)
    pod = cluster.pods["team/m-0"]
    assert layout.candidates(pod, cluster) == frozenset({"a"})
    assert "cordoned" not in layout.rooms(cluster), "a cordoned node offers no room"


# --- the tie-break: among nodes ranked equal, the one fewer pending never-gated pods prefer -------------------------


def preferring(name: str, *, node_name: str, gpus: int = 1, mutate: Any = None) -> dict[str, Any]:
    """A pending pod kube-scheduler may bind at any moment, preferring `node_name` (the webhook's preferred term)."""
    def edit(pod: dict[str, Any]) -> None:
        pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node_name]}]}}]}}
        if mutate:
            mutate(pod)

    return builders.pod(name, namespace="other", gpus=gpus, mutate=edit)


def gated(pod: dict[str, Any]) -> None:
    pod["spec"]["schedulingGates"] = [{"name": "example.com/other"}]


def nominated(pod: dict[str, Any]) -> None:
    pod["status"]["nominatedNodeName"] = "a"


@pytest.mark.parametrize(
    ("running", "gang", "want"),
    [
        pytest.param([preferring("q", node_name="a")], members(1, gpus=8), {"m-0": "b"},
                     id="single-equal-nodes-the-uncontested-one/match"),
        pytest.param([preferring("q", node_name="a")], members(2, gpus=4), {"m-0": "b", "m-1": "b"},
                     id="gang-equal-nodes-the-uncontested-one/match"),
        pytest.param([preferring("q", node_name="a"), busy("x", on="a", gpus=4)], members(1, gpus=4), {"m-0": "a"},
                     id="a-tighter-node-still-wins-it-is-only-a-tie-break/no-match"),
        pytest.param([preferring("q", node_name="a"), preferring("r", node_name="b"), preferring("s", node_name="b")],
                     members(1, gpus=8), {"m-0": "a"}, id="fewer-preferring-pods-wins/boundary"),
        pytest.param([preferring("q", node_name="a", mutate=gated)], members(1, gpus=8), {"m-0": "a"},
                     id="a-gated-pod-races-nobody/no-match"),
        pytest.param([preferring("q", node_name="a", mutate=nominated)], members(1, gpus=8), {"m-0": "b"},
                     id="a-nominated-pod-holds-the-node-instead/boundary"),
    ],
)
def test_equal_nodes_go_to_the_one_fewer_pending_pods_prefer(
    running: list[dict[str, Any]], gang: list[dict[str, Any]], want: Mapping[str, str],
) -> None:
    cluster = snapshot.build(nodes=[node("a"), node("b")], pods=[*running, *gang], names=NAMES, taken_at=NOW)
    pods = [cluster.pods[f"team/{p['metadata']['name']}"] for p in gang]
    candidates = {p.key: layout.candidates(p, cluster) for p in pods}
    contested = layout.contested(cluster)
    found = layout.place(pods, candidates, layout.rooms(cluster), frozenset(cluster.nodes), scoring=settings.Scoring(),
                         contested=contested)
    assert found is not None
    assert dict(by_name(found[0])) == dict(want)
    racing = [p for p in running if not p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")
              and not p["status"].get("nominatedNodeName")]
    assert sum(contested.values()) == len(racing), "only pending pods that hold nothing and carry no gate count"
