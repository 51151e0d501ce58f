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
