"""The command line's contract with a person at a terminal: a bad input file or a missing kubeconfig is one
line on stderr naming the file, the line when there is one, and what was expected; exit code 2; no traceback."""

from __future__ import annotations

import io
import json
import pathlib

import pytest

from common import buildinfo
from gpu_steward import cli, cmdline
from gpu_steward_lab import certs
from tests import builders

KUBECTL = "kubectl get nodes,pods,priorityclasses,namespaces -A -o json"
GOOD_STATE = json.dumps({"kind": "List", "items": [builders.gpu_node("n1", gpus=4, domains=[range(4)])]}, indent=2)
POD_YAML = """apiVersion: v1
kind: Pod
metadata: {name: p, namespace: team}
spec:
  containers:
  - name: c
    resources: {limits: {nvidia.com/gpu: "1"}}
"""


@pytest.fixture(autouse=True)
def _no_outside_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """No kubeconfig, no in-cluster service account, no settings file, whatever the machine has."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "GPU_STEWARD_CONFIG",
                 "GPU_STEWARD_KUBERNETES__KUBECONFIG", "GPU_STEWARD_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


STATE_CASES = [
    pytest.param("missing", None, ["no such file", KUBECTL], id="missing"),
    pytest.param("state.yaml", "kind: List\nitems:\n- kind: Node\n  metadata: {name: n1}\n",
                 ["line 1 column 1", "this is YAML; expected JSON", "-o json"], id="yaml"),
    pytest.param("state.json", '[\n  {"kind": "Node"}\n]\n',
                 ["line 1", "a JSON array", "expected an object of kind List"], id="json-array"),
    pytest.param("state.json", '\n\n"nodes"\n', ["line 3", "a JSON str", "expected an object of kind List"],
                 id="json-string"),
    pytest.param("state.json", json.dumps(builders.pod("p", gpus=1)),
                 ["top-level kind is 'Pod'", "expected one of List, NodeList"], id="a-pod-not-a-list"),
    pytest.param("state.json", '{"kind": "List",\n "items": [\n  {"kind": "Node"',
                 ["line 3 column 18", "invalid JSON", "expected a JSON object of kind List"], id="cut-short"),
    pytest.param("state.json", '{"kind": "List", "items": [\n  {"kind": "Node"},\n  ]\n}',
                 ["line 3 column 3", "invalid JSON (Expecting value)"], id="trailing-comma"),
    pytest.param("state.json", '{"kind": "List", "items": {"kind": "Node"}}',
                 ["items is a dict; expected a list of objects"], id="items-not-a-list"),
    pytest.param("state.json", '{"kind": "List", "items": [{"kind": "Node"}, "n2"]}',
                 ["items[1] is a str; expected an object"], id="item-not-an-object"),
]
STATE_COMMANDS = [
    pytest.param(["gangs", "--cluster"], id="gangs"),
    pytest.param(["descheduler", "--once", "--cluster"], id="descheduler"),
    pytest.param(["explain", "POD", "--cluster"], id="explain"),
    pytest.param(["webhook", "--cert-file", "TLS/tls.crt", "--key-file", "TLS/tls.key", "--cluster"], id="webhook"),
]


@pytest.mark.parametrize("command", STATE_COMMANDS)
@pytest.mark.parametrize(("name", "content", "expected"), STATE_CASES)
def test_a_state_file_that_cannot_be_used_is_one_clear_line(
    command: list[str], name: str, content: str | None, expected: list[str], tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD_YAML)
    if command[0] == "webhook":
        certs.generate(tmp_path / "tls")
    argv = [str(pod) if arg == "POD" else arg.replace("TLS/", f"{tmp_path}/tls/") for arg in command]
    assert cli.main([*argv, str(path)]) == 2
    line = one_error_line(capsys)
    assert f"{path}: " in line
    for fragment in expected:
        assert fragment in line


def test_a_good_state_file_is_accepted(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "state.json").write_text(GOOD_STATE)
    assert cli.main(["gangs", "--cluster", str(tmp_path / "state.json")]) == 0
    assert capsys.readouterr().out.strip() == "no gangs"


POD_CASES = [
    pytest.param("missing", None, ["no such file; expected a Pod manifest"], id="missing"),
    pytest.param("pod.yaml", "kind: Pod\nmetadata: {name: [p\n", ["line 3 column 1", "expected one Pod manifest"],
                 id="broken-yaml"),
    pytest.param("pod.yaml", POD_YAML + "---\n" + POD_YAML,
                 ["line 8 column 1", "expected a single document in the stream, but found another"], id="two-docs"),
    pytest.param("pod.yaml", "- kind: Pod\n", ["a list, not a mapping; expected a Pod manifest"], id="a-list"),
    pytest.param("pod.yaml", "", ["empty; expected a Pod manifest"], id="empty"),
    pytest.param("pod.yaml", "kind: Deployment\n", ["kind is 'Deployment'; expected a single Pod"], id="deployment"),
]


@pytest.mark.parametrize(("name", "content", "expected"), POD_CASES)
def test_explain_says_what_is_wrong_with_the_pod_file(
    name: str, content: str | None, expected: list[str], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "state.json").write_text(GOOD_STATE)
    if content is not None:
        (tmp_path / name).write_text(content)
    assert cli.main(["explain", str(tmp_path / name), "--cluster", str(tmp_path / "state.json")]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"explain: {tmp_path / name}: ")
    for fragment in expected:
        assert fragment in line


def test_explain_reads_the_pod_from_stdin(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "state.json").write_text(GOOD_STATE)
    monkeypatch.setattr("sys.stdin", io.StringIO(POD_YAML))
    assert cli.main(["explain", "-", "--cluster", str(tmp_path / "state.json"), "--output", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [score["node"] for score in answer["scores"]] == ["n1"]
    assert answer["patch"]


def test_explain_names_stdin_in_its_errors(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "state.json").write_text(GOOD_STATE)
    monkeypatch.setattr("sys.stdin", io.StringIO("kind: [\n"))
    assert cli.main(["explain", "-", "--cluster", str(tmp_path / "state.json")]) == 2
    assert one_error_line(capsys).startswith("explain: <stdin>: line 2 column 1: ")


KUBECONFIG_COMMANDS = [
    pytest.param(["gangs"], id="gangs"),
    pytest.param(["descheduler", "--once", "--dry-run"], id="descheduler"),
    pytest.param(["release-gates"], id="release-gates"),
    pytest.param(["label-node", "--once", "--node", "n1", "--nvidia-smi", "true"], id="label-node"),
    pytest.param(["webhook", "--cert-file", "TLS/tls.crt", "--key-file", "TLS/tls.key"], id="webhook"),
]
KUBECONFIG_CASES = [
    pytest.param({}, None, ["no Kubernetes configuration: kubeconfig ~/.kube/config does not exist",
                            "KUBERNETES_SERVICE_HOST is unset", "set KUBECONFIG, or the setting kubernetes.kubeconfig"],
                 id="none-at-all"),
    pytest.param({"KUBECONFIG": "KC/a:KC/b"}, None, ["kubeconfig KC/a:KC/b ($KUBECONFIG) does not exist"],
                 id="kubeconfig-variable-names-no-file"),
    pytest.param({"GPU_STEWARD_KUBERNETES__KUBECONFIG": "KC/missing"}, None,
                 ["kubeconfig KC/missing (kubernetes.kubeconfig) does not exist"], id="setting-names-no-file"),
    pytest.param({"KUBECONFIG": "KC/config"}, "clusters: [\n", ["invalid kubeconfig KC/config ($KUBECONFIG)", "line 2"],
                 id="broken-yaml"),
    pytest.param({"KUBECONFIG": "KC/config"}, "apiVersion: v1\nkind: Config\n",
                 ["invalid kubeconfig KC/config ($KUBECONFIG)", "current-context"], id="no-context"),
    pytest.param({"KUBECONFIG": "KC/config"}, "- a list\n", ["invalid kubeconfig KC/config", "not a kubeconfig"],
                 id="a-yaml-list"),
    pytest.param({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, None,
                 ["in-cluster Kubernetes configuration:", "token"], id="in-cluster-without-token"),
]


@pytest.mark.parametrize("command", KUBECONFIG_COMMANDS)
@pytest.mark.parametrize(("environment", "kubeconfig", "expected"), KUBECONFIG_CASES)
def test_no_usable_kubeconfig_is_one_clear_line(
    command: list[str], environment: dict[str, str], kubeconfig: str | None, expected: list[str],
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    certs.generate(tmp_path / "tls")
    kc = tmp_path / "kc"
    kc.mkdir()
    if kubeconfig is not None:
        (kc / "config").write_text(kubeconfig)
    for name, value in environment.items():
        monkeypatch.setenv(name, value.replace("KC/", f"{kc}/"))
    argv = [arg.replace("TLS/", f"{tmp_path}/tls/") for arg in command]
    assert cli.main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"gpu-steward {command[0]}: ")
    for fragment in expected:
        assert fragment.replace("KC/", f"{kc}/") in line


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gpu-steward {buildinfo.VERSION} (Python {buildinfo.PYTHON})\n"
    assert buildinfo.VERSION != "unknown"  # the tests run an installed package


def test_a_bad_log_format_variable_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_STEWARD_LOG_FORMAT", "yaml")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["gangs"])
    assert exit_.value.code == 2
    assert "$GPU_STEWARD_LOG_FORMAT='yaml': expected one of text, json" in capsys.readouterr().err


def test_release_gates_says_when_the_api_server_cannot_be_reached(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],  # nothing listens on port 1
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    assert cli.main(["release-gates", "--kubeconfig", str(kubeconfig)]) == 1
    assert one_error_line(capsys).startswith("release-gates: cannot list pods: Cannot connect to host 127.0.0.1:1")


CLUSTER_FLAGS = ["-n", "team", "-o", "json", "--kubeconfig", "kc", "--context", "ctx", "--config", "cfg"]


@pytest.mark.parametrize("command", [pytest.param("gangs", id="gangs"),
                                     pytest.param("release-gates", id="release-gates")])
def test_commands_that_list_a_cluster_take_the_same_flags(command: str) -> None:
    args = cli.build_parser().parse_args([command, *CLUSTER_FLAGS])
    assert (args.namespace, args.output, args.kubeconfig, args.context, args.config) == (
        "team", "json", pathlib.Path("kc"), "ctx", pathlib.Path("cfg"))
    assert cmdline.connection_overrides(args) == {"kubernetes": {"kubeconfig": "kc", "context": "ctx"}}


@pytest.mark.parametrize("command", [pytest.param(["descheduler"], id="descheduler"),
                                     pytest.param(["webhook"], id="webhook"),
                                     pytest.param(["label-node"], id="label-node")])
def test_commands_that_connect_take_the_same_connection_flags(command: list[str]) -> None:
    args = cli.build_parser().parse_args([*command, "--kubeconfig", "kc", "--context", "ctx", "--config", "cfg"])
    assert (args.kubeconfig, args.context, args.config) == (pathlib.Path("kc"), "ctx", pathlib.Path("cfg"))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["gangs"], {}, id="none"),
        pytest.param(["gangs", "--context", "ctx"], {"kubernetes": {"context": "ctx"}}, id="context-only"),
        pytest.param(["gangs", "--kubeconfig", "kc"], {"kubernetes": {"kubeconfig": "kc"}}, id="kubeconfig-only"),
    ],
)
def test_connection_flags_become_settings(argv: list[str], expected: dict[str, object]) -> None:
    assert cmdline.connection_overrides(cli.build_parser().parse_args(argv)) == expected


def test_an_unknown_context_is_one_line_naming_it(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}]}))
    assert cli.main(["release-gates", "--kubeconfig", str(kubeconfig), "--context", "nope", "--dry-run"]) == 2
    line = one_error_line(capsys)
    assert "nope" in line and str(kubeconfig) in line, line
