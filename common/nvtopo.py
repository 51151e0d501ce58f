"""`nvidia-smi topo -m` text -> the NVLink domains of a node, with the reasons.

GPUs joined by `NV#` links (a bonded set of # NVLinks, directly or through NVSwitch) form one
domain: the connected components of the NVLink graph. PCIe paths (`PIX`, `PXB`, `PHB`, `NODE`,
`SYS`, and `SOC`, the pre-2018 name of `SYS`) never join GPUs.

The printed layout varies (tabs or spaces, NIC rows with or without a `NIC Legend`, `CPU Affinity` /
`NUMA Affinity` / `GPU NUMA ID` columns or not, empty affinity cells, mangled headers), so the
parser trusts only what every version prints: one matrix row per device, in header order, whose
first cells are link tokens without spaces. It reads the GPU rows, checks the GPU-by-GPU block
(square, `X` on the diagonal, known link kinds, symmetric) and raises `ParseError` on anything else:
a labeler must never publish a topology it did not understand.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from common import settings

PCIE_LINKS = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"})
SELF = "X"
_NVLINK = re.compile(r"NV(\d+)")
_GPU = re.compile(r"GPU(\d+)")
# A matrix row: a device name, then its first cell ("X" or a link kind, known or not, so that an unknown
# kind is reported as such). Not rows: the header ("GPU0 GPU1 ...", "GPU0 CPU Affinity" with one GPU)
# and Legend lines ("X    = Self", "NIC0: mlx5_0": the second token is "=", the name ends in ":").
_ROW = re.compile(r"^(?P<name>[A-Za-z][\w.-]*)\s+(?P<first>X|(?!GPU\d|CPU\b|NUMA\b)[A-Z][A-Z0-9]{1,5})(?:\s|$)")


class ParseError(ValueError):
    """The text is not a `nvidia-smi topo -m` matrix we understand; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class Topology:
    gpus: tuple[int, ...]  # nvidia-smi GPU indices, ascending
    domains: tuple[tuple[int, ...], ...]  # each NVLink domain's GPU indices, ordered by their lowest index
    reasons: tuple[str, ...]  # one line per domain: why these GPUs belong together (or stand alone)

    @property
    def domain_size(self) -> int:
        """The largest domain: the biggest pod that stays inside one NVLink domain."""
        return max(len(domain) for domain in self.domains)


def parse(text: str) -> Topology:
    """Parse `nvidia-smi topo -m` output; raises ParseError naming the offending line or cell."""
    lines = text.splitlines()
    rows: list[tuple[int, str, list[str]]] = []  # (line number, device name, cells)
    end = "the end of the text"
    for number, line in enumerate(lines, start=1):
        match = _ROW.match(line.strip())
        if match is not None and (rows or _GPU.fullmatch(match["name"])):
            rows.append((number, match["name"], line.split()[1:]))
        elif rows:
            end = f"line {number} {line[:60]!r}"
            break  # the matrix ends at the first line that is not a row (blank line, Legend)
    if not rows:
        raise ParseError("no GPU matrix found (expected a line starting with 'GPU0' followed by link cells)")
    header_line = rows[0][0] - 1
    header = lines[header_line - 1] if header_line >= 1 else ""
    devices = [name for _, name, _ in rows]
    gpu_rows = [(number, name, cells) for number, name, cells in rows if _GPU.fullmatch(name)]
    gpus = [_index(name) for _, name, _ in gpu_rows]
    header_gpus = [int(m[1]) for m in _GPU.finditer(header)]
    if header_gpus != gpus:
        raise ParseError(
            f"line {header_line}: header names GPUs {header_gpus} but the matrix has rows for GPUs {gpus} "
            f"(it ends at {end})"
        )
    if len(set(gpus)) != len(gpus):
        raise ParseError(f"GPU rows repeat an index: {gpus}")

    links: dict[tuple[int, int], str] = {}
    for number, name, cells in gpu_rows:
        if len(cells) < len(devices):
            raise ParseError(f"line {number}: row {name} has {len(cells)} cells, the matrix has {len(devices)} columns")
        me = _index(name)
        for column, cell in enumerate(cells[: len(devices)]):
            if not _GPU.fullmatch(devices[column]):
                continue  # GPU-to-NIC paths say nothing about NVLink domains
            other = _index(devices[column])
            expected_self = other == me
            if (cell == SELF) != expected_self:
                raise ParseError(f"line {number}: {name} to {devices[column]} is {cell!r}; only GPU{me} to itself is X")
            if not expected_self and cell not in PCIE_LINKS and not _NVLINK.fullmatch(cell):
                raise ParseError(f"line {number}: unknown link kind {cell!r} between {name} and {devices[column]}")
            links[(me, other)] = cell
    for (a, b), kind in links.items():
        if links[(b, a)] != kind:
            raise ParseError(f"matrix is not symmetric: GPU{a}->GPU{b} is {kind}, GPU{b}->GPU{a} is {links[(b, a)]}")
    return _domains(sorted(gpus), links)


def _index(gpu_name: str) -> int:
    return int(gpu_name.removeprefix("GPU"))


def _domains(gpus: list[int], links: Mapping[tuple[int, int], str]) -> Topology:
    nvlinked = {g: sorted(o for (a, o), kind in links.items() if a == g and _NVLINK.fullmatch(kind)) for g in gpus}
    seen: set[int] = set()
    domains: list[tuple[int, ...]] = []
    reasons: list[str] = []
    for start in gpus:
        if start in seen:
            continue
        component, stack = {start}, [start]
        while stack:
            for other in nvlinked[stack.pop()]:
                if other not in component:
                    component.add(other)
                    stack.append(other)
        seen |= component
        domain = tuple(sorted(component))
        domains.append(domain)
        reasons.append(_reason(domain, links))
    return Topology(gpus=tuple(gpus), domains=tuple(domains), reasons=tuple(reasons))


def _reason(domain: tuple[int, ...], links: Mapping[tuple[int, int], str]) -> str:
    names = ",".join(str(g) for g in domain)
    if len(domain) == 1:
        paths = sorted({kind for (a, _), kind in links.items() if a == domain[0] and kind != SELF})
        via = f" (PCIe only: {'/'.join(paths)})" if paths else " (the only GPU)"
        return f"GPU {names}: no NVLink to another GPU{via}"
    pairs = [(a, b) for a in domain for b in domain if a < b]
    kinds = sorted({links[p] for p in pairs if _NVLINK.fullmatch(links[p])}, key=lambda k: int(k[2:]))
    direct = sum(1 for p in pairs if _NVLINK.fullmatch(links[p]))
    shape = "all-to-all" if direct == len(pairs) else f"{direct} of {len(pairs)} GPU pairs direct, the rest via peers"
    return f"GPUs {names}: joined by NVLink ({'/'.join(kinds)}; {shape})"


def node_labels(topology: Topology, *, names: settings.Names) -> dict[str, str]:
    """Node labels: how many domains, and the largest domain's size (integers for Gt/Lt affinity)."""
    return {names.nvlink_domains: str(len(topology.domains)), names.nvlink_domain_size: str(topology.domain_size)}


def node_annotations(topology: Topology, *, names: settings.Names) -> dict[str, str]:
    """The node annotation `common.topology` reads first: each domain's GPU indices, and why."""
    document = {"domains": [list(d) for d in topology.domains], "reasons": list(topology.reasons)}
    return {names.nvlink_topology: json.dumps(document, separators=(",", ":"))}


def node_patch(node: Mapping[str, Any], topology: Topology, *, names: settings.Names) -> dict[str, Any] | None:
    """A JSON merge patch (RFC 7386) setting only our keys that differ on `node`; None when all are current.

    A merge patch merges into `metadata.labels`/`annotations` key by key, so other owners' keys stay
    untouched (a JSON patch `add /metadata/labels` would replace the whole map).
    """
    meta = node.get("metadata") or {}
    patch: dict[str, dict[str, str]] = {}
    wanted = {"labels": node_labels(topology, names=names), "annotations": node_annotations(topology, names=names)}
    for field, ours in wanted.items():
        current = meta.get(field) or {}
        changed = {key: value for key, value in ours.items() if current.get(key) != value}
        if changed:
            patch[field] = changed
    return {"metadata": patch} if patch else None
