"""Reclaim cooldowns, kept in the cluster so that a new leader honours the old one's.

Where: one `coordination.k8s.io/v1` Lease, `descheduler.reclaim.cooldown_lease_name` in
`descheduler.leader_election.lease_namespace`, annotation `<prefix>reclaim-cooldown-until` holding a
JSON object `{"<scope>:<id>": <unix seconds until>}` with scopes `preemptor` (pod or gang key),
`node` (node name), `workload` (`namespace/Kind/name` of the victim's controller) and `victim` (the key of a
pod whose eviction a PodDisruptionBudget refused: not picked again while its budget stands, for as long as a
preemptor cools down, so that its idle neighbours are tried instead). One object
(instead of annotating pods, nodes and every workload kind) needs RBAC on Leases only — which leader
election needs anyway — and one write per cycle. Expired entries are dropped on every write.

Pure (no I/O, no clock): `decode`, `State`, `record`, `encode`. Reading and writing the Lease is
`descheduler.cooldown_store`'s job.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping

from common import settings, snapshot


def preemptor_key(demand: str) -> str:
    return f"preemptor:{demand}"


def node_key(node: str) -> str:
    return f"node:{node}"


def victim_key(pod: str) -> str:
    return f"victim:{pod}"


def workload_key(pod: snapshot.Pod) -> str | None:
    """Bare pods have no workload to protect from a second hit."""
    if not pod.owner_kind or not pod.owner_name:
        return None
    return f"workload:{pod.namespace}/{pod.owner_kind}/{pod.owner_name}"


@dataclasses.dataclass(frozen=True)
class State:
    until: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def active(self, key: str | None, *, now: float) -> float | None:
        """Until when `key` is cooling down, or None."""
        if key is None:
            return None
        end = self.until.get(key)
        return end if end is not None and end > now else None

    def merged(self, other: State, *, now: float) -> State:
        keys = set(self.until) | set(other.until)
        combined = {k: max(self.until.get(k, 0.0), other.until.get(k, 0.0)) for k in keys}
        return State({k: v for k, v in combined.items() if v > now})


def decode(text: str | None) -> tuple[State, str | None]:
    """Parse the annotation; a damaged value yields no cooldowns plus the problem (it is rewritten)."""
    if not text:
        return State(), None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return State({str(k): float(v) for k, v in data.items()}), None
    except (ValueError, TypeError) as exc:
        return State(), f"cooldown annotation ignored: {exc}"


def encode(state: State) -> str:
    return json.dumps(dict(sorted(state.until.items())), separators=(",", ":"))


def record(
    state: State,
    *,
    preemptors: Iterable[str],
    nodes: Iterable[str],
    workloads: Iterable[str],
    config: settings.Cooldowns,
    now: float,
    refused: Iterable[str] = (),
) -> State:
    """Start the cooldowns caused by evictions made (or, for `refused` pods, refused by a PodDisruptionBudget)
    at `now`."""
    fresh: dict[str, float] = {}
    for keys, seconds in (
        ((preemptor_key(p) for p in preemptors), config.preemptor_seconds),
        ((node_key(n) for n in nodes), config.node_seconds),
        (workloads, config.workload_seconds),
        ((victim_key(p) for p in refused), config.preemptor_seconds),
    ):
        for key in keys:
            if seconds > 0:
                fresh[key] = now + seconds
    return state.merged(State(fresh), now=now)
