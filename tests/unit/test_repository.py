"""The repository stands on its own: a plain clone, with nothing beside it, runs every test and benchmark."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
THIS = pathlib.Path(__file__).resolve().relative_to(REPO).as_posix()
DATA = REPO / "benchmarks" / "data"
# A folder beside the checkout, however it is spelled: as a relative link or path, as pathlib joins it
# (`ROOT.parent / "shared"`), or as the absolute path of the machine it was developed on.
OUTSIDE = re.compile(rb"""\.\./shared\b|/work/shared\b|\.parent\s*/\s*["']shared["']""")


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_reaches_outside_the_repository() -> None:
    found = []
    for name in tracked_files():
        path = REPO / name
        if name == THIS or not path.is_file():  # a file deleted in the work tree is still listed
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{number}: {line.decode(errors='replace').strip()[:120]}")
    assert not found, "files that read or link a folder outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("line", "outside"),
    [
        pytest.param(b"see [the brief](../shared/DESIGN.md)", True, id="relative-link"),
        pytest.param(b'TRACES = ROOT.parent / "shared" / "traces"', True, id="pathlib-join"),
        pytest.param(b"# copied from /work/shared/fixtures/x", True, id="absolute-path"),
        pytest.param(b"measured on this project's shared 2-core machine", False, id="the-word-shared"),
        pytest.param(b'"""Keeps the shared cluster `Snapshot` fresh"""', False, id="prose"),
    ],
)
def test_the_pattern_catches_each_spelling(line: bytes, outside: bool) -> None:
    assert bool(OUTSIDE.search(line)) is outside


def test_trace_files_are_tracked_with_their_terms() -> None:
    tracked = set(tracked_files())
    for name in ("alibaba-openb/openb_node_list_gpu_node.csv", "alibaba-openb/openb_pod_list_default.csv",
                 "alibaba-openb/openb_pod_list_multigpu50.csv", "alibaba-genai/pod_gpu_duty_cycle.csv.gz"):
        assert f"benchmarks/data/{name}" in tracked
    readme = (DATA / "README.md").read_text()
    assert "github.com/alibaba/clusterdata" in readme and "research or study purpose" in readme


def test_trace_files_stay_out_of_the_image_and_the_package() -> None:
    admitted = [line[1:].strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.startswith("!")]
    assert admitted and not [path for path in admitted if path.startswith("benchmarks")]
    assert (REPO / ".dockerignore").read_text().splitlines()[1] == "*"  # everything else is ignored
    pyproject = (REPO / "pyproject.toml").read_text()
    # The product packages only: no benchmarks, tests or lab (`gpu_steward*` would match gpu_steward_lab too).
    assert tomllib.loads(pyproject)["tool"]["setuptools"]["packages"]["find"]["include"] == [
        "gpu_steward", "gpu_steward.*", "admission", "admission.*", "descheduler", "descheduler.*",
        "common", "common.*"]


PURE_SAYS = re.compile(r"(^|[.(:] )Pure\b|\(pure\b", re.MULTILINE)


def test_every_module_that_says_it_is_pure_is_held_to_it() -> None:
    """A docstring that says "Pure" is a promise the import-linter contract must check."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [pure] = [c for c in contracts if c["name"] == "The pure decision core does no I/O"]
    claimed = set()
    for package in ("common", "admission", "descheduler"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "__init__.py":  # a package's docstring lists its modules; each makes its own claim
                continue
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            if PURE_SAYS.search(docstring):
                claimed.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    assert claimed, "the pattern finds nothing: it is broken"
    assert claimed <= set(pure["source_modules"]), sorted(claimed - set(pure["source_modules"]))
    assert {"os", "pathlib", "datetime", "subprocess", "socket", "time", "asyncio"} <= set(pure["forbidden_modules"])


def test_the_static_checks_see_every_python_file() -> None:
    """ruff reads files by suffix: a Python script without one (scripts/) must be listed for it; mypy checks
    the benchmarks too."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    scripts = [name for name in tracked_files() if name.startswith("scripts/") and not name.endswith(".py")
               and re.match(rb"#!.*\bpython", (REPO / name).read_bytes().split(b"\n", 1)[0])]
    assert "scripts/mutation-check" in scripts  # the pattern finds what it should
    assert sorted(scripts) == sorted(tool["ruff"].get("extend-include", []))
    assert {"common", "admission", "descheduler", "gpu_steward", "benchmarks"} <= set(tool["mypy"]["packages"])


def test_vulture_reads_the_whole_product_in_the_static_checks() -> None:
    """Dead code is looked for in every package the image installs, at vulture's lowest confidence that still
    names findings (60 %), by the script CI runs."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    product = {name for name in tool["setuptools"]["packages"]["find"]["include"] if not name.endswith(".*")}
    assert set(tool["vulture"]["paths"]) == product
    assert tool["vulture"]["min_confidence"] <= 60
    assert re.search(r"^vulture\b", (REPO / "scripts" / "test").read_text(), re.MULTILINE)
