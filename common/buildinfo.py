"""What this process is: gpu-steward's version and the Python running it (`--version`, `gpu_steward_build_info`)."""

from __future__ import annotations

import importlib.metadata
import platform

import prometheus_client


def _version() -> str:
    try:
        return importlib.metadata.version("gpu-steward")
    except importlib.metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
        return "unknown"


VERSION = _version()
PYTHON = platform.python_version()


def register(registry: prometheus_client.CollectorRegistry) -> None:
    """`gpu_steward_build_info{version,python} 1`: join it onto other series to see what runs where."""
    info = prometheus_client.Gauge(
        "gpu_steward_build_info",
        "Always 1; the labels say which gpu-steward version and Python this process runs.",
        ["version", "python"],
        registry=registry,
    )
    info.labels(version=VERSION, python=PYTHON).set(1)
