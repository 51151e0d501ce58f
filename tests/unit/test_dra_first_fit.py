"""On a DRA node the model predicts kube-scheduler's allocator (first fit in device order), not the device plugin's
policy: a node where the allocator would split a pod that fits one NVLink domain is not one release nominates it to
(tests/e2e/test_dra_domain_facts_e2e.py shows the allocator's choice on the real control plane)."""

from __future__ import annotations

from typing import Any

import pytest

from admission import scoring
from common import capacity, placement, settings, snapshot, snapshot_build
from descheduler.release import layout
from tests import builders as b

NAMES = settings.Names()
TWO_DOMAINS = [range(4), range(4, 8)]


BY_INDEX = tuple(range(8))


@pytest.mark.parametrize(("free", "count", "order", "expected"), [
    # The node: device 0 and devices 1-2 taken. The policy says domain 1; the allocator takes 3,4,5,6.
    pytest.param([[3], [4, 5, 6, 7]], 4, BY_INDEX, ((3, 4, 5, 6), (0, 1)),
                 id="first-fit-splits-while-a-domain-is-free"),
    pytest.param([[3], [4, 5, 6, 7]], 4, None, ((4, 5, 6, 7), (1,)),
                 id="order-unknown-the-policy-takes-the-free-domain"),
    # NVIDIA's driver lists a node's GPUs in its slice in no fixed order: first fit follows the slice.
    pytest.param([[3], [4, 5, 6, 7]], 4, (7, 6, 5, 4, 3, 2, 1, 0), ((4, 5, 6, 7), (1,)), id="slice-listed-backwards"),
    pytest.param([[0, 1, 2, 3], [4, 5, 6, 7]], 2, (5, 0, 4, 1, 6, 2, 7, 3), ((0, 5), (0, 1)),
                 id="slice-listed-across-domains-splits-even-an-empty-node"),
    pytest.param([[0, 1, 2, 3], [6, 7]], 2, BY_INDEX, ((0, 1), (0,)), id="first-fit-ignores-the-smaller-domain"),
    pytest.param([[0, 1, 2, 3], [6, 7]], 2, None, ((6, 7), (1,)), id="the-policy-completes-the-smaller-domain"),
    pytest.param([[3, 1, 2], [7, 6]], 3, BY_INDEX, ((1, 2, 3), (0,)), id="first-fit-unsorted-free-lists"),
    pytest.param([[0, 1], [2, 3]], 2, (9, 3, 2), ((2, 3), (1,)), id="indices-missing-from-the-order-come-last"),
    pytest.param([[], [4, 5, 6, 7]], 4, BY_INDEX, ((4, 5, 6, 7), (1,)), id="first-fit-full-low-domain"),
    pytest.param([[0, 1, 2, 3], [4, 5, 6, 7]], 8, BY_INDEX, (tuple(range(8)), (0, 1)), id="first-fit-whole-node"),
    pytest.param([[0, 1]], 0, BY_INDEX, ((), ()), id="first-fit-zero-gpus"),
])
def test_allocate(free: list[list[int]], count: int, order: tuple[int, ...] | None,
                  expected: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    assert placement.allocate(free, count, first_fit=order) == placement.Allocation(*expected)


def test_first_fit_cannot_give_more_than_is_free() -> None:
    assert placement.allocate([[3], [6]], 3, first_fit=BY_INDEX) is None


@pytest.mark.parametrize(("slices", "order"), [
    pytest.param([b.resource_slice("n", 8)], BY_INDEX, id="one-slice-listed-by-index"),
    pytest.param([b.resource_slice("n", [b.gpu_device(i) for i in (4, 0, 7, 1, 5, 2, 6, 3)])],
                 (4, 0, 7, 1, 5, 2, 6, 3), id="one-slice-in-its-own-order"),
    pytest.param([b.resource_slice("n", [b.gpu_device(i) for i in range(4)], count=2, name="a"),
                  b.resource_slice("n", [b.gpu_device(i) for i in range(4, 8)], count=2, name="b")],
                 None, id="two-slices-order-unknown"),
    pytest.param([b.resource_slice("n", [b.gpu_device(i, mutate=lambda d: d["attributes"].pop("index"))
                                         for i in range(8)])], None, id="devices-without-index-order-unknown"),
])
def test_the_allocators_order_is_read_from_the_nodes_one_slice(slices: list[dict[str, Any]],
                                                               order: tuple[int, ...] | None) -> None:
    built = _cluster(b.device_class(), b.dra_node("n", domains=TWO_DOMAINS), *slices)
    assert built.nodes["n"].gpu_count == 8 and built.nodes["n"].device_order == order


def _fragmented(*, dra: bool) -> list[dict[str, Any]]:
    """Node `n`, 8 GPUs in domains 0-3 and 4-7, with 0 and 1-2 taken (the issue's order); DRA devices or not."""
    if not dra:
        return [b.gpu_node("n", gpus=8, domains=TWO_DOMAINS),
                b.pod("one", gpus=1, node="n", phase="Running"),
                b.pod("two", gpus=2, node="n", phase="Running")]
    return [b.device_class(), b.dra_node("n", domains=TWO_DOMAINS), b.resource_slice("n", 8),
            b.resource_claim("one", devices=[("n", 0)], extended=True),
            b.resource_claim("two", devices=[("n", 1), ("n", 2)])]


def _cluster(*items: dict[str, Any]) -> snapshot.Snapshot:
    return snapshot_build.from_list({"kind": "List", "items": [*b.tier_classes(), *items]}, names=NAMES, taken_at=0.0)


@pytest.mark.parametrize(("dra", "one_domain", "expected"), [
    pytest.param(True, True, "needs 4 GPU in one NVLink domain", id="dra-node-where-first-fit-splits-is-refused"),
    pytest.param(True, False, ((3, 4, 5, 6), 2), id="dra-node-spanning-allowed-gets-the-allocators-devices"),
    pytest.param(False, True, ((4, 5, 6, 7), 1), id="device-plugin-node-keeps-the-policy"),
])
def test_place(dra: bool, one_domain: bool, expected: Any) -> None:
    built = _cluster(*_fragmented(dra=dra), b.pod("p", gpus=4))
    assert built.nodes["n"].free_by_domain() == ((3,), (4, 5, 6, 7))
    got = capacity.place_pod(built.pods["default/p"], capacity.Room.of(built.nodes["n"]), one_domain=one_domain)
    assert (got if isinstance(got, str) else (got.indices, got.spanned)) == expected


@pytest.mark.parametrize(("dra", "term"), [
    pytest.param(True, ("spans-domains", "2 NVLink domains"), id="dra-node-scored-as-the-allocator-splits"),
    pytest.param(False, ("one-domain", "fits NVLink domain 1 (4/4 free)"), id="device-plugin-node-one-domain"),
])
def test_webhook_score(dra: bool, term: tuple[str, str]) -> None:
    built = _cluster(*_fragmented(dra=dra))
    score = scoring.score_node(4, built.nodes["n"], settings.Scoring())
    assert score is not None and (score.terms[1].name, score.terms[1].why) == term


def test_release_nominates_the_node_where_the_allocator_keeps_one_domain() -> None:
    """Before, the fragmented node ranked first (its free domain 4-7 'fits exactly', and it is fuller); the
    allocator then split the pod. Now it is refused, and the empty node takes the pod in one domain."""
    built = _cluster(*_fragmented(dra=True), b.dra_node("m", domains=TWO_DOMAINS), b.resource_slice("m", 8),
                     b.pod("p", gpus=4))
    ranked = layout.explain(built.pods["default/p"], built, scoring=settings.Scoring())
    assert [(name, fits) for name, fits, _ in ranked] == [("m", True), ("n", False)]
    assert ranked[1][2] == "needs 4 GPU in one NVLink domain"


def test_equal_free_counts_on_dra_nodes_are_not_one_gpu_state() -> None:
    """Callers decide once per GPU state: two DRA nodes with equal free counts per domain but different free
    indices take a pod differently (first fit), so they are different states."""
    built = _cluster(*_fragmented(dra=True), b.dra_node("m", domains=TWO_DOMAINS), b.resource_slice("m", 8),
                     b.resource_claim("m-one", devices=[("m", 1)], extended=True),
                     b.resource_claim("m-two", devices=[("m", 0), ("m", 2)]))
    assert [len(f) for f in built.nodes["m"].free_by_domain()] == [len(f) for f in built.nodes["n"].free_by_domain()]
    assert built.nodes["m"].gpu_state == built.nodes["n"].gpu_state  # same free indices: 3 and 4-7
    other = _cluster(*_fragmented(dra=True), b.dra_node("m", domains=TWO_DOMAINS), b.resource_slice("m", 8),
                     b.resource_claim("m-one", devices=[("m", 3)], extended=True),
                     b.resource_claim("m-two", devices=[("m", 0), ("m", 1)]))
    assert other.nodes["m"].free_by_domain() == ((2,), (4, 5, 6, 7))
    assert other.nodes["m"].gpu_state != other.nodes["n"].gpu_state
