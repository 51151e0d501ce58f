"""A PNG of GPU occupancy per node and NVLink domain (used by the demo): columns of panels, one panel
per moment. Each node is a row of GPU squares grouped by NVLink domain (a gap between domains); a
square is coloured by the workload holding that GPU, light grey when free.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Protocol

from PIL import Image, ImageDraw

CELL, GAP, DOMAIN_GAP, ROW, LABEL, MARGIN, TITLE = 22, 3, 12, 30, 110, 14, 26
LEGEND_ITEM = 130
FREE = (225, 225, 225)
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189), (214, 39, 40), (23, 190, 207),
           (188, 189, 34), (140, 86, 75), (227, 119, 194), (127, 127, 127)]


class View(Protocol):
    @property
    def nodes(self) -> Sequence[tuple[str, Sequence[Sequence[int]]]]: ...

    @property
    def owner(self) -> Mapping[str, Mapping[int, str]]: ...


Panel = tuple[str, View]


def _size(view: View) -> tuple[int, int]:
    widest = max((sum(len(d) for d in domains) * (CELL + GAP) + len(domains) * DOMAIN_GAP
                  for _, domains in view.nodes), default=0)
    return LABEL + widest + 2 * MARGIN, TITLE + len(view.nodes) * ROW + 2 * MARGIN


def _draw_panel(draw: ImageDraw.ImageDraw, x0: int, y0: int, title: str, view: View,
                colour: Mapping[str, tuple[int, int, int]]) -> None:
    draw.text((x0 + MARGIN, y0 + MARGIN), title, fill="black")
    y = y0 + MARGIN + TITLE
    for node, domains in view.nodes:
        draw.text((x0 + MARGIN, y + 5), node, fill="black")
        x = x0 + MARGIN + LABEL
        for domain in domains:
            for index in domain:
                app = view.owner.get(node, {}).get(index)
                draw.rectangle([x, y, x + CELL, y + CELL], fill=colour[app] if app else FREE, outline="black")
                x += CELL + GAP
            x += DOMAIN_GAP
        y += ROW


def write(path: pathlib.Path, *, columns: Sequence[Sequence[Panel]]) -> None:
    panels = [panel for column in columns for panel in column]
    apps = sorted({app for _, view in panels for owners in view.owner.values() for app in owners.values()})
    colour = {app: PALETTE[i % len(PALETTE)] for i, app in enumerate(apps)}
    widths = [max((_size(view)[0] for _, view in column), default=0) for column in columns]
    heights = [sum(_size(view)[1] for _, view in column) for column in columns]
    width = max(sum(widths), 2 * MARGIN + LEGEND_ITEM)
    per_row = max(1, (width - 2 * MARGIN) // LEGEND_ITEM)
    legend_height = MARGIN + ROW * -(-len(apps) // per_row)
    image = Image.new("RGB", (width, max(heights, default=0) + legend_height), "white")
    draw = ImageDraw.Draw(image)
    x = 0
    for column, column_width in zip(columns, widths, strict=True):
        y = 0
        for title, view in column:
            _draw_panel(draw, x, y, title, view, colour)
            y += _size(view)[1]
        x += column_width
    top = max(heights, default=0)
    for i, app in enumerate(apps):
        lx = MARGIN + (i % per_row) * LEGEND_ITEM
        ly = top + (i // per_row) * ROW
        draw.rectangle([lx, ly + 4, lx + 14, ly + 18], fill=colour[app], outline="black")
        draw.text((lx + 20, ly + 5), app, fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
