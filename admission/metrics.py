"""Prometheus metrics of the admission webhook, in a registry per app (no process-global state)."""

from __future__ import annotations

import enum
from collections.abc import Callable

import prometheus_client

from admission import gating
from common import buildinfo

NAMESPACE = "gpu_steward_admission"
NEVER = -1.0  # snapshot age before the first sync (as the feeder reports it)
# Answers normally take about a millisecond; the top buckets show requests near the webhook timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)


class Result(enum.StrEnum):
    MUTATED = "mutated"  # allowed with a patch
    UNCHANGED = "unchanged"  # considered, nothing to change
    SKIPPED = "skipped"  # not ours to look at (kind, operation, opt-out, namespace, ...)
    ERROR = "error"  # the engine failed or ran over its budget: allowed unchanged
    BAD_REQUEST = "bad_request"  # not an AdmissionReview: HTTP 400


class Metrics:
    def __init__(
        self,
        *,
        snapshot_age: Callable[[], float | None],
        controller_age: Callable[[], float | None] = lambda: None,
        registry: prometheus_client.CollectorRegistry | None = None,
    ) -> None:
        # The process may share one registry between the server and the feeder: one /metrics page.
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        buildinfo.register(self.registry)
        self.requests = prometheus_client.Counter(
            "requests",
            "Admission requests answered, by result.",
            ["result"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.latency = prometheus_client.Histogram(
            "request_duration_seconds",
            "Time from reading the body to the answer being ready, in seconds.",
            namespace=NAMESPACE,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.mutations = prometheus_client.Counter(
            "mutations",
            "Mutations made, by kind (tier, affinity-preferred, gate, decision).",
            ["kind"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.warnings = prometheus_client.Counter(
            "warnings",
            "Warnings returned to clients in admission responses.",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self._age_gauge("snapshot_age_seconds",
                        "Age of the cluster snapshot decisions read, in seconds (-1: never synced).", snapshot_age)
        self._age_gauge("controller_lease_age_seconds",
                        "Seconds since the descheduler's leader Lease was last seen renewed (-1: not seen, released "
                        "or deleted).", controller_age)
        self.release = prometheus_client.Counter(
            "release_decisions",
            "Governed pods (placement at release) admitted, by decision: gated, or controller-down (not gated "
            "because the descheduler's Lease was not seen renewed recently).",
            ["decision"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        # Every series exists from the start, so rate() sees the first request; the children are kept
        # because a labels() lookup per request costs more than the increment.
        self._requests_by_result = {result: self.requests.labels(result=result.value) for result in Result}
        self._mutations_by_kind: dict[str, prometheus_client.Counter] = {}
        self._release_by_decision = {d: self.release.labels(decision=d.value) for d in gating.Release}

    def _age_gauge(self, name: str, documentation: str, age: Callable[[], float | None]) -> None:
        gauge = prometheus_client.Gauge(name, documentation, namespace=NAMESPACE, registry=self.registry)
        gauge.set_function(lambda: _or_never(age()))

    def record(
        self, *, result: Result, seconds: float, changes: tuple[str, ...], warnings: int,
        release: gating.Release | None = None,
    ) -> None:
        self._requests_by_result[result].inc()
        if release is not None:
            self._release_by_decision[release].inc()
        self.latency.observe(seconds)
        for kind in changes:
            counter = self._mutations_by_kind.get(kind)
            if counter is None:
                counter = self._mutations_by_kind[kind] = self.mutations.labels(kind=kind)
            counter.inc()
        if warnings:
            self.warnings.inc(warnings)


def _or_never(value: float | None) -> float:
    return NEVER if value is None else value
