"""common.nvtopo: `nvidia-smi topo -m` recordings -> NVLink domains and their reasons; bad text -> ParseError."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from common import nvtopo, settings, topology
from tests import builders

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "nvidia-smi-topo"
NAMES = settings.Names()
ALL8 = ((0, 1, 2, 3, 4, 5, 6, 7),)
ALL4 = ((0, 1, 2, 3),)
CUBE_MESH = "GPUs 0,1,2,3,4,5,6,7: joined by NVLink (NV1/NV2; 16 of 28 GPU pairs direct, the rest via peers)"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def _alone(count: int, paths: str) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    return (
        tuple((g,) for g in range(count)),
        tuple(f"GPU {g}: no NVLink to another GPU (PCIe only: {paths})" for g in range(count)),
    )


@pytest.mark.parametrize(
    ("fixture", "domains", "reasons"),
    [
        pytest.param("dgx-a100-8gpu-nv12-12xmlx5.txt", ALL8,
                     ("GPUs 0,1,2,3,4,5,6,7: joined by NVLink (NV12; all-to-all)",), id="dgx-a100-nvswitch-nv12"),
        pytest.param("hgx-hopper-8gpu-nv18-12nic-nic-legend-numaid.txt", ALL8,
                     ("GPUs 0,1,2,3,4,5,6,7: joined by NVLink (NV18; all-to-all)",), id="hopper-nvswitch-nv18"),
        pytest.param("hgx-h20-8gpu-nv18-5nic-ib-roce-nic-legend-spaces.txt", ALL8,
                     ("GPUs 0,1,2,3,4,5,6,7: joined by NVLink (NV18; all-to-all)",), id="h20-nv18-space-aligned"),
        pytest.param("dgx1-v100-8gpu-hybrid-cube-mesh-4xmlx5-old-legend.txt", ALL8, (CUBE_MESH,),
                     id="dgx1-cube-mesh-old-format"),
        pytest.param("dgx1-like-8gpu-v100-sxm2-hybrid-cube-mesh-nic0-numaid.txt", ALL8, (CUBE_MESH,),
                     id="dgx1-cube-mesh-new-format"),
        pytest.param("della-4gpu-a100-sxm4-nv4-all-to-all-1xmlx5.txt", ALL4,
                     ("GPUs 0,1,2,3: joined by NVLink (NV4; all-to-all)",), id="4gpu-nv4-all-to-all"),
        pytest.param("polaris-4gpu-a100-sxm4-nv4-2xmlx5-mangled-header.txt", ALL4,
                     ("GPUs 0,1,2,3: joined by NVLink (NV4; all-to-all)",), id="4gpu-nv4-mangled-header"),
        pytest.param("traverse-power9-4gpu-v100-nv3-pairs-4xmlx5.txt", ((0, 1), (2, 3)),
                     ("GPUs 0,1: joined by NVLink (NV3; all-to-all)", "GPUs 2,3: joined by NVLink (NV3; all-to-all)"),
                     id="4gpu-nvlink-pairs"),
        pytest.param("4gpu-h100-nv6-4nic-spaces-matrix-only.txt", ALL4,
                     ("GPUs 0,1,2,3: joined by NVLink (NV6; all-to-all)",), id="4gpu-nv6-spaces-trailing-space"),
        pytest.param("gb200-4gpu-nv18-spaces-matrix-only.txt", ALL4,
                     ("GPUs 0,1,2,3: joined by NVLink (NV18; all-to-all)",), id="gb200-tray-no-nics"),
        pytest.param("2gpu-a100-nv12-8xmlx5-container-view.txt", ((0, 1),),
                     ("GPUs 0,1: joined by NVLink (NV12; all-to-all)",), id="2gpu-view-of-nvswitch-host"),
        pytest.param("written-2gpu-rtx3090-nvlink-bridge-nv4.txt", ((0, 1),),
                     ("GPUs 0,1: joined by NVLink (NV4; all-to-all)",), id="2gpu-nvlink-bridge-nv4"),
        pytest.param("written-2gpu-a100-pcie-mig-enabled-nv12-bridge.txt", ((0, 1),),
                     ("GPUs 0,1: joined by NVLink (NV12; all-to-all)",), id="mig-enabled-bridged-pair"),
        pytest.param("written-4gpu-t4-pcie-only-phb.txt", *_alone(4, "PHB"), id="t4-pcie-only"),
        pytest.param("adroit-4gpu-a100-pcie-no-nvlink-1xmlx5.txt", *_alone(4, "NODE/SYS"),
                     id="a100-pcie-only-space-indented-header"),
        pytest.param("pcie-only-2gpu-rtx5090-phb-numaid.txt", *_alone(2, "PHB"), id="2gpu-pcie-phb"),
        pytest.param("pcie-only-2gpu-rtx3090-sys-numa-na-quirk-matrix-only.txt", *_alone(2, "SYS"),
                     id="2gpu-pcie-empty-numa-cell"),
        pytest.param("dgx1-8gpu-topo-mp-pcie-only-4xmlx5.txt", *_alone(8, "PHB/PIX/SYS"),
                     id="topo-mp-pcie-paths-only"),
    ],
)
def test_domains_of_recorded_machines(
    fixture: str, domains: tuple[tuple[int, ...], ...], reasons: tuple[str, ...]
) -> None:
    parsed = nvtopo.parse(_read(fixture))
    assert parsed.domains == domains
    assert parsed.reasons == reasons
    assert parsed.gpus == tuple(sorted(g for d in domains for g in d))


def test_eight_gpus_pcie_only_across_numa_nodes() -> None:
    parsed = nvtopo.parse(_read("pcie-only-8gpu-rtx4090-phb-node-sys-numaid.txt"))
    assert parsed.domains == tuple((g,) for g in range(8))
    assert parsed.reasons[0] == "GPU 0: no NVLink to another GPU (PCIe only: NODE/PHB/SYS)"
    assert parsed.reasons[7] == "GPU 7: no NVLink to another GPU (PCIe only: PHB/SYS)"


@pytest.mark.parametrize(
    "fixture",
    [
        pytest.param("traverse-power9-4gpu-v100-nv3-pairs-4xmlx5.txt", id="tabs-to-spaces"),
        pytest.param("dgx1-v100-8gpu-hybrid-cube-mesh-4xmlx5-old-legend.txt", id="trailing-tabs-to-spaces"),
    ],
)
def test_tab_and_space_layouts_agree(fixture: str) -> None:
    text = _read(fixture)
    assert nvtopo.parse(text.expandtabs(8)) == nvtopo.parse(text)


def _matrix(*rows: str, header: str = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity") -> str:
    return "\n".join((header, *rows)) + "\n"


GOOD_ROWS = ("GPU0\t X \tNV2\tSYS\t0-7\t0", "GPU1\tNV2\t X \tSYS\t0-7\t0", "GPU2\tSYS\tSYS\t X \t8-15\t1")


def test_synthetic_matrix_parses() -> None:
    parsed = nvtopo.parse(_matrix(*GOOD_ROWS))
    assert parsed.domains == ((0, 1), (2,))
    assert parsed.reasons == ("GPUs 0,1: joined by NVLink (NV2; all-to-all)",
                              "GPU 2: no NVLink to another GPU (PCIe only: SYS)")


def test_chain_joins_one_domain_through_peers() -> None:
    rows = ("GPU0\t X \tNV1\tSYS", "GPU1\tNV1\t X \tNV1", "GPU2\tSYS\tNV1\t X ")
    parsed = nvtopo.parse(_matrix(*rows, header="\tGPU0\tGPU1\tGPU2"))
    assert parsed.domains == ((0, 1, 2),)
    assert parsed.reasons == ("GPUs 0,1,2: joined by NVLink (NV1; 2 of 3 GPU pairs direct, the rest via peers)",)


def test_single_gpu_node() -> None:
    parsed = nvtopo.parse("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n")
    assert parsed.domains == ((0,),)
    assert parsed.reasons == ("GPU 0: no NVLink to another GPU (the only GPU)",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "no GPU matrix found", id="empty"),
        pytest.param(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
            "latest NVIDIA driver is installed and running.\n",
            "no GPU matrix found", id="driver-not-loaded",
        ),
        pytest.param(_matrix(*GOOD_ROWS[:2]), "header names GPUs [0, 1, 2] but the matrix has rows for GPUs [0, 1]",
                     id="truncated-rows"),
        pytest.param(_matrix(*GOOD_ROWS, header=""), "header names GPUs [] but", id="no-header"),
        pytest.param(_matrix("GPU0\t X \tNV2", GOOD_ROWS[1], GOOD_ROWS[2]), "line 2: row GPU0 has 2 cells",
                     id="short-row"),
        pytest.param(_matrix(GOOD_ROWS[0], "GPU1\tNV2\tNV2\tSYS\t0-7\t0", GOOD_ROWS[2]),
                     "line 3: GPU1 to GPU1 is 'NV2'; only GPU1 to itself is X", id="diagonal-not-x"),
        pytest.param(_matrix(GOOD_ROWS[0], "GPU1\t X \t X \tSYS\t0-7\t0", GOOD_ROWS[2]),
                     "line 3: GPU1 to GPU0 is 'X'", id="x-off-diagonal"),
        pytest.param(_matrix(GOOD_ROWS[0], GOOD_ROWS[1], "GPU2\tSYS\tSYS\t X \t8-15\t1").replace("NV2\t X", "C2C\t X"),
                     "line 3: unknown link kind 'C2C' between GPU1 and GPU0", id="unknown-link-kind"),
        pytest.param(_matrix(GOOD_ROWS[0], "GPU1\tSYS\t X \tSYS\t0-7\t0", GOOD_ROWS[2]),
                     "not symmetric: GPU0->GPU1 is NV2, GPU1->GPU0 is SYS", id="asymmetric"),
        pytest.param(_matrix(GOOD_ROWS[0], GOOD_ROWS[0], GOOD_ROWS[2], header="\tGPU0\tGPU0\tGPU2"),
                     "GPU rows repeat an index", id="repeated-gpu"),
    ],
)
def test_unparseable_text_is_an_error(text: str, message: str) -> None:
    with pytest.raises(nvtopo.ParseError) as caught:
        nvtopo.parse(text)
    assert message in str(caught.value)


def test_labels_and_annotation_round_trip_through_node_topology() -> None:
    parsed = nvtopo.parse(_read("traverse-power9-4gpu-v100-nv3-pairs-4xmlx5.txt"))
    labels = nvtopo.node_labels(parsed, names=NAMES)
    annotations = nvtopo.node_annotations(parsed, names=NAMES)
    assert labels == {NAMES.nvlink_domains: "2", NAMES.nvlink_domain_size: "2"}
    assert annotations == {
        NAMES.nvlink_topology: '{"domains":[[0,1],[2,3]],"reasons":["GPUs 0,1: joined by NVLink (NV3; all-to-all)",'
        '"GPUs 2,3: joined by NVLink (NV3; all-to-all)"]}'
    }

    def mutate(node: dict[str, Any]) -> None:
        meta = node["metadata"]
        meta["labels"].update(labels)
        meta["annotations"].update(annotations)

    read = topology.from_node(builders.gpu_node("n", gpus=4, topology="none", mutate=mutate), names=NAMES)
    assert (read.source, read.domains, read.problems) == (topology.Source.ANNOTATION, ((0, 1), (2, 3)), ())


def test_labels_of_uneven_domains_name_the_largest() -> None:
    rows = ("GPU0\t X \tNV2\tSYS", "GPU1\tNV2\t X \tSYS", "GPU2\tSYS\tSYS\t X ")
    parsed = nvtopo.parse(_matrix(*rows, header="\tGPU0\tGPU1\tGPU2"))
    assert nvtopo.node_labels(parsed, names=settings.Names(prefix="example.com/")) == {
        "example.com/nvlink-domains": "2",
        "example.com/nvlink-domain-size": "2",
    }


PAIRS = nvtopo.parse(_read("traverse-power9-4gpu-v100-nv3-pairs-4xmlx5.txt"))
PAIRS_LABELS = nvtopo.node_labels(PAIRS, names=NAMES)
PAIRS_ANNOTATIONS = nvtopo.node_annotations(PAIRS, names=NAMES)


def _meta(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "n"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("node", "patch"),
    [
        pytest.param(_meta(), {"metadata": {"labels": PAIRS_LABELS, "annotations": PAIRS_ANNOTATIONS}},
                     id="bare-node-gets-all-our-keys"),
        pytest.param(_meta({"team": "a", NAMES.nvlink_domains: "2"}, {"other": "x"}),
                     {"metadata": {"labels": {NAMES.nvlink_domain_size: "2"}, "annotations": PAIRS_ANNOTATIONS}},
                     id="only-differing-keys-others-untouched"),
        pytest.param(_meta({**PAIRS_LABELS, NAMES.nvlink_domain_size: "4"}, PAIRS_ANNOTATIONS),
                     {"metadata": {"labels": {NAMES.nvlink_domain_size: "2"}}}, id="stale-label-corrected"),
        pytest.param(_meta({"team": "a", **PAIRS_LABELS}, {"other": "x", **PAIRS_ANNOTATIONS}), None,
                     id="current-no-patch"),
    ],
)
def test_node_patch_touches_only_our_differing_keys(node: dict[str, Any], patch: dict[str, Any] | None) -> None:
    assert nvtopo.node_patch(node, PAIRS, names=NAMES) == patch
