"""common.placement: the one GPU-index policy — smallest fitting free domain, else the fewest domains."""

from __future__ import annotations

import pytest

from common import placement


@pytest.mark.parametrize(
    ("free", "count", "indices", "domains"),
    [
        pytest.param([[0, 1, 2, 3], [4, 5, 6, 7]], 1, (0,), (0,), id="empty-8-tie-lowest-domain"),
        pytest.param([[0, 1, 2, 3], [5, 6, 7]], 1, (5,), (1,), id="smallest-free-domain-wins"),
        pytest.param([[0, 1, 2, 3], [5, 6, 7]], 3, (5, 6, 7), (1,), id="exact-fit"),
        pytest.param([[0, 1, 2, 3], [5, 6, 7]], 4, (0, 1, 2, 3), (0,), id="only-one-domain-fits"),
        pytest.param([[0, 1], [2], [3]], 1, (2,), (1,), id="tie-between-singletons-by-index"),
        pytest.param([[3, 1, 2], [7, 6]], 2, (6, 7), (1,), id="unsorted-free-lists"),
        pytest.param([[2, 3, 0, 1]], 2, (0, 1), (0,), id="lowest-free-indices"),
        pytest.param([[0, 1, 2, 3], [4, 5, 6, 7]], 8, (0, 1, 2, 3, 4, 5, 6, 7), (0, 1), id="whole-node"),
        pytest.param([[0, 1], [2, 3]], 3, (0, 1, 2), (0, 1), id="span-two-tie-by-index"),
        pytest.param([[0], [1, 2], [3]], 3, (0, 1, 2), (1, 0), id="largest-domain-first"),
        pytest.param([[0], [1], [2, 3, 4], [5, 6]], 4, (2, 3, 4, 5), (2, 3), id="next-largest-domain-second"),
        pytest.param([[0], [1], [2], [3]], 3, (0, 1, 2), (0, 1, 2), id="t4-singletons"),
        pytest.param([[], [4, 5]], 2, (4, 5), (1,), id="empty-domain-skipped"),
        pytest.param([[0, 1]], 0, (), (), id="zero-gpus"),
        pytest.param([], 0, (), (), id="zero-on-no-domains"),
    ],
)
def test_allocate(free: list[list[int]], count: int, indices: tuple[int, ...], domains: tuple[int, ...]) -> None:
    allocation = placement.allocate(free, count)
    assert allocation == placement.Allocation(indices, domains)
    assert allocation.spanned == len(domains)


@pytest.mark.parametrize(
    ("free", "count"),
    [
        pytest.param([[0, 1], [2]], 4, id="three-free-four-wanted"),
        pytest.param([[], []], 1, id="all-used"),
        pytest.param([], 1, id="no-domains"),
    ],
)
def test_not_enough_gpus(free: list[list[int]], count: int) -> None:
    assert placement.allocate(free, count) is None


@pytest.mark.parametrize(
    ("domains", "used", "expected"),
    [
        pytest.param([[0, 1, 2, 3], [4, 5, 6, 7]], [], [[0, 1, 2, 3], [4, 5, 6, 7]], id="none-used"),
        pytest.param([[0, 1, 2, 3], [4, 5, 6, 7]], [1, 4, 5, 6, 7], [[0, 2, 3], []], id="partly-and-fully-used"),
        pytest.param([[0, 1]], [9], [[0, 1]], id="unknown-index-ignored"),
    ],
)
def test_free_by_domain(domains: list[list[int]], used: list[int], expected: list[list[int]]) -> None:
    assert placement.free_by_domain(domains, used) == expected
