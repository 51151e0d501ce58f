"""admission.orphaned_gates: no gate of ours outlives the release controller. One row per rule: a match, a no-match,
a boundary, each asserting what is lifted and why."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from admission import orphaned_gates
from common import settings, snapshot_build
from tests import builders

NAMES = settings.Names()
NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC).timestamp()
STALE = 30.0  # admission.controller_stale_seconds (default)
MAX_WAIT = 300.0  # descheduler.gangs.max_wait_seconds (default)
GANG_MAX_WAIT = 1800.0


def at(seconds_before: float) -> str:
    return datetime.datetime.fromtimestamp(NOW - seconds_before, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gated(name: str, *, age: float, gang: str | None = None, gates: tuple[str, ...] = (NAMES.gate,),
          deleting: bool = False) -> dict[str, Any]:
    labels = {NAMES.gang_name: gang, NAMES.gang_size: "2"} if gang else {}

    def mutate(pod: dict[str, Any]) -> None:
        if gates:
            pod["spec"]["schedulingGates"] = [{"name": g} for g in gates]
        if deleting:
            pod["metadata"]["deletionTimestamp"] = at(1)

    return builders.pod(name, namespace="team", gpus=4, labels=labels, created=at(age), mutate=mutate)


def lifts(pods: list[dict[str, Any]], *, seen: float | None = 600, watching: float = 3600,
          ) -> dict[str, tuple[str, ...]]:
    """`seen`, `watching`: seconds before NOW the Lease was last seen renewed / this replica started watching."""
    cluster = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=pods, names=NAMES, taken_at=NOW)
    found = orphaned_gates.due(cluster, config=settings.Settings(), now=NOW,
                               seen_at=None if seen is None else NOW - seen, watching_since=NOW - watching)
    return {lift.unit: lift.pods for lift in found}


@pytest.mark.parametrize(
    ("seen", "watching", "down"),
    [
        pytest.param(31, 3600, "the descheduler's Lease last seen renewed 31s ago", id="lease-stale/match"),
        pytest.param(10, 3600, None, id="lease-fresh/no-match"),
        pytest.param(30, 3600, None, id="lease-exactly-at-the-bound/boundary"),
        pytest.param(None, 31, "no renewal of the descheduler's Lease seen in the 31s", id="never-seen-long-enough"),
        pytest.param(None, 5, None, id="replica-just-started-knows-nothing-yet"),
        pytest.param(None, 30, None, id="never-seen-for-exactly-the-bound/boundary"),
    ],
)
def test_controller_down(seen: float | None, watching: float, down: str | None) -> None:
    why = orphaned_gates.controller_down(seen_at=None if seen is None else NOW - seen, watching_since=NOW - watching,
                                         now=NOW, stale_after=STALE)
    if down is None:
        assert why is None
    else:
        assert why is not None and down in why


@pytest.mark.parametrize(
    ("pods", "seen", "want"),
    [
        pytest.param([gated("solo", age=MAX_WAIT + 1)], 600, {"team/solo": ("team/solo",)},
                     id="single-past-bound/match"),
        pytest.param([gated("solo", age=MAX_WAIT - 60)], 600, {}, id="single-within-bound/no-match"),
        pytest.param([gated("solo", age=MAX_WAIT)], 600, {}, id="single-exactly-at-bound/boundary"),
        pytest.param([gated("solo", age=MAX_WAIT * 10)], 5, {}, id="controller-alive-lifts-nothing"),
        pytest.param([gated("solo", age=MAX_WAIT + 1, gates=("kueue.x-k8s.io/admission",))], 600, {},
                     id="another-controllers-gate-is-not-ours"),
        pytest.param([gated("solo", age=MAX_WAIT + 1, deleting=True)], 600, {}, id="leaving-pod-left-alone"),
        pytest.param([gated("g-0", age=GANG_MAX_WAIT + 1, gang="g"), gated("g-1", age=10, gang="g")], 600,
                     {"team/g": ("team/g-0", "team/g-1")}, id="gang-past-bound-lifted-whole/match"),
        pytest.param([gated("g-0", age=MAX_WAIT + 1, gang="g"), gated("g-1", age=MAX_WAIT + 1, gang="g")], 600, {},
                     id="gang-within-its-longer-bound/no-match"),
        pytest.param([gated("g-0", age=GANG_MAX_WAIT + 1, gang="g", gates=()), gated("g-1", age=10, gang="g")], 600,
                     {"team/g": ("team/g-1",)}, id="started-gang-member-lifted-by-the-oldest/boundary"),
    ],
)
def test_due(pods: list[dict[str, Any]], seen: float, want: dict[str, tuple[str, ...]]) -> None:
    assert lifts(pods, seen=seen) == want


def test_the_reason_says_what_happened_and_what_to_do() -> None:
    cluster = snapshot_build.build(nodes=[], pods=[gated("g-0", age=2000, gang="g")], names=NAMES, taken_at=NOW)
    [lift] = orphaned_gates.due(cluster, config=settings.Settings(), now=NOW, seen_at=NOW - 600,
                                watching_since=NOW - 3600)
    assert lift.why == (
        "released unpinned by the webhook: the descheduler's Lease last seen renewed 600s ago, and this gang team/g "
        "was gated 2000s (over 1800s); check the descheduler (kubectl -n <namespace> logs deploy/<release>-descheduler)"
        "; its members start one by one (no controller to start them together)")
