"""common.label_values: the one reading of every flag, count and choice we take from labels and annotations,
and proof that webhook and descheduler read the skip flag the same way."""

from __future__ import annotations

from typing import Any

import pytest

from admission import mutation
from common import label_values, settings, snapshot, snapshot_build
from descheduler import protections
from tests import builders

KEY = "gpu-steward.io/x"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(None, label_values.Parsed(False), id="absent"),
        pytest.param("", label_values.Parsed(True), id="empty-is-set"),
        *(pytest.param(v, label_values.Parsed(True), id=f"on-{v}") for v in ("true", "TRUE", " yes ", "on", "1")),
        *(pytest.param(v, label_values.Parsed(False), id=f"off-{v}") for v in ("false", "False", "no", "off", "0")),
        pytest.param("please", label_values.Parsed(True, f"{KEY}='please' is not true/false; read as true"),
                     id="unknown-read-as-set"),
    ],
)
def test_flag(raw: str | None, expected: label_values.Parsed[bool]) -> None:
    assert label_values.flag(raw, key=KEY) == expected


NOT_A_COUNT = "is not a positive integer"


@pytest.mark.parametrize(
    ("raw", "value", "problem"),
    [
        pytest.param("4", 4, None, id="plain"),
        pytest.param("1000", 1000, None, id="thousand"),
        pytest.param("2147483647", 2**31 - 1, None, id="int32-max"),
        pytest.param(None, None, f"{KEY} is missing", id="absent"),
        *(pytest.param(raw, None, f"{KEY}={raw!r} {NOT_A_COUNT}", id=name) for name, raw in (
            ("underscore", "1_000"), ("leading-blank", " 4"), ("trailing-blank", "4 "), ("plus", "+4"),
            ("fraction", "4.0"), ("zero", "0"), ("negative", "-2"), ("leading-zero", "04"), ("word", "four"),
            ("empty", ""), ("arabic-indic-digit", "\u0664"), ("int32-overflow", "2147483648"),
            ("huge", "9" * 5000), ("exponent", "4e2"), ("hex", "0x4"),
        )),
    ],
)
def test_count(raw: str | None, value: int | None, problem: str | None) -> None:
    assert label_values.count(raw, key=KEY) == label_values.Parsed(value, problem)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        pytest.param(None, None, id="absent"),
        *(pytest.param(raw, value, id=raw) for raw, value in (("0", 0), ("-1", -1), ("3600", 3600),
                                                              ("-9223372036854775808", -(2**63)))),
        *(pytest.param(raw, f"{KEY}={raw!r} is not an integer", id=f"bad-{raw}") for raw in (
            "+1", " 1", "1_000", "1.0", "-0x1", "--1", "01", "", "9223372036854775808", "\u0661")),
    ],
)
def test_integer(raw: str | None, value: int | str | None) -> None:
    expected = label_values.Parsed(None, value) if isinstance(value, str) else label_values.Parsed(value)
    assert label_values.integer(raw, key=KEY) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(None, label_values.Parsed(settings.Placement.STRICT), id="absent-default"),
        pytest.param("prefer", label_values.Parsed(settings.Placement.PREFER), id="value"),
        pytest.param("Prefer", label_values.Parsed(
            settings.Placement.STRICT, f"{KEY}='Prefer' is not one of strict, prefer, off; using strict"), id="case"),
        pytest.param(" off", label_values.Parsed(
            settings.Placement.STRICT, f"{KEY}=' off' is not one of strict, prefer, off; using strict"), id="blank"),
    ],
)
def test_choice(raw: str | None, expected: label_values.Parsed[settings.Placement]) -> None:
    assert label_values.choice(raw, settings.Placement, key=KEY, default=settings.Placement.STRICT) == expected


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        pytest.param({"labels": {KEY: "a"}, "annotations": {KEY: "b"}}, "a", id="label-wins"),
        pytest.param({"labels": {}, "annotations": {KEY: "b"}}, "b", id="annotation"),
        pytest.param({"labels": {KEY: ""}, "annotations": {KEY: "b"}}, "", id="empty-label-still-wins"),
        pytest.param({"labels": None, "annotations": ["not", "a", "map"]}, None, id="malformed"),
        pytest.param({}, None, id="absent"),
    ],
)
def test_value(meta: dict[str, Any], expected: str | None) -> None:
    assert label_values.value(meta, KEY) == expected


SKIP = settings.Names().skip


@pytest.mark.parametrize("raw", ["", "true", "yes", "on", "1", "off", "false", "no", "0", "OFF", "whatever"])
@pytest.mark.parametrize("where", ["labels", "annotations"])
def test_skip_means_the_same_to_webhook_and_descheduler(raw: str, where: str) -> None:
    """Old code: `skip: ""` was mutated but never reclaimed, `skip: "off"` left alone yet reclaimable."""
    raw_pod = builders.pod("p", gpus=1, node="n1", phase="Running", **{where: {SKIP: raw}})  # type: ignore[arg-type]
    admitted = mutation.decide(operation="CREATE", namespace="default", pod=raw_pod, cluster=snapshot.EMPTY,
                               config=settings.Settings(), now=0.0)
    built = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=1)], pods=[raw_pod], names=settings.Names(),
                                 taken_at=0.0)
    spared = protections.opted_out(built.pods["default/p"], None, settings.Names())
    webhook_skips = admitted.skipped is not None and admitted.skipped.startswith(f"opted out with {SKIP}")
    assert webhook_skips == (spared is not None)
    assert webhook_skips is (raw.strip().lower() not in {"off", "false", "no", "0"})


NOON = 1795262400.0  # 2026-11-21T12:00:00Z


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("2026-11-21T12:00:00Z placed on big: NVLink score 90", (NOON, "placed on big: NVLink score 90"),
                     id="time-and-text"),
        pytest.param("placed on big: NVLink score 90", (None, "placed on big: NVLink score 90"),
                     id="text-only-from-an-older-release"),
        pytest.param("2026-11-21T12:00:00Z", (NOON, ""), id="time-without-text-boundary"),
        pytest.param("2026-13-21T12:00:00Z x", (None, "2026-13-21T12:00:00Z x"), id="unreadable-time-kept-as-text"),
        pytest.param(None, (None, ""), id="absent"),
    ],
)
def test_stamped(raw: str | None, expected: tuple[float | None, str]) -> None:
    assert label_values.stamped(raw) == expected
    if expected[0] is not None and raw is not None:
        assert label_values.stamp(raw.partition(" ")[0], expected[1]).strip() == raw
