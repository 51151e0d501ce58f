"""The README's "Install on your cluster" against the chart, offline: every value its commands and its feature
table name exists in values.yaml (and the schema accepts the commands' values), the image it builds with the bake
file is the image the chart then runs, and the names its later commands use are the release's objects.
tests/e2e/test_readme_install_e2e.py runs the same commands on the real control plane."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gpu_steward import cli
from tests.chart import helm, readme

VALUES = yaml.safe_load((helm.CHART / "values.yaml").read_text())
BAKE = json.loads((readme.REPO / "docker-bake.json").read_text())


def _exists(key: str) -> bool:
    node: Any = VALUES
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _yaml_value(text: str) -> Any:
    """How `helm --set` reads a value, for the ones the README uses (strings, booleans, integers)."""
    return {"true": True, "false": False}.get(text, int(text) if text.isdigit() else text)


def _install() -> readme.Command:
    return readme.one(readme.blocks()["install"], "helm", "install")


def _render(command: readme.Command) -> list[dict[str, Any]]:
    """`helm template` with the command's release, namespace and values (a values file: the same keys as --set)."""
    release, chart = command.positional()[2:4]
    assert (readme.REPO / chart).resolve() == helm.CHART
    values: dict[str, Any] = {}
    for key, value in command.sets():
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _yaml_value(value)
    namespace = command.option("--namespace")
    assert namespace
    return helm.template(values, release=release, namespace=namespace)


def test_the_readme_marks_an_install_and_an_uninstall_block() -> None:
    assert set(readme.blocks()) == {"install", "uninstall"}


def test_the_marker_parser_finds_each_block_and_joins_continuations() -> None:
    text = ("<!-- readme-install: one (a note) -->\n```sh\nA=1 tool run \\\n  --set x=y  # why\n# a comment\n```\n\n"
            "<!-- readme-install: two -->\n```sh\nhelm test r -n ns\n```\n")
    found = readme.blocks(text)
    assert [(c.env, c.words) for c in found["one"]] == [({"A": "1"}, ["tool", "run", "--set", "x=y"])]
    assert found["two"][0].option("-n") == "ns"


def test_every_value_the_install_sets_exists_in_the_chart() -> None:
    keys = [key for key, _ in _install().sets()]
    assert {"image.repository", "image.tag", "settings.prometheus.url"} <= set(keys)
    assert [key for key in keys if not _exists(key)] == []


def test_the_install_command_renders_with_the_image_and_the_url_it_sets() -> None:
    install = _install()
    sets = dict(install.sets())
    objects = _render(install)
    image = f"{sets['image.repository']}:{sets['image.tag']}"
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    assert len(pods) == 3  # webhook, descheduler, labeler
    assert {c["image"] for pod in pods for c in pod["containers"]} == {image}
    (config,) = [o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})]
    assert yaml.safe_load(config["data"]["config.yaml"])["prometheus"]["url"] == sets["settings.prometheus.url"]


def test_the_image_the_bake_file_pushes_is_the_image_the_install_runs() -> None:
    bake = readme.one(readme.blocks()["install"], "docker", "buildx", "bake")
    assert "--push" in bake.words
    variables = {name: spec["default"] for name, spec in BAKE["variable"].items()} | bake.env
    assert set(bake.env) <= set(BAKE["variable"]), "bake reads only its declared variables from the environment"
    (tag,) = BAKE["target"]["gpu-steward"]["tags"]
    pushed = re.sub(r"\$\{(\w+)\}", lambda m: variables[m[1]], tag)
    sets = dict(_install().sets())
    assert pushed == f"{sets['image.repository']}:{sets['image.tag']}"


def test_the_later_commands_name_the_release_and_its_objects() -> None:
    install = _install()
    release, namespace = install.positional()[2], install.option("--namespace")
    objects = _render(install)
    deployments = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
    commands = readme.blocks()["install"]
    rollouts = [c for c in commands if c.words[:1] == ["kubectl"] and "rollout" in c.words]
    assert rollouts
    for rollout in rollouts:
        assert rollout.option("--namespace") == namespace
        assert rollout.positional()[-1].removeprefix("deployment/") in deployments
    test = readme.one(commands, "helm", "test")
    assert (test.positional()[2], test.option("--namespace")) == (release, namespace)
    uninstall = readme.one(readme.blocks()["uninstall"], "helm", "uninstall")
    assert (uninstall.positional()[2], uninstall.option("--namespace")) == (release, namespace)


@pytest.mark.parametrize("words", [c.words for c in readme.blocks()["uninstall"] if c.words[0] == "gpu-steward"])
def test_the_uninstall_commands_are_the_cli_s(words: list[str]) -> None:
    args = cli.build_parser().parse_args(words[1:])
    assert args.func.__module__ == "gpu_steward.cmd_release_gates"


def _feature_table() -> list[tuple[str, str]]:
    text = readme.README.read_text()
    section = text[text.index("## Install on your cluster"):text.index("## Try it locally")]
    start = section.index("| feature | value | off means |")
    rows = []
    for line in section[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append((cells[0], cells[1]))
    return rows


def test_every_feature_switch_the_readme_names_is_a_chart_value() -> None:
    rows = _feature_table()
    assert len(rows) >= 8
    keys = [re.match(r"`([^`]+)`", value) for _, value in rows]
    assert all(keys), rows
    missing = [m[1] for m in keys if m and not _exists(m[1])]
    assert missing == []
