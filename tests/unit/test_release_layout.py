"""Where release puts a gang: the search in descheduler/release/layout.py, one row per documented rule (a match, a
no-match, a boundary), asserting the nodes chosen and what the layout says of them."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from common import settings, snapshot, snapshot_build
from descheduler.release import layout
from tests import builders

NAMES = settings.Names()
NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC).timestamp()
SPLIT_8 = [range(4), range(4, 8)]
MIG = "1g.10gb"


def node(name: str, *, clique: str | None = None, gpus: int = 8) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.clique": clique} if clique else None
    return builders.gpu_node(name, gpus=gpus, domains=SPLIT_8 if gpus == 8 else None, labels=labels)


def busy(name: str, *, on: str, gpus: int) -> dict[str, Any]:
    return builders.pod(name, namespace="other", gpus=gpus, node=on, phase="Running")


def members(count: int, *, gpus: int) -> list[dict[str, Any]]:
    return [builders.pod(f"m-{i}", namespace="team", gpus=gpus) for i in range(count)]


def plain(name: str) -> dict[str, Any]:
    """An 8-GPU node of one NVLink domain."""
    return builders.gpu_node(name, gpus=8)


def sized(name: str, *, gpus: int) -> dict[str, Any]:
    return builders.pod(name, namespace="team", gpus=gpus)


def with_mig(node_body: dict[str, Any], slices: int = 7) -> dict[str, Any]:
    node_body["status"]["allocatable"][f"nvidia.com/mig-{MIG}"] = str(slices)
    return node_body


def mig_member(name: str, *, slices: int, priority: int = 0) -> dict[str, Any]:
    """A member of one GPU and `slices` MIG slices (of another GPU)."""
    def edit(pod: dict[str, Any]) -> None:
        pod["spec"]["priority"] = priority

    return builders.pod(name, namespace="team", gpus=1, mig={MIG: slices}, mutate=edit)


def search(nodes: Sequence[dict[str, Any]], running: Sequence[dict[str, Any]], gang: Sequence[dict[str, Any]],
           ) -> layout.Layout | None:
    cluster = snapshot_build.build(nodes=nodes, pods=[*running, *gang], names=NAMES, taken_at=NOW)
    pods = [cluster.pods[f"team/{p['metadata']['name']}"] for p in gang]
    candidates = {p.key: layout.candidates(p, cluster) for p in pods}
    found = layout.place(pods, candidates, layout.rooms(cluster), frozenset(cluster.nodes), scoring=settings.Scoring())
    return None if found is None else found[0]


def by_name(found: layout.Layout) -> Mapping[str, str]:
    return {key.split("/")[1]: name for key, name in found.nodes.items()}


THREE_EMPTY = [node("a"), node("b"), node("c")]
TWO_EMPTY = [node("a"), node("b")]


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
        # A member larger than an NVLink domain spans the fewest; the layout names every such member.
        pytest.param(THREE_EMPTY, [], members(2, gpus=8), {"m-0": "a", "m-1": "b"},
                     "2 members on 2 node(s) (a, b): no single node or NVLink clique could hold the gang: fewest "
                     "nodes; team/m-0, team/m-1 span several NVLink domains (larger than one)",
                     id="members-larger-than-a-domain-span-two/named"),
        # Among single nodes that hold the whole gang, the tightest (fewest GPUs left free).
        pytest.param(TWO_EMPTY, [busy("x", on="b", gpus=4)], members(2, gpus=2), {"m-0": "b", "m-1": "b"},
                     "2 members on 1 node(s) (b): one node", id="one-node-the-tightest-of-those-that-hold-it"),
        # The largest member first: the smallest first would take the one node the largest fits.
        pytest.param([plain("a"), plain("b")], [busy("x", on="a", gpus=2), busy("y", on="b", gpus=6)],
                     [sized("big", gpus=6), sized("small", gpus=2)], {"big": "a", "small": "b"},
                     "2 members on 2 node(s) (a, b)", id="largest-member-first"),
        # Members equal in GPUs: the one with more MIG slices first (the other would take the only node it fits).
        pytest.param([with_mig(builders.gpu_node("a", gpus=1), 2), with_mig(builders.gpu_node("b", gpus=1), 1)], [],
                     [mig_member("m-0", slices=2), mig_member("m-1", slices=1)], {"m-0": "a", "m-1": "b"},
                     "2 members on 2 node(s) (a, b)", id="equal-gpus-more-mig-slices-first"),
        # A later member goes onto the tightest node the gang already uses.
        pytest.param([plain("a"), plain("b")], [], [sized("m6", gpus=6), sized("m5", gpus=5), sized("m2", gpus=2)],
                     {"m6": "a", "m5": "b", "m2": "a"}, "3 members on 2 node(s) (a, b)",
                     id="onto-the-tightest-node-already-used"),
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
    if "span several" not in says:
        assert found.describe().endswith("; each member within one NVLink domain")


def test_assumed_pods_hold_their_node_until_the_snapshot_shows_them() -> None:
    """`rooms(assumed=...)`: a pod we released to a node that the snapshot does not show there yet takes its GPUs
    from that node; a pod the snapshot already shows on a node is not counted twice."""
    cluster = snapshot_build.build(nodes=[node("a")], pods=[*members(1, gpus=4), busy("on-a", on="a", gpus=2)],
                                   names=NAMES, taken_at=NOW)
    assert layout.rooms(cluster)["a"].free_gpus == 6
    assert layout.rooms(cluster, assumed={"team/m-0": "a"})["a"].free_gpus == 2
    assert layout.rooms(cluster, assumed={"other/on-a": "a"})["a"].free_gpus == 6, "already held: not twice"
    assert layout.rooms(cluster, assumed={"team/gone": "a"})["a"].free_gpus == 6, "a pod that is gone holds nothing"


def test_candidates_are_the_nodes_the_pod_could_ever_use() -> None:
    small = builders.gpu_node("small", gpus=2)
    cordoned = builders.gpu_node("cordoned", gpus=8, mutate=lambda n: n["spec"].update(unschedulable=True))
    cluster = snapshot_build.build(nodes=[node("a"), small, cordoned], pods=members(1, gpus=4), names=NAMES,
                                   taken_at=NOW)
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


def finished(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["phase"] = "Failed"
    return pod


def terminating(pod: dict[str, Any]) -> None:
    pod["metadata"]["deletionTimestamp"] = "2026-11-21T11:59:50Z"


def not_in(pod: dict[str, Any]) -> None:
    pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"][
        "matchFields"][0]["operator"] = "NotIn"


@pytest.mark.parametrize(
    ("nodes", "running", "gang", "want", "racing"),
    [
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a")], members(1, gpus=8), {"m-0": "b"}, 1,
                     id="single-equal-nodes-the-uncontested-one/match"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a")], members(2, gpus=4), {"m-0": "b", "m-1": "b"}, 1,
                     id="gang-equal-nodes-the-uncontested-one/match"),
        # Spread over several nodes, member by member: each takes the equal node fewer pending pods prefer.
        pytest.param(THREE_EMPTY, [preferring("q", node_name="a")], members(2, gpus=8), {"m-0": "b", "m-1": "c"}, 1,
                     id="gang-over-several-nodes-avoids-the-contested-one/match"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a"), busy("x", on="a", gpus=4)], members(1, gpus=4),
                     {"m-0": "a"}, 1, id="a-tighter-node-still-wins-it-is-only-a-tie-break/no-match"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a"), preferring("r", node_name="b"),
                                 preferring("s", node_name="b")],
                     members(1, gpus=8), {"m-0": "a"}, 3, id="fewer-preferring-pods-wins/boundary"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a", mutate=gated)], members(1, gpus=8), {"m-0": "a"}, 0,
                     id="a-gated-pod-races-nobody/no-match"),
        pytest.param(TWO_EMPTY, [preferring("p", node_name="b", mutate=gated), preferring("q", node_name="a")],
                     members(1, gpus=8), {"m-0": "b"}, 1, id="a-gated-pod-ahead-of-a-racing-one-counts-alone"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a", mutate=nominated)], members(1, gpus=8), {"m-0": "b"},
                     0, id="a-nominated-pod-holds-the-node-instead/boundary"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a", gpus=0)], members(1, gpus=8), {"m-0": "a"}, 0,
                     id="a-pod-without-gpus-races-nobody/no-match"),
        pytest.param(TWO_EMPTY, [finished(preferring("q", node_name="a"))], members(1, gpus=8), {"m-0": "a"}, 0,
                     id="a-finished-pod-races-nobody/no-match"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a", mutate=terminating)], members(1, gpus=8),
                     {"m-0": "a"}, 0, id="a-terminating-pod-races-nobody/no-match"),
        pytest.param(TWO_EMPTY, [preferring("q", node_name="a", mutate=not_in)], members(1, gpus=8), {"m-0": "a"}, 0,
                     id="a-term-keeping-the-pod-off-the-node-is-no-preference/no-match"),
    ],
)
def test_equal_nodes_go_to_the_one_fewer_pending_pods_prefer(
    nodes: list[dict[str, Any]], running: list[dict[str, Any]], gang: list[dict[str, Any]], want: Mapping[str, str],
    racing: int,
) -> None:
    cluster = snapshot_build.build(nodes=nodes, pods=[*running, *gang], names=NAMES, taken_at=NOW)
    pods = [cluster.pods[f"team/{p['metadata']['name']}"] for p in gang]
    candidates = {p.key: layout.candidates(p, cluster) for p in pods}
    contested = layout.contested(cluster)
    found = layout.place(pods, candidates, layout.rooms(cluster), frozenset(cluster.nodes), scoring=settings.Scoring(),
                         contested=contested)
    assert found is not None
    assert (dict(by_name(found[0])), sum(contested.values())) == (dict(want), racing), contested


# --- a gang of one: the best NVLink score, then packing; what its layout says, in full and in short -----------------

B_SCORE = ("NVLink score 100 (base +50 (every candidate node), one-domain +50 (fits NVLink domain 0 (2/4 free)), "
           "completes-domain +40 (fills partly used domain 0), oversized-node -40 (small pod on a 8-GPU node))")


@pytest.mark.parametrize(
    ("nodes", "running", "pod", "full", "short"),
    [
        # b scores higher (it completes a partly used domain) though a would be left tighter: the score decides.
        pytest.param([plain("a"), node("b")], [busy("x", on="a", gpus=4), busy("y", on="b", gpus=2)],
                     sized("p", gpus=2), f"placed on b: {B_SCORE}; 4 GPUs left free there",
                     "placed on b: NVLink score 100; 4 GPUs left free there", id="the-best-score-wins/match"),
        pytest.param([plain("a"), node("b")], [busy("x", on="a", gpus=6), busy("y", on="b", gpus=2)],
                     sized("p", gpus=2), "placed on a: NVLink score 130 (",
                     "placed on a: NVLink score 130; 0 GPUs left free there",
                     id="a-tighter-node-that-also-scores-higher/no-match"),
        # Equal in score and in GPUs left: the node whose NVLink domain it lands in is left with fewer free.
        pytest.param([node("a"), builders.gpu_node("b", gpus=8, domains=[range(i, i + 2) for i in (0, 2, 4, 6)])],
                     [], sized("p", gpus=1), "placed on b: NVLink score 40 (",
                     "placed on b: NVLink score 40; 7 GPUs left free there", id="then-the-tightest-domain"),
        # A pod of MIG slices only has no NVLink score: packing alone decides, and the layout says what is left.
        pytest.param([with_mig(plain("a"))], [], builders.pod("p", namespace="team", mig={MIG: 1}),
                     "placed on a: 8 GPUs left free there", "placed on a: 8 GPUs left free there",
                     id="mig-slices-only-no-score/boundary"),
    ],
)
def test_a_gang_of_one_goes_to_the_best_score_then_the_tightest(
    nodes: list[dict[str, Any]], running: list[dict[str, Any]], pod: dict[str, Any], full: str, short: str,
) -> None:
    found = search(nodes, running, [pod])
    assert found is not None
    assert (found.describe().startswith(full), found.describe(short=True)) == (True, short), found.describe()


def test_a_layout_of_one_member_without_a_why_describes_the_gang() -> None:
    """A gang of one member placed as a gang (`preempting`) carries no why: it says what a gang's layout says."""
    assert layout.Layout({"team/m-0": "a"}, None, ()).describe() == (
        "1 members on 1 node(s) (a): one node; each member within one NVLink domain")


def test_explain_lists_the_chosen_node_first_then_by_rank_then_those_that_cannot() -> None:
    """b is tightest; a and d tie, before c, which a pending never-gated pod prefers; e is cordoned, f too small."""
    cordoned = builders.gpu_node("e", gpus=8, mutate=lambda n: n["spec"].update(unschedulable=True))
    cluster = snapshot_build.build(
        nodes=[node("a"), node("b"), node("c"), node("d"), cordoned, builders.gpu_node("f", gpus=2)],
        pods=[busy("x", on="b", gpus=4), preferring("q", node_name="c"), sized("p", gpus=4)],
        names=NAMES, taken_at=NOW)
    rows = layout.explain(cluster.pods["team/p"], cluster, scoring=settings.Scoring())
    assert [(name, fits) for name, fits, _ in rows] == [
        ("b", True), ("a", True), ("d", True), ("c", True), ("f", False), ("e", False)]
    assert rows[0][2].startswith("NVLink score 160 (base +50 (every candidate node)"), rows[0][2]
    assert rows[0][2].endswith("; 0 GPUs left free there"), rows[0][2]
    assert rows[-1] == ("e", False, "node not ready or cordoned")


# --- rooms: pods we released hold their node until the snapshot shows them ------------------------------------------


def test_an_assumed_pod_takes_its_gpu_indices_even_across_domains() -> None:
    """Its GPUs are taken where it would land (spanning domains when it must), so later members see the right
    domains; one that does not fit still takes its requests off the node (over-committed in our view)."""
    occupancy = {"a": {0: "other/x", 4: "other/x"}}
    cluster = snapshot_build.build(nodes=[node("a")], pods=[busy("x", on="a", gpus=2), *members(2, gpus=4)],
                                   occupancy=occupancy, names=NAMES, taken_at=NOW)
    room = layout.rooms(cluster, assumed={"team/m-0": "a"})["a"]
    assert (room.free_gpus, sum(map(len, room.domains))) == (2, 2), room.domains
    over = layout.rooms(cluster, assumed={"team/m-0": "a", "team/m-1": "a"})["a"]
    assert (over.free["nvidia.com/gpu"], over.free_gpus) == (-2, 0)


def test_an_assumed_pod_the_snapshot_already_shows_does_not_stop_the_others() -> None:
    cluster = snapshot_build.build(nodes=[node("a")], pods=[*members(1, gpus=4), busy("on-a", on="a", gpus=2)],
                                   names=NAMES, taken_at=NOW)
    assert layout.rooms(cluster, assumed={"other/on-a": "a", "team/m-0": "a"})["a"].free_gpus == 2


# --- shortfall: why a complete gang does not fit, how many GPUs it misses, whether it ever can ----------------------


def short_of(nodes: Sequence[dict[str, Any]], running: Sequence[dict[str, Any]], gang: Sequence[dict[str, Any]],
             occupancy: snapshot.Occupancy | None = None) -> tuple[str, int, bool]:
    cluster = snapshot_build.build(nodes=nodes, pods=[*running, *gang], occupancy=occupancy, names=NAMES, taken_at=NOW)
    pods = [cluster.pods[f"team/{p['metadata']['name']}"] for p in gang]
    candidates = {p.key: layout.candidates(p, cluster) for p in pods}
    return layout.shortfall(pods, candidates, layout.rooms(cluster), cluster)


TOO_BIG = "requests more than the node has: nvidia.com/gpu 16 >"
QUARTERS = {"a": {0: "other/x", 1: "other/x", 4: "other/x", 5: "other/x"}}  # a's two domains half taken


@pytest.mark.parametrize(
    ("nodes", "running", "gang", "occupancy", "want"),
    [
        # The first member no node can take, with up to three of the nodes' reasons.
        pytest.param([plain("a"), builders.gpu_node("b", gpus=4), builders.gpu_node("c", gpus=2),
                      builders.gpu_node("d", gpus=1)], [], [sized("m-0", gpus=16), sized("m-1", gpus=1)], None,
                     (f"complete; team/m-0 can run on no node as the cluster stands ({TOO_BIG} 1; {TOO_BIG} 2; "
                      f"{TOO_BIG} 4)", 0, True), id="a-member-no-node-takes/three-reasons-of-four"),
        pytest.param([], [], members(2, gpus=1), None,
                     ("complete; team/m-0, team/m-1 can run on no node as the cluster stands (no GPU node)", 0, True),
                     id="no-node-at-all"),
        pytest.param([plain("a"), builders.gpu_node("b", gpus=4)], [busy("x", on="b", gpus=2)],
                     [sized("m-0", gpus=8), sized("m-1", gpus=4), sized("m-2", gpus=4)], None,
                     ("complete; needs 16 GPUs but the nodes it may use have 12 in all: it can never fit as the "
                      "cluster stands", 6, True), id="more-than-its-nodes-have-in-all/never"),
        pytest.param([plain("a")], [busy("x", on="a", gpus=6)], members(2, gpus=2), None,
                     ("complete; waiting for 2 more free GPUs (4 needed, 2 free on its nodes)", 2, False),
                     id="waiting-for-gpus"),
        # Enough GPUs in number, but no member fits where they are: up to three reasons of the nodes.
        pytest.param([node("a"), plain("b"), plain("c"), plain("d")],
                     [busy("x", on="a", gpus=4), busy("y", on="b", gpus=5), busy("z", on="c", gpus=6),
                      busy("w", on="d", gpus=7)], members(1, gpus=4), QUARTERS,
                     ("complete; 10 GPUs free on its nodes but no simultaneous placement with each member inside one "
                      "NVLink domain and its other requests met (needs 4 GPU in one NVLink domain; needs 4 GPU, "
                      "1 free; needs 4 GPU, 2 free)", 0, False), id="fragmented/three-reasons-of-four"),
    ],
)
def test_shortfall_says_why_and_how_far(
    nodes: list[dict[str, Any]], running: list[dict[str, Any]], gang: list[dict[str, Any]],
    occupancy: snapshot.Occupancy | None, want: tuple[str, int, bool],
) -> None:
    assert short_of(nodes, running, gang, occupancy) == want


# --- preemption: where kube-scheduler's own preemption could make room ------------------------------------------------


def ranked(name: str, *, on: str | None = None, gpus: int, priority: int, mig: dict[str, int] | None = None,
           ) -> dict[str, Any]:
    def edit(pod: dict[str, Any]) -> None:
        pod["spec"]["priority"] = priority

    namespace = "other" if on else "team"
    return builders.pod(name, namespace=namespace, gpus=gpus, mig=mig, node=on,
                        phase="Running" if on else "Pending", mutate=edit)


def low(name: str, *, on: str, gpus: int) -> dict[str, Any]:
    """Running, below the pods placed here (10,000): preemption may remove it."""
    return ranked(name, on=on, gpus=gpus, priority=0)


def high(name: str, *, on: str, gpus: int) -> dict[str, Any]:
    """Running, above the pods placed here: preemption never removes it."""
    return ranked(name, on=on, gpus=gpus, priority=1_000_000)


def cordon(node_body: dict[str, Any]) -> dict[str, Any]:
    node_body["spec"]["unschedulable"] = True
    return node_body


@pytest.mark.parametrize(
    ("nodes", "running", "candidates", "occupancy", "want"),
    [
        pytest.param([plain("a"), plain("b")], [low("l1", on="a", gpus=4), low("l2", on="a", gpus=4),
                                                low("l3", on="b", gpus=8)], {"a", "b"}, None,
                     "preempting lower-priority pods on b would make room (1 there)", id="the-fewest-victims/match"),
        pytest.param([plain("a"), plain("b")], [low("l1", on="a", gpus=8), low("l2", on="b", gpus=8)], {"a", "b"}, None,
                     "preempting lower-priority pods on a would make room (1 there)",
                     id="equal-victims-the-first-node/boundary"),
        pytest.param([plain("a"), plain("b")], [high("h", on="a", gpus=8), low("l", on="b", gpus=8)], {"a", "b"}, None,
                     "preempting lower-priority pods on b would make room (1 there)",
                     id="a-node-without-victims-is-passed-over"),
        pytest.param([cordon(plain("a")), plain("b")], [low("l1", on="a", gpus=8), low("l2", on="b", gpus=8)],
                     {"a", "b", "gone"}, None, "preempting lower-priority pods on b would make room (1 there)",
                     id="cordoned-or-gone-nodes-are-passed-over"),
        # Free room only across NVLink domains, nothing of lower priority: nothing for preemption to do.
        pytest.param([node("a")], [high("h", on="a", gpus=4)], {"a"}, {"a": {i: "other/h" for i in (0, 1, 4, 5)}},
                     None, id="no-victims-nothing-to-preempt/no-match"),
    ],
)
def test_preemptible_names_the_node_with_the_fewest_victims(
    nodes: list[dict[str, Any]], running: list[dict[str, Any]], candidates: set[str],
    occupancy: snapshot.Occupancy | None, want: str | None,
) -> None:
    pod = ranked("p", gpus=8 if occupancy is None else 4, priority=10_000)  # 4: what fits a only across domains
    cluster = snapshot_build.build(nodes=nodes, pods=[*running, pod], occupancy=occupancy, names=NAMES, taken_at=NOW)
    assert layout.preemptible(cluster.pods["team/p"], frozenset(candidates), cluster) == want


def preempt(nodes: Sequence[dict[str, Any]], running: Sequence[dict[str, Any]], gang: Sequence[dict[str, Any]],
            occupancy: snapshot.Occupancy | None = None) -> layout.Preemption | None:
    cluster = snapshot_build.build(nodes=nodes, pods=[*running, *gang], occupancy=occupancy, names=NAMES, taken_at=NOW)
    pods = [cluster.pods[f"team/{p['metadata']['name']}"] for p in gang]
    everywhere = frozenset(cluster.nodes)
    return layout.preempting(pods, {p.key: layout.candidates(p, cluster) for p in pods}, layout.rooms(cluster),
                             cluster, everywhere, scoring=settings.Scoring(), untouched=everywhere,
                             contested=layout.contested(cluster))


def gang_of(*gpus: int) -> list[dict[str, Any]]:
    """Members m-0, m-1, ... of priority 10,000 (above `low`, below `high`)."""
    return [ranked(f"m-{i}", gpus=n, priority=10_000) for i, n in enumerate(gpus)]


PREEMPTS = "fits no node now; once kube-scheduler preempts lower-priority pods on"
SPAN_BOTH = "team/m-0, team/m-1 span several NVLink domains (larger than one)"
MEMBER_BY_MEMBER = "member by member: free room first, else where preemption leaves the best NVLink score"


@pytest.mark.parametrize(
    ("nodes", "running", "gang", "want", "says"),
    [
        pytest.param([node("c1", clique="X"), node("c2", clique="X")],
                     [low("l1", on="c1", gpus=8), low("l2", on="c2", gpus=8)], gang_of(8, 8),
                     {"m-0": "c1", "m-1": "c2"},
                     f"{PREEMPTS} c1 (1 there), c2 (1 there): 2 members on 2 node(s) (c1, c2): one multi-node NVLink "
                     f"domain X; {SPAN_BOTH}", id="two-nodes-of-one-clique/match"),
        pytest.param([node("c1", clique="X"), node("c2", clique="Y")],
                     [low("l1", on="c1", gpus=8), low("l2", on="c2", gpus=8)], gang_of(8, 8),
                     {"m-0": "c1", "m-1": "c2"},
                     f"{PREEMPTS} c1 (1 there), c2 (1 there): 2 members on 2 node(s) (c1, c2): {MEMBER_BY_MEMBER}; "
                     f"{SPAN_BOTH}", id="two-nodes-of-two-cliques/no-match"),
        pytest.param([node("c1", clique="X"), node("c2", clique="X")],
                     [low("l1", on="c1", gpus=8), high("h", on="c2", gpus=8)], gang_of(4, 4),
                     {"m-0": "c1", "m-1": "c1"}, f"{PREEMPTS} c1 (1 there): 2 members on 1 node(s) (c1): one node; "
                     "each member within one NVLink domain", id="one-node-of-a-clique/boundary"),
        pytest.param([node("a")], [low("l1", on="a", gpus=8)], gang_of(4), {"m-0": "a"},
                     f"{PREEMPTS} a (1 there): 1 members on 1 node(s) (a): one node; each member within one NVLink "
                     "domain", id="a-gang-of-one-member"),
        # The largest member first: the smaller would take the free room the larger needs after preemption.
        pytest.param([plain("a"), plain("b")], [low("l1", on="a", gpus=4), low("l2", on="b", gpus=4),
                                                high("h", on="b", gpus=4)], gang_of(8, 4), {"m-0": "a", "m-1": "b"},
                     f"{PREEMPTS} a (1 there), b (1 there): 2 members on 2 node(s) (a, b): {MEMBER_BY_MEMBER}; "
                     "each member within one NVLink domain", id="largest-member-first"),
        pytest.param([with_mig(builders.gpu_node("a", gpus=1), 2), with_mig(builders.gpu_node("b", gpus=1), 1)],
                     [ranked("l1", on="a", gpus=1, priority=0, mig={MIG: 2}),
                      ranked("l2", on="b", gpus=1, priority=0, mig={MIG: 1})],
                     [mig_member("m-0", slices=1, priority=10_000), mig_member("m-1", slices=2, priority=10_000)],
                     {"m-1": "a", "m-0": "b"}, f"{PREEMPTS} a (1 there), b (1 there): 2 members on 2 node(s) (a, b): "
                     f"{MEMBER_BY_MEMBER}; each member within one NVLink domain",
                     id="equal-gpus-more-mig-slices-first"),
        # Preempted for one member, a node's free room is no longer free for another.
        pytest.param([plain("a")], [low("l1", on="a", gpus=4)], gang_of(8, 4), None, "",
                     id="a-preempted-node-offers-no-free-room"),
        # Free room and room after preemption alike go to the node fewer pending never-gated pods prefer.
        pytest.param([plain("a"), plain("b"), plain("c"), plain("d")],
                     [high("h1", on="a", gpus=4), high("h2", on="b", gpus=4), low("l1", on="c", gpus=8),
                      low("l2", on="d", gpus=8), preferring("q", node_name="a"), preferring("r", node_name="c")],
                     gang_of(8, 4), {"m-0": "d", "m-1": "b"},
                     f"{PREEMPTS} d (1 there): 2 members on 2 node(s) (b, d): {MEMBER_BY_MEMBER}; each member within "
                     "one NVLink domain", id="the-nodes-fewer-pending-pods-prefer"),
    ],
)
def test_a_gang_placed_once_preemption_made_room(
    nodes: list[dict[str, Any]], running: list[dict[str, Any]], gang: list[dict[str, Any]],
    want: Mapping[str, str] | None, says: str,
) -> None:
    found = preempt(nodes, running, gang)
    if want is None:
        assert found is None
        return
    assert found is not None
    assert (dict(by_name(found.layout)), found.describe()) == (dict(want), says)


def test_the_view_after_preemption_keeps_the_gpus_a_member_took_from_free_room() -> None:
    """m-0 takes a's free domain 0; m-1 needs the victim's domain 1: a is left with no free GPU index."""
    victim_on_domain_1 = {"a": {i: "other/l1" for i in range(4, 8)}}
    found = preempt([node("a")], [low("l1", on="a", gpus=4)], gang_of(4, 4), victim_on_domain_1)
    assert found is not None
    assert (dict(by_name(found.layout)), found.rooms["a"].domains) == ({"m-0": "a", "m-1": "a"}, [[], []])
