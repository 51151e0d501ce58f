"""A real Kubernetes control plane on this machine, for the end-to-end tests, the benchmarks and the demo.

kube-apiserver, etcd, kube-scheduler and kube-controller-manager run as plain processes started by
`kwokctl create cluster --runtime binary`; kwok's controller plays every kubelet, so nodes annotated
`kwok.x-k8s.io/node: fake` go Ready and pods bound to them run. Binaries come from
`hack/controlplane/build.sh` (built once from the Go module proxy, cached under ~/.cache/gpu-steward).

Everything listens on 127.0.0.1 on ports kwokctl picks free, lives in a temporary directory (kwok's
workdir, the kubeconfig, the component logs) and is stopped by PID: `stop()` returns only when every
process it started has exited.

The API is synchronous; async callers use `async with LocalCluster(...)` (which runs start and stop
in a worker thread) or `asyncio.to_thread` for the rest.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Self

import yaml

from common import gpu, settings, topology

log = logging.getLogger(__name__)

BUILD_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "hack" / "controlplane" / "build.sh"
# The Kubernetes versions the project builds and tests, newest (the default) first: the e2e facts about
# kube-scheduler that release relies on are proven on each (tests/e2e/test_nomination_facts_e2e.py).
KUBERNETES_VERSIONS = ("1.37.2", "1.36.3")
DEFAULT_KUBERNETES_VERSION = KUBERNETES_VERSIONS[0]
# What kwokctl starts for a binary-runtime cluster; each writes <workdir>/clusters/<name>/pids/<c>.pid.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")
# kwokctl flag -> our binary for it (kwokctl would otherwise download release binaries).
BINARY_FLAGS = {
    "--etcd-binary": "etcd",
    "--kube-apiserver-binary": "kube-apiserver",
    "--kube-controller-manager-binary": "kube-controller-manager",
    "--kube-scheduler-binary": "kube-scheduler",
    "--kwok-controller-binary": "kwok",
}
REQUIRED_BINARIES = (*BINARY_FLAGS.values(), "kwokctl", "kubectl")
# KwokctlConfiguration options naming every port a binary-runtime cluster listens on.
PORT_OPTIONS = (
    "kubeApiserverPort",
    "etcdPort",
    "etcdPeerPort",
    "kubeControllerManagerPort",
    "kubeSchedulerPort",
    "kwokControllerPort",
)
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"

Progress = Callable[[str], None]


class HarnessError(RuntimeError):
    """The local control plane could not be built, started, used or stopped; the message says why."""


class KubectlError(HarnessError):
    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr


def _log_progress(message: str) -> None:
    log.info("%s", message)


def ensure_binaries(
    *,
    version: str = DEFAULT_KUBERNETES_VERSION,
    progress: Progress | None = None,
    timeout_seconds: float = 3600,
) -> pathlib.Path:
    """Return the directory holding the control-plane binaries of Kubernetes `version` (e.g. "1.36.3"),
    building whatever is missing first.

    Runs the build script every time: when everything is cached it only checks files (milliseconds,
    no Go needed). Its progress lines go to `progress`; a failure raises `HarnessError` with the tail
    of its output.
    """
    say = progress or _log_progress
    tail: collections.deque[str] = collections.deque(maxlen=40)
    env = {**os.environ, "K8S_VERSION": version}
    # Its own process group, so a timeout or Ctrl-C stops the `go build`s under it, not just bash.
    with subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as proc:

        def kill_group() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        killer = threading.Timer(timeout_seconds, kill_group)  # the build has no network timeout of its own
        killer.start()
        try:
            assert proc.stderr is not None and proc.stdout is not None
            for line in proc.stderr:
                say(line.rstrip())
                tail.append(line.rstrip())
            out = proc.stdout.read()
            code = proc.wait()
        finally:
            killer.cancel()
            if proc.poll() is None:
                kill_group()
                proc.wait()
    if code != 0:
        why = "timed out" if code == -signal.SIGKILL else f"exited {code}"
        raise HarnessError(f"building the control plane v{version} ({BUILD_SCRIPT}) {why}:\n" + "\n".join(tail))
    bin_dir = pathlib.Path(out.strip().splitlines()[-1])
    if bin_dir.parent.name != f"k8s-{version}":
        raise HarnessError(f"asked the control-plane build for v{version}, it answered {bin_dir}")
    missing = [name for name in REQUIRED_BINARIES if not (bin_dir / name).is_file()]
    if missing:
        raise HarnessError(f"the control-plane build finished but {bin_dir} lacks {', '.join(missing)}")
    return bin_dir


def _run(
    argv: Sequence[str], *, env: Mapping[str, str], timeout_seconds: float, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, input=input, env=env, capture_output=True, text=True, timeout=timeout_seconds, check=False
    )


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now, picked at random by the OS.

    Held open together so they differ; random rather than kwokctl's scan down from 32767, so that
    clusters started at the same moment by parallel test runs do not pick the same ports.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    return free_ports(1)[0]


# --- processes, by PID ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pid:
    """A process identity that survives PID reuse: the PID plus its start time (clock ticks since boot)."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> Pid | None:
        ticks = _start_ticks(pid)
        return None if ticks is None else cls(pid, ticks)

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks

    def rss_bytes(self) -> int:
        try:
            status = pathlib.Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        return int(match.group(1)) * 1024 if match and self.alive() else 0

    def cpu_seconds(self) -> float | None:
        """User + system CPU the process has used so far (None once it is gone)."""
        fields = _stat_fields(self.pid)
        if fields is None or not self.alive():
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from its third field (the state) on; None if there is no such process."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces and ')'


def _start_ticks(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, else None."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None  # gone, or exited with only its parent's wait() missing
    return int(fields[19])


def _signal(pids: Iterable[Pid], sig: signal.Signals) -> None:
    for p in pids:
        if p.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)


def _wait_gone(pids: Iterable[Pid], *, timeout_seconds: float) -> list[Pid]:
    """Wait until none of `pids` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout_seconds
    pending = [p for p in pids if p.alive()]
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        pending = [p for p in pending if p.alive()]
    return pending


def _wait_reaped(pids: Iterable[Pid], *, timeout_seconds: float = 3) -> None:
    """Give init a moment to reap exited orphans so they do not linger as <defunct> in `ps`."""
    deadline = time.monotonic() + timeout_seconds
    while any(pathlib.Path(f"/proc/{p.pid}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_pids(pids: Mapping[str, Pid], *, grace_seconds: float) -> None:
    """SIGTERM, wait `grace_seconds`, SIGKILL what is left; raise if anything survives that."""
    _signal(pids.values(), signal.SIGTERM)
    left = _wait_gone(pids.values(), timeout_seconds=grace_seconds)
    _signal(left, signal.SIGKILL)
    left = _wait_gone(left, timeout_seconds=5)
    if left:
        names = [f"{name} (pid {p.pid})" for name, p in pids.items() if p in left]
        raise HarnessError(f"still running after SIGKILL: {', '.join(names)}")


class ManagedProcess:
    """One background process (our webhook, a Prometheus, …) with its output in a log file.

    Started in its own session so a Ctrl-C meant for the test runner does not reach it first;
    `stop()` ends it by PID (SIGTERM, then SIGKILL) and waits for it.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_file: pathlib.Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_file = log_file
        self.env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        if self.running():
            return self
        with self.log_file.open("ab") as out:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        return self

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_http_ok(self, url: str, *, ssl_context: ssl.SSLContext | None = None, timeout_seconds: float = 90) -> None:
        """Poll `url` until it answers 200; fail early (with the log) if the process dies.

        The bound is generous: a webhook's first watch lists take over 30 s on a loaded 2-core machine, and a dead
        process ends the wait at once anyway."""
        deadline = time.monotonic() + timeout_seconds
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not self.running():
                code = self._proc.returncode if self._proc else None
                raise HarnessError(f"{self.name} exited ({code}) before {url} was ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=ssl_context) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise HarnessError(f"{self.name}: {url} not ready after {timeout_seconds:.0f} s ({last}):\n{self.log_tail()}")

    def stop(self, *, grace_seconds: float = 10) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI time limit, `kill`) ends Python without running `finally` blocks, which would
    orphan every process we started; inside this block it raises KeyboardInterrupt instead."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- the cluster ---------------------------------------------------------------------------------


class LocalCluster:
    """One kwok cluster with a real control plane; `start()`/`stop()` or `with`/`async with`."""

    def __init__(
        self,
        bin_dir: pathlib.Path,
        *,
        name: str | None = None,
        scheduler_config: Mapping[str, Any] | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Mapping[str, str] | None = None,
        scheduler_verbosity: int | None = None,
        keep_logs: pathlib.Path | None = None,
        progress: Progress | None = None,
        start_timeout_seconds: float = 120,
        stop_timeout_seconds: float = 30,
    ) -> None:
        """`scheduler_config` is a KubeSchedulerConfiguration (kwokctl fills in its kubeconfig);
        `feature_gates` (e.g. {"GenericWorkload": True}) and `runtime_config`
        (e.g. {"scheduling.k8s.io/v1alpha2": "true"}) go to every component that takes them;
        `scheduler_verbosity`: kube-scheduler's `--v` (5 logs each queueing decision: which event moved which pod);
        `keep_logs`: a directory the components' logs are copied to on `stop()` (the workdir is removed)."""
        self.bin_dir = bin_dir
        self.name = name or f"gs-{secrets.token_hex(4)}"
        self.scheduler_config = scheduler_config
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config = dict(runtime_config or {})
        self.scheduler_verbosity = scheduler_verbosity
        self.keep_logs = keep_logs
        self._say = progress or _log_progress
        self.start_timeout_seconds = start_timeout_seconds
        self.stop_timeout_seconds = stop_timeout_seconds
        self._workdir: pathlib.Path | None = None
        self._pids: dict[str, Pid] = {}

    # -- paths

    @property
    def workdir(self) -> pathlib.Path:
        if self._workdir is None:
            raise HarnessError(f"cluster {self.name} is not started")
        return self._workdir

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.workdir / "kubeconfig.yaml"

    @property
    def cluster_dir(self) -> pathlib.Path:
        return self.workdir / "clusters" / self.name

    @property
    def pids(self) -> Mapping[str, Pid]:
        return types.MappingProxyType(self._pids)

    def rss_bytes(self) -> int:
        """Resident memory of the control-plane processes right now."""
        return sum(p.rss_bytes() for p in self._pids.values())

    # -- lifecycle

    def _kwokctl(self, *args: str, timeout_seconds: float) -> subprocess.CompletedProcess[str]:
        # kwokctl runs the first `kubectl` on PATH (its readiness checks): make that ours, not whatever is installed.
        path = f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "KWOK_WORKDIR": str(self.workdir), "PATH": path}
        return _run(
            [str(self.bin_dir / "kwokctl"), "--name", self.name, *args], env=env, timeout_seconds=timeout_seconds
        )

    def start(self) -> Self:
        if self._workdir is not None:
            return self
        self._workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpu-steward-kwok-"))
        try:
            self._create()
            self._wait_usable()
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self) -> None:
        config = self.workdir / "kwokctl.yaml"
        ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
        # Loopback only (kwokctl's default bind address is 0.0.0.0), on ports the OS picked.
        document: dict[str, Any] = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": {"bindAddress": "127.0.0.1", **ports},
        }
        if self.scheduler_verbosity is not None:
            document["componentsPatches"] = [
                {"name": "kube-scheduler", "extraArgs": [{"key": "v", "value": str(self.scheduler_verbosity)}]}
            ]
        config.write_text(yaml.safe_dump(document))
        wait = f"{int(self.start_timeout_seconds)}s"
        args = [
            *("--config", str(config), "create", "cluster", "--runtime=binary", f"--kubeconfig={self.kubeconfig}"),
            "--kube-admission",  # the real admission chain (Priority, ServiceAccount, …): default, but be explicit
            *(f"--wait={wait}", f"--timeout={wait}"),
            *(f"{flag}={self.bin_dir / binary}" for flag, binary in BINARY_FLAGS.items()),
        ]
        if self.scheduler_config is not None:
            path = self.workdir / "kube-scheduler-config.yaml"
            path.write_text(yaml.safe_dump(dict(self.scheduler_config)))
            args.append(f"--kube-scheduler-config={path}")
        if self.feature_gates:
            gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
            args.append(f"--kube-feature-gates={gates}")
        if self.runtime_config:
            args.append("--kube-runtime-config=" + ",".join(f"{k}={v}" for k, v in sorted(self.runtime_config.items())))
        self._say(f"starting Kubernetes control plane {self.name} (kwok, binary runtime) in {self.workdir}")
        started = time.monotonic()
        try:
            done = self._kwokctl(*args, timeout_seconds=self.start_timeout_seconds + 30)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"kwokctl create cluster timed out after {exc.timeout:.0f} s") from exc
        finally:
            self._collect_pids()
        if done.returncode != 0:
            raise HarnessError(
                f"kwokctl create cluster failed ({done.returncode}):\n{done.stderr.strip()}\n{self._log_tails()}"
            )
        missing = [c for c in COMPONENTS if c not in self._pids]
        if missing:
            raise HarnessError(
                f"no live process for {', '.join(missing)} after kwokctl create:\n{self._log_tails(missing)}"
            )
        self._say(f"control plane up in {time.monotonic() - started:.1f} s")

    def _collect_pids(self) -> None:
        """Remember every component process kwokctl started (its pid files vanish on delete)."""
        pid_dir = self.cluster_dir / "pids"
        for path in sorted(pid_dir.glob("*.pid")) if pid_dir.is_dir() else ():
            try:
                pid = Pid.of(int(path.read_text().strip()))
            except (OSError, ValueError):
                continue
            if pid is not None:
                self._pids.setdefault(path.stem, pid)

    def _log_tails(self, components: Iterable[str] = COMPONENTS, *, lines: int = 15) -> str:
        out = []
        for path in (self.cluster_dir / "logs" / f"{c}.log" for c in components):
            if not path.is_file():
                continue
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    def _wait_usable(self) -> None:
        """Ready means pods can be created: the apiserver is ready and `default` has its ServiceAccount."""
        deadline = time.monotonic() + self.start_timeout_seconds
        while True:
            ready = self.kubectl("get", "--raw", "/readyz", check=False, timeout_seconds=10)
            account = self.kubectl(
                "get", "serviceaccount", "default", "-n", "default", "-o", "name", check=False, timeout_seconds=10
            )
            if ready.returncode == 0 and account.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise HarnessError(f"cluster {self.name} not usable: {ready.stderr or account.stderr}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Delete the cluster and return once every process it started has exited (killing stragglers)."""
        if self._workdir is None:
            return
        started = time.monotonic()
        self._collect_pids()
        logs = self.cluster_dir / "logs"
        if self.keep_logs is not None and logs.is_dir():  # before kwokctl deletes them
            shutil.copytree(logs, self.keep_logs / self.name, dirs_exist_ok=True)
        try:
            done = self._kwokctl("delete", "cluster", timeout_seconds=60)
            if done.returncode != 0:
                log.warning("kwokctl delete cluster %s failed: %s", self.name, done.stderr.strip())
        except subprocess.TimeoutExpired:
            log.warning("kwokctl delete cluster %s timed out; stopping its processes by PID", self.name)
        try:
            # kwokctl returns before its processes are gone; give them the grace period, then insist.
            left = _wait_gone(self._pids.values(), timeout_seconds=self.stop_timeout_seconds)
            stop_pids({n: p for n, p in self._pids.items() if p in left}, grace_seconds=5)
            _wait_reaped(self._pids.values())
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self._pids = {}
        self._say(f"control plane {self.name} stopped in {time.monotonic() - started:.1f} s")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        # Shielded: a cancelled caller must not leave the control plane running.
        await asyncio.shield(asyncio.to_thread(self.stop))

    # -- using it

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout_seconds: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raise `KubectlError` on failure unless `check=False`."""
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        done = _run(argv, env=env, timeout_seconds=timeout_seconds, input=input)
        if check and done.returncode != 0:
            raise KubectlError(args, done.returncode, done.stderr)
        return done

    def kubectl_json(self, *args: str, timeout_seconds: float = 60) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", timeout_seconds=timeout_seconds).stdout)

    def server_version(self) -> str:
        """The version kube-apiserver reports, e.g. "v1.36.3" (the build stamps it; see build.sh)."""
        return str(self.kubectl_json("version")["serverVersion"]["gitVersion"])

    def apply(self, objects: Iterable[Mapping[str, Any]], *, server_side: bool = False) -> None:
        items = list(objects)
        if not items:
            return
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        self.kubectl("apply", *(["--server-side"] if server_side else []), "-f", "-", input=doc)

    def add_nodes(self, nodes: Sequence[Mapping[str, Any]], *, timeout_seconds: float = 60) -> list[str]:
        """Create kwok nodes and wait until all are Ready; return their names."""
        self.apply(nodes)
        names = [str(node["metadata"]["name"]) for node in nodes]
        self.kubectl(
            "wait",
            "--for=condition=Ready",
            f"--timeout={int(timeout_seconds)}s",
            *(f"node/{n}" for n in names),
            timeout_seconds=timeout_seconds + 10,
        )
        return names


# --- kwok GPU nodes ------------------------------------------------------------------------------

_GROUP = re.compile(r"^(?P<count>\d+)x(?P<gpus>\d+)g(?:(?P<domains>\d+)d)?(?::(?P<product>[A-Za-z0-9._-]+))?$")


@dataclasses.dataclass(frozen=True)
class NodeGroup:
    count: int
    gpus: int
    domains: int
    product: str

    @property
    def domain_size(self) -> int:
        return self.gpus // self.domains if self.domains else 0

    def topology(self) -> list[list[int]]:
        size = self.domain_size
        return [list(range(d * size, (d + 1) * size)) for d in range(self.domains)]


def parse_nodes(description: str) -> list[NodeGroup]:
    """Parse a node description: comma-separated groups `COUNTxGPUSg[DOMAINSd][:PRODUCT]`.

    `4x8g2d` is 4 nodes of 8 GPUs in 2 NVLink domains of 4; `2x2g` is 2 nodes of 2 GPUs in one domain;
    `1x8g8d:NVIDIA-A100-PCIE-40GB` is a node of 8 unlinked GPUs of that product; `2x0g` are 2 CPU-only
    nodes. Domains must divide the GPUs evenly (contiguous indices, as on the machines we model).
    """
    groups = []
    for raw in description.split(","):
        text = raw.strip()
        match = _GROUP.match(text)
        if not match:
            raise ValueError(f"node group {text!r}: expected COUNTxGPUSg[DOMAINSd][:PRODUCT], e.g. 4x8g2d")
        count, gpus = int(match["count"]), int(match["gpus"])
        domains = int(match["domains"]) if match["domains"] else (1 if gpus else 0)
        if count < 1:
            raise ValueError(f"node group {text!r}: needs at least one node")
        if gpus == 0 and domains:
            raise ValueError(f"node group {text!r}: a node without GPUs has no NVLink domains")
        if gpus and domains < 1:
            raise ValueError(f"node group {text!r}: GPUs need at least one NVLink domain")
        if gpus and gpus % domains:
            raise ValueError(f"node group {text!r}: {domains} domains do not divide {gpus} GPUs evenly")
        groups.append(NodeGroup(count, gpus, domains, match["product"] or DEFAULT_GPU_PRODUCT))
    return groups


def gpu_nodes(
    description: str,
    *,
    names: settings.Names,
    name_prefix: str = "kwok",
    cpu: str = "128",
    memory: str = "1024Gi",
    pods: int = 110,
) -> list[dict[str, Any]]:
    """kwok Node manifests for `description` (see `parse_nodes`), named `<prefix>-<G>g<D>d-<i>`.

    Each carries our NVLink labels and annotation, the NVIDIA feature-discovery labels and
    `nvidia.com/gpu` capacity, no taints, and `kubernetes.io/hostname` (hand-made nodes get none else).
    """
    nodes: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for group in parse_nodes(description):
        shape = f"{group.gpus}g{group.domains}d" if group.gpus else "cpu"
        for _ in range(group.count):
            index = seen.get(shape, 0)
            seen[shape] = index + 1
            nodes.append(_node(f"{name_prefix}-{shape}-{index}", group, names=names, cpu=cpu, memory=memory, pods=pods))
    return nodes


def gpu_node(
    name: str,
    *,
    gpus: int,
    domains: int,
    product: str,
    names: settings.Names,
    cpu: str,
    memory: str,
    pods: int = 110,
) -> dict[str, Any]:
    """One kwok node shaped like `gpu_nodes`' but named and sized by the caller (e.g. a trace's node)."""
    group = parse_nodes(f"1x{gpus}g{domains}d:{product}")[0]  # same validation as a description
    return _node(name, group, names=names, cpu=cpu, memory=memory, pods=pods)


def _node(name: str, group: NodeGroup, *, names: settings.Names, cpu: str, memory: str, pods: int) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    annotations = {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"}
    resources: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if group.gpus:
        labels |= {
            topology.GPU_COUNT_LABEL: str(group.gpus),
            GPU_PRODUCT_LABEL: group.product,
            names.nvlink_domains: str(group.domains),
            names.nvlink_domain_size: str(group.domain_size),
        }
        annotations[names.nvlink_topology] = json.dumps(group.topology(), separators=(",", ":"))
        resources[gpu.FULL_GPU] = str(group.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "phase": "Running",
        },
    }


# --- webhook registration ------------------------------------------------------------------------


def mutating_webhook_configuration(
    *,
    name: str,
    url: str,
    ca_bundle: bytes,
    excluded_namespaces: Sequence[str] = ("kube-system",),
    bypass_label: str | None = None,
    timeout_seconds: int = 3,
) -> dict[str, Any]:
    """Register a webhook served outside the cluster (by URL) for pod CREATE, failing open.

    Namespaces in `excluded_namespaces` are never sent; neither are namespaces labelled
    `bypass_label: "true"` when given (tests that must see plain Kubernetes use that).
    """
    expressions: list[dict[str, Any]] = [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(excluded_namespaces)}
    ]
    if bypass_label:
        expressions.append({"key": bypass_label, "operator": "NotIn", "values": ["true"]})
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pods.gpu-steward.io",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                "admissionReviewVersions": ["v1"],
                "namespaceSelector": {"matchExpressions": expressions},
                "reinvocationPolicy": "Never",
            }
        ],
    }
