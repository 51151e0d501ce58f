"""DCGM series -> GPU-index occupancy: which series count, which are skipped and why."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import parser

from common import dcgm, settings

LABELS = settings.PrometheusLabels()
NOW = 1_800_000_000.0

# Verbatim published dcgm-exporter /metrics lines:
# k3s T4 with pod attribution and the 4.x lowercase `hostname` (kwx4957/study, cloudnet@/03.llm-serving/week6/README.md
# @ 040498f66cd2fe147138af13cb2597ef34c531b0) ...
T4_GPU_UTIL = (
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256",pci_bus_id="00000000:00:04.0",'
    'device="nvidia0",modelName="Tesla T4",hostname="hami-workshop",container="gpu-test",namespace="default",'
    'pod="gpu-test"} 0\n'
)
# ... NVIDIA's quick-start, labels present but empty (note the space after the comma) (NVIDIA/dcgm-exporter, README.md
# lines 68-78 @ d5e5f510a1b6b393f39a43293ccd9dc985defc79) ...
QUICKSTART = (
    'DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",container="",namespace="",'
    'pod=""} 139\n'
)
# ... an A800 with MIG instances and the older `Hostname`, no pod attribution at all (gqcn/johns-blog,
# "4000-GPU DCGM-Exporter监控方案.md" @ 5424012f91eb20702a3cf7ed89bf6aa72ad2b22f).
A800_MIG = (
    'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418",device="nvidia0",'
    'modelName="NVIDIA A800-SXM4-80GB",GPU_I_PROFILE="2g.20gb",GPU_I_ID="3",Hostname="msxf-hpc-64-35-ai",'
    'DCGM_FI_DRIVER_VERSION="535.129.03",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 1410\n'
)


def scraped(text: str, *, seen_at: float = NOW) -> list[dict[str, Any]]:
    """Exposition lines as the query would return them: labels, and the last sample's time as value."""
    return [
        {"metric": dict(sample.labels), "value": [NOW, str(seen_at)]}
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
    ]


def series(seen_at: float = NOW, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [NOW, str(seen_at)]}


@pytest.mark.parametrize(
    ("result", "occupancy", "problems"),
    [
        pytest.param(scraped(T4_GPU_UTIL), {"hami-workshop": {0: "default/gpu-test"}}, [], id="t4-lowercase-hostname"),
        pytest.param(
            scraped(QUICKSTART),
            {},
            ["no pod label (pod/exported_pod empty): GPU not attributed to a pod"],
            id="quickstart-empty-pod-labels",
        ),
        pytest.param(
            scraped(A800_MIG),
            {},
            ["no pod label (pod/exported_pod empty): GPU not attributed to a pod"],
            id="a800-mig-no-pod-labels",
        ),
        pytest.param(
            [series(Hostname="node-a", gpu="3", namespace="team-a", pod="train-0")],
            {"node-a": {3: "team-a/train-0"}},
            [],
            id="capitalised-hostname",
        ),
        pytest.param(
            [series(hostname="node-a", gpu="1", exported_namespace="team-b", exported_pod="infer-7", pod="")],
            {"node-a": {1: "team-b/infer-7"}},
            [],
            id="exported-labels-when-pod-is-empty",
        ),
        pytest.param(
            [
                series(
                    hostname="node-a",
                    gpu="1",
                    namespace="gpu-operator",
                    pod="dcgm-exporter-x7",
                    exported_namespace="team-b",
                    exported_pod="infer-7",
                )
            ],
            {"node-a": {1: "team-b/infer-7"}},
            [],
            id="exported-labels-beat-the-exporters-own",
        ),
        pytest.param(
            [series(Hostname="node-b", hostname="", gpu="0", namespace="ns", pod="p")],
            {"node-b": {0: "ns/p"}},
            [],
            id="empty-later-label-falls-back",
        ),
        pytest.param(
            [series(hostname="node-a", gpu="0", pod="p")],
            {},
            ["pod p has no namespace label (namespace/exported_namespace empty)"],
            id="no-namespace",
        ),
        pytest.param(
            [series(gpu="0", namespace="ns", pod="p")],
            {},
            ["pod ns/p has no host label (Hostname/hostname empty)"],
            id="no-host",
        ),
        pytest.param(
            [series(hostname="node-a", gpu="GPU-0", namespace="ns", pod="p")],
            {},
            ["pod ns/p on node-a: GPU label gpu='GPU-0' is not an index"],
            id="gpu-not-an-index",
        ),
        pytest.param(
            [{"metric": {"hostname": "node-a", "gpu": "0", "namespace": "ns", "pod": "p"}, "value": [NOW, "x"]}],
            {},
            ["pod ns/p on node-a: sample value [1800000000.0, 'x'] is not a timestamp"],
            id="value-not-a-timestamp",
        ),
        pytest.param(
            [
                series(NOW - 90, hostname="node-a", gpu="2", namespace="ns", pod="old"),
                series(NOW - 10, hostname="node-a", gpu="2", namespace="ns", pod="new"),
            ],
            {"node-a": {2: "ns/new"}},
            [
                "node node-a GPU 2: claimed by ns/old (seen 1799999910) and ns/new (seen 1799999990); "
                "kept ns/new, seen last"
            ],
            id="replaced-pod-latest-wins",
        ),
        pytest.param(
            [
                series(hostname="node-m", gpu="0", namespace="ns", pod="a", GPU_I_PROFILE="3g.40gb", GPU_I_ID="1"),
                series(hostname="node-m", gpu="0", namespace="ns", pod="b", GPU_I_PROFILE="3g.40gb", GPU_I_ID="2"),
                series(hostname="node-m", gpu="1", namespace="ns", pod="c", GPU_I_PROFILE="1g.10gb", GPU_I_ID="7"),
            ],
            {"node-m": {0: "ns/a", 1: "ns/c"}},
            [],
            id="mig-instances-share-a-gpu",
        ),
        pytest.param(
            [
                series(NOW - 10, hostname="node-m", gpu="0", namespace="ns", pod="whole"),
                series(hostname="node-m", gpu="0", namespace="ns", pod="slice", GPU_I_PROFILE="3g.40gb", GPU_I_ID="1"),
            ],
            {"node-m": {0: "ns/slice"}},
            [
                "node node-m GPU 0: claimed by ns/whole (seen 1799999990) and ns/slice (seen 1800000000); "
                "kept ns/slice, seen last"
            ],
            id="a-whole-gpu-and-a-mig-instance-of-it-do-not-share",
        ),
        pytest.param(
            [{"metric": None, "value": [NOW, str(NOW)]}, series(hostname="node-a", gpu="0", namespace="ns", pod="p")],
            {"node-a": {0: "ns/p"}},
            ["no metric labels"],
            id="a-series-without-labels-is-skipped-and-the-next-one-read",
        ),
        pytest.param(
            [series(hostname="node-a", namespace="ns", pod="p")],
            {},
            ["pod ns/p on node-a: GPU label gpu='' is not an index"],
            id="no-gpu-label",
        ),
    ],
)
def test_parse_occupancy(result: list[dict[str, Any]], occupancy: dict[str, Any], problems: list[str]) -> None:
    got, why = dcgm.parse_occupancy(result, labels=LABELS)
    assert got == occupancy
    assert [p.split("}: ", 1)[-1] for p in why] == problems  # reasons without the series' labels


def test_skipped_series_are_named_by_their_labels() -> None:
    _, problems = dcgm.parse_occupancy(scraped(QUICKSTART), labels=LABELS)
    assert problems == [
        '{UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",container="",gpu="0",namespace="",pod=""}: '
        "no pod label (pod/exported_pod empty): GPU not attributed to a pod"
    ]


def test_configured_label_names_are_used() -> None:
    labels = settings.PrometheusLabels(pod=["pod_name"], namespace=["pod_namespace"], hostname=["node"])
    got, problems = dcgm.parse_occupancy(
        [series(node="n1", gpu="4", pod_namespace="ns", pod_name="p", pod="ignored")], labels=labels
    )
    assert (got, problems) == ({"n1": {4: "ns/p"}}, [])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param(
            {},
            "max by (Hostname, hostname, gpu, namespace, exported_namespace, pod, exported_pod, GPU_I_PROFILE, "
            'GPU_I_ID) (timestamp({__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE"})) > time() - 120',
            id="defaults",
        ),
        pytest.param(
            {"occupancy_max_age_seconds": 45.5, "mig_activity_metric": "DCGM_FI_DEV_GPU_UTIL"},
            "max by (Hostname, hostname, gpu, namespace, exported_namespace, pod, exported_pod, GPU_I_PROFILE, "
            'GPU_I_ID) (timestamp({__name__=~"DCGM_FI_DEV_GPU_UTIL"})) > time() - 45.5',
            id="one-metric-custom-age",
        ),
    ],
)
def test_occupancy_query(overrides: dict[str, Any], expected: str) -> None:
    assert dcgm.occupancy_query(settings.Prometheus(**overrides)) == expected


SCOPE = ['cluster="prod-a"', 'env=~"p.*"']


@pytest.mark.parametrize(
    ("promql", "scope", "unscoped"),
    [
        pytest.param('max(DCGM_FI_DEV_GPU_UTIL{gpu="0"})', SCOPE, True, id="a-selector-without-the-scope"),
        pytest.param('max(DCGM_FI_DEV_GPU_UTIL{cluster="prod-a",env=~"p.*",gpu="0"}) or '
                     'max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"})', SCOPE, True, id="one-of-two-selectors-unscoped"),
        pytest.param('max(DCGM_FI_DEV_GPU_UTIL{cluster="prod-a",gpu="0"})', SCOPE, True, id="half-the-scope"),
        pytest.param('max(DCGM_FI_DEV_GPU_UTIL{cluster="prod-a",env=~"p.*",gpu="0"})', SCOPE, False, id="scoped"),
        pytest.param("vector(time())", SCOPE, False, id="no-selector"),
        pytest.param('max(DCGM_FI_DEV_GPU_UTIL{cluster=~"prod-{a,b}",gpu="0"})', ['cluster=~"prod-{a,b}"'], False,
                     id="a-brace-inside-the-scope"),
        pytest.param('max(DCGM_FI_DEV_GPU_UTIL{gpu="{0}"})', ['cluster=~"prod-{a,b}"'], True,
                     id="a-brace-inside-another-matcher-is-no-scope"),
        pytest.param('max(DCGM_FI_DEV_GPU_UTIL{gpu="0"})', [], False, id="no-scope-configured"),
    ],
)
def test_unscoped(promql: str, scope: list[str], unscoped: bool) -> None:
    assert dcgm.unscoped(promql, config=settings.Prometheus(scope_matchers=scope)) is unscoped


def test_every_query_built_carries_the_scope() -> None:
    """Occupancy, every utilisation statistic and kind, the history: each selector starts with the scope."""
    from descheduler.reclaim import idle_history, utilisation_promql

    config = settings.Prometheus(scope_matchers=SCOPE)
    built = [dcgm.occupancy_query(config), idle_history.query(config=config, step_seconds=300),
             *utilisation_promql.queries("300s", config=config, statistic="peak").values(),
             *utilisation_promql.queries("300s", config=config, statistic="average").values()]
    assert all('{cluster="prod-a",env=~"p.*"' in q and not dcgm.unscoped(q, config=config) for q in built), built
    assert dcgm.occupancy_query(config).count('{cluster="prod-a",env=~"p.*",__name__=~"') == 1


def test_a_client_refuses_an_unscoped_query_unsent() -> None:
    """The last guard: whatever wrote it (a re-check added later), an unscoped query never reaches the store."""
    import asyncio

    from common import prometheus

    client = prometheus.Client(settings.Prometheus(url="http://127.0.0.1:9", scope_matchers=SCOPE))
    try:
        with pytest.raises(prometheus.PrometheusError, match=r"not scoped by prometheus\.scope_matchers"):
            asyncio.run(client.instant('DCGM_FI_DEV_GPU_UTIL{pod="p"}'))
    finally:
        client.close()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("15d", 15 * 86400.0, id="days"),
        pytest.param("1h30m", 5400.0, id="compound"),
        pytest.param("15d or 512MiB", 15 * 86400.0, id="time-or-size"),
        pytest.param("512MiB", None, id="size-only"),
        pytest.param("2w", 14 * 86400.0, id="weeks"),
        pytest.param("0s", None, id="zero-is-no-bound"),
        pytest.param("15 days", None, id="not-a-duration"),
        pytest.param("15dx", None, id="a-duration-with-a-tail-is-none"),
        pytest.param("1h 30m", None, id="a-space-inside-is-no-duration"),
    ],
)
def test_duration_seconds(text: str, seconds: float | None) -> None:
    assert dcgm.duration_seconds(text) == seconds


IDENTIFIED = dcgm.MetricFacts(40, frozenset({"__name__", "gpu", "UUID", "Hostname", "pod", "namespace"}))
RULE = dcgm.MetricFacts(5, frozenset({"__name__", "pod", "namespace", "Hostname"}))


def facts(util: dcgm.MetricFacts | None = IDENTIFIED, mig: dcgm.MetricFacts | None = None,
          retention: str | None = "15d") -> dcgm.StoreFacts:
    found = {name: value for name, value in (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", mig))
             if value is not None}
    return dcgm.StoreFacts(found, retention, "/api/v1/status/runtimeinfo storageRetention" if retention else
                           "the store reports no retention")


@pytest.mark.parametrize(
    ("found", "scope", "window", "failed"),
    [
        pytest.param(facts(util=None), SCOPE, 10800.0, ["no series of DCGM_FI_DEV_GPU_UTIL "
                     "(prometheus.gpu_util_metric) matching prometheus.scope_matchers ['cluster=\"prod-a\"', "
                     "'env=~\"p.*\"'] in the store"], id="no-series-under-the-scope-names-the-setting"),
        pytest.param(facts(util=None), [], 10800.0, ["no series of DCGM_FI_DEV_GPU_UTIL (prometheus.gpu_util_metric) "
                     "in the store"], id="no-series-at-all"),
        pytest.param(facts(util=RULE), [], 10800.0, ["DCGM_FI_DEV_GPU_UTIL (prometheus.gpu_util_metric): its 5 series "
                     "carry neither UUID nor gpu: no per-GPU identity (a recording rule aggregated over GPUs?)"],
                     id="recording-rule"),
        pytest.param(facts(mig=RULE), [], 10800.0, ["DCGM_FI_PROF_GR_ENGINE_ACTIVE (prometheus.mig_activity_metric): "
                     "its 5 series carry neither"], id="mig-metric-recording-rule"),
        pytest.param(facts(util=None, mig=RULE), [], 10800.0, ["no series of DCGM_FI_DEV_GPU_UTIL",
                     "DCGM_FI_PROF_GR_ENGINE_ACTIVE (prometheus.mig_activity_metric): its 5 series carry neither"],
                     id="no-utilisation-series-and-a-mig-recording-rule-both-said"),
        # A fleet whose GPUs are all in MIG mode: dcgm-exporter reports no whole-GPU utilisation.
        pytest.param(facts(util=None, mig=IDENTIFIED), [], 10800.0, [], id="mig-only-fleet-starts"),
        pytest.param(facts(util=None, mig=IDENTIFIED), SCOPE, 10800.0, [], id="mig-only-fleet-starts-scoped"),
        pytest.param(facts(util=RULE, mig=RULE), [], 10800.0, ["DCGM_FI_DEV_GPU_UTIL (prometheus.gpu_util_metric)",
                     "DCGM_FI_PROF_GR_ENGINE_ACTIVE (prometheus.mig_activity_metric)"],
                     id="two-recording-rules-both-said"),
        pytest.param(facts(util=dcgm.MetricFacts(3, frozenset({"UUID", "pod"}))), [], 10800.0, [],
                     id="uuid-alone-is-an-identity"),
        pytest.param(facts(util=dcgm.MetricFacts(3, frozenset({"gpu", "pod"}))), [], 10800.0, [],
                     id="index-alone-is-an-identity"),
        pytest.param(facts(), SCOPE, 10800.0, [], id="all-good"),
        pytest.param(facts(retention="2h"), [], 10800.0, ["the store keeps 2h (/api/v1/status/runtimeinfo "
                     "storageRetention), less than the longest idle window 10800s"], id="short-retention"),
        pytest.param(facts(retention="3h"), [], 10800.0, [], id="retention-equal-to-the-window-boundary"),
        pytest.param(facts(retention="2h"), [], None, [], id="no-window-to-compare"),
        pytest.param(facts(retention=None), [], 10800.0, [], id="retention-unknown-is-said-not-failed"),
        pytest.param(facts(retention="512MiB"), [], 10800.0, [], id="size-only-retention-is-said-not-failed"),
    ],
)
def test_store_checks(found: dcgm.StoreFacts, scope: list[str], window: float | None, failed: list[str]) -> None:
    checks = dcgm.store_checks(found, config=settings.Prometheus(scope_matchers=scope), longest_window=window)
    failures = [why for ok, why in checks if not ok]
    assert len(failures) == len(failed) and all(want in got for want, got in zip(failed, failures, strict=True)), \
        failures
    if not failed:
        assert any("retention not checked" in why or "keeps" in why for _, why in checks)


@pytest.mark.parametrize(
    ("found", "scope", "lines"),
    [
        pytest.param(facts(util=None), SCOPE, [
            (False, "no series of DCGM_FI_DEV_GPU_UTIL (prometheus.gpu_util_metric) matching prometheus.scope_matchers "
                    "['cluster=\"prod-a\"', 'env=~\"p.*\"'] in the store: no pod could be judged idle; is the "
                    "matcher's label (e.g. the external label cluster) on the series?")], id="no-series-scoped"),
        pytest.param(facts(util=None), [], [
            (False, "no series of DCGM_FI_DEV_GPU_UTIL (prometheus.gpu_util_metric) in the store: no pod could be "
                    "judged idle")], id="no-series-unscoped"),
        pytest.param(facts(), [], [(True, "DCGM_FI_DEV_GPU_UTIL: 40 series, GPUs identified by UUID and gpu")],
                     id="identified-by-both"),
        pytest.param(facts(util=None, mig=IDENTIFIED), [], [
            (True, "no series of DCGM_FI_DEV_GPU_UTIL (prometheus.gpu_util_metric) in the store: no whole-GPU pod "
                   "could be judged idle, only MIG instances (DCGM_FI_PROF_GR_ENGINE_ACTIVE)"),
            (True, "DCGM_FI_PROF_GR_ENGINE_ACTIVE: 40 series, GPUs identified by UUID and gpu")],
                     id="mig-only-fleet-said"),
    ],
)
def test_metric_lines(found: dcgm.StoreFacts, scope: list[str], lines: list[tuple[bool, str]]) -> None:
    checks = dcgm.store_checks(found, config=settings.Prometheus(scope_matchers=scope), longest_window=None)
    assert checks[:-1] == lines


@pytest.mark.parametrize(
    ("retention", "line"),
    [
        pytest.param(None, "retention not checked: the store reports no retention", id="unknown"),
        pytest.param("512MiB", "retention not checked: 512MiB (/api/v1/status/runtimeinfo storageRetention) has no "
                     "time bound", id="size-only"),
        pytest.param("15d", "the store keeps 15d (/api/v1/status/runtimeinfo storageRetention) >= the longest idle "
                     "window 10800s", id="enough"),
    ],
)
def test_retention_lines(retention: str | None, line: str) -> None:
    checks = dcgm.store_checks(facts(retention=retention), config=settings.Prometheus(), longest_window=10800.0)
    assert checks[-1] == (True, line)


def test_retention_without_a_window_is_only_said() -> None:
    checks = dcgm.store_checks(facts(retention="2h"), config=settings.Prometheus(), longest_window=None)
    assert checks[-1] == (True, "the store keeps 2h (/api/v1/status/runtimeinfo storageRetention)")
