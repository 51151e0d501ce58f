"""Release material, without a Docker engine or a registry: versions agree, the changelog has their section, the
base image is pinned by digest, the multi-arch build definition parses, the SBOM is fresh and lists exactly the
lock, and `helm package` makes the chart archive (docs/release.md says what cannot run here)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import tarfile
import tomllib

import yaml

from tests.chart import helm

REPO = helm.REPO
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SBOM = REPO / "sbom" / "gpu-steward.cdx.json"


def test_one_version_everywhere_and_in_the_changelog() -> None:
    chart = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())
    bake = json.loads((REPO / "docker-bake.json").read_text())
    assert chart["version"] == chart["appVersion"] == bake["variable"]["VERSION"]["default"] == VERSION
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.MULTILINE)
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE)
    assert headings[0] == "Unreleased" and all(f"[{h}]: " in changelog for h in headings)  # every link defined
    for section in re.findall(r"^### (.+)$", changelog, re.MULTILINE):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, section


def test_the_base_image_is_pinned_by_digest() -> None:
    [base] = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base), base


def test_the_bake_file_builds_both_architectures_with_the_dockerfile_arguments() -> None:
    bake = json.loads((REPO / "docker-bake.json").read_text())
    assert bake["group"]["default"]["targets"] == ["gpu-steward"]
    target = bake["target"]["gpu-steward"]
    assert sorted(target["platforms"]) == ["linux/amd64", "linux/arm64"]
    assert (REPO / target["context"] / target["dockerfile"]).is_file()
    declared = set(re.findall(r"^ARG (\w+)", (REPO / "Dockerfile").read_text(), re.MULTILINE))
    assert set(target["args"]) <= declared, set(target["args"]) - declared
    used = set(re.findall(r"\$\{(\w+)\}", json.dumps(target)))
    assert used <= set(bake["variable"]), used - set(bake["variable"])
    assert any(a.startswith("type=sbom") for a in target["attest"])


def _locked() -> set[tuple[str, str]]:
    pins = [line.split("==") for line in (REPO / "requirements.lock").read_text().splitlines()
            if line and not line.startswith("#")]
    return {(re.sub(r"[-_.]+", "-", name).lower(), version) for name, version in pins}


def test_the_sbom_lists_exactly_the_locked_packages() -> None:
    bom = json.loads(SBOM.read_text())
    assert (bom["bomFormat"], bom["specVersion"]) == ("CycloneDX", "1.6")
    root = bom["metadata"]["component"]
    assert (root["name"], root["version"]) == ("gpu-steward", VERSION)
    components = {(c["name"].lower().replace("_", "-"), c["version"]) for c in bom["components"]}
    assert components == _locked()
    assert all(c["purl"] == f"pkg:pypi/{c['name'].lower().replace('_', '-')}@{c['version']}"
               for c in bom["components"])


def test_the_sbom_is_what_the_tool_makes_from_the_lock_now() -> None:
    done = subprocess.run([str(REPO / "scripts" / "sbom"), "--check"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr


def test_helm_package_makes_the_chart_archive(tmp_path: pathlib.Path) -> None:
    helm.helm("package", str(helm.CHART), "--destination", str(tmp_path))
    archive = tmp_path / f"gpu-steward-{VERSION}.tgz"
    with tarfile.open(archive) as packed:
        names = set(packed.getnames())
    for part in ("Chart.yaml", "values.yaml", "values.schema.json", "README.md",
                 "templates/webhook-configuration.yaml"):
        assert f"gpu-steward/{part}" in names, part
    assert not any("/hack/" in name for name in names), "the generators stay out of the package (.helmignore)"
