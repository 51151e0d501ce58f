"""Benchmark figures live in one generated place (docs/figures.md, from benchmarks/results/*.json): the table is
what the results make now, the README's Evidence quotes no figure of its own, and no settings description carries
a measurement (they drift from the runs the same way)."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest

from benchmarks import figures
from common import settings

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# A measured quantity: a number with a unit of time, size, rate or share, or an "about" figure.
MEASURED = re.compile(r"\d(?:[\d,.]*\d)?\s*(?:%|µs|us\b|ms\b|s\b|x\b|MB\b|GB\b|GPU-h\b|requests/s)|~\s*\d")
# In a settings description a percentage is a threshold or a goal (the settings' own values), not a measurement.
MEASURED_IN_A_SETTING = re.compile(r"\d(?:[\d,.]*\d)?\s*(?:µs|us\b|ms\b|MB\b|GB\b|GPU-h\b|requests/s)|~\s*\d"
                                   r"|on an? (?:loaded|quiet|busy|\d+-core) ")


def test_the_figures_table_is_what_the_results_make_now() -> None:
    assert figures.OUT.read_text() == figures.render(), "run python benchmarks/figures.py"


def test_every_figure_names_a_result_file_that_exists() -> None:
    sources = {figure.source for figure in figures.FIGURES}
    assert sources <= {path.name for path in figures.RESULTS.glob("*.json")}


def test_the_check_mode_fails_on_a_stale_table(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "figures.md"
    stale.write_text(figures.render().replace("| 45 |", "| 44 |", 1))
    monkeypatch.setattr(figures, "OUT", stale)
    assert figures.main(["--check"]) == 1
    monkeypatch.setattr(figures, "OUT", figures.REPO / "docs" / "figures.md")
    assert figures.main(["--check"]) == 0


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


@pytest.mark.parametrize(
    ("text", "measured"),
    [
        pytest.param("the decision takes 71 µs per pod", True, id="microseconds"),
        pytest.param("regrets 57 % on these pods", True, id="percent"),
        pytest.param("1.4-1.5 s a cycle", True, id="seconds-range"),
        pytest.param("at 1.20-1.22x the default scheduler's rate", True, id="ratio"),
        pytest.param("396 MB at 10,000 GPUs", True, id="megabytes"),
        pytest.param("55.6 GPU-h", True, id="gpu-hours"),
        pytest.param("2,160-2,635 requests/s", True, id="rate"),
        pytest.param("Kubernetes 1.37.2 on 200 kwok nodes", False, id="versions-and-counts-are-setup"),
        pytest.param("a 3 h window judged by its peak", False, id="a-setting-in-hours"),
        pytest.param("pods 0-1999 and 2000-3999", False, id="trace-slices"),
    ],
)
def test_the_measured_figure_pattern(text: str, measured: bool) -> None:
    assert bool(MEASURED.search(text)) is measured


def test_the_readme_evidence_quotes_the_generated_table_instead_of_copying_it() -> None:
    evidence = _section(README.read_text(), "Evidence")
    copied = [m.group(0) for m in MEASURED.finditer(evidence)]
    assert copied == [], "quote docs/figures.md (benchmarks/figures.py) instead"
    assert "docs/figures.md" in evidence


@pytest.mark.parametrize(
    "stale",
    [
        pytest.param("71 µs", id="decision-time-of-the-10k-run-quoted-for-1k-nodes"),
        pytest.param("1.4-1.5 s", id="a-whole-cycle-of-an-older-design-called-the-planner"),
        pytest.param("57 % on these", id="scavenger-regret"),
    ],
)
def test_the_figures_the_issue_found_disagreeing_are_gone_from_the_readme(stale: str) -> None:
    assert stale not in README.read_text()


def _descriptions(model: type[pydantic.BaseModel], path: str = "") -> Iterator[tuple[str, str]]:
    for name, field in model.model_fields.items():
        key = f"{path}{name}"
        if field.description:
            yield key, field.description
        annotation: Any = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            yield from _descriptions(annotation, f"{key}.")


def test_the_description_walk_reaches_nested_groups() -> None:
    keys = dict(_descriptions(settings.Settings))
    assert "descheduler.reclaim.learned_window.chunk_seconds" in keys
    assert len(keys) > 100


@pytest.mark.parametrize(
    ("text", "measured"),
    [
        pytest.param("30 min of 10,000 GPUs ~1 s on a loaded 2-core VM", True, id="an-about-figure"),
        pytest.param("a few parts (12 MB at 10,000 GPUs)", True, id="a-size"),
        pytest.param("at most 5 % of evictions followed by work", False, id="a-goal-in-percent"),
        pytest.param("GPUs x this (measured: benchmarks/RESULTS.md, Learned idle windows)", False,
                     id="a-pointer-to-the-measurement"),
    ],
)
def test_the_measured_in_a_setting_pattern(text: str, measured: bool) -> None:
    assert bool(MEASURED_IN_A_SETTING.search(text)) is measured


def test_no_settings_description_carries_a_measurement() -> None:
    measured = {key: text for key, text in _descriptions(settings.Settings) if MEASURED_IN_A_SETTING.search(text)}
    assert measured == {}, "move the figure to docs (benchmarks/RESULTS.md, docs/figures.md) and point to it"
