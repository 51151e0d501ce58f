"""Host ports as kube-scheduler's NodePorts filter reads them.

Read in Kubernetes 1.37.2: `pkg/scheduler/framework/plugins/nodeports/node_ports.go`, `pkg/scheduler/util`
`GetHostPorts` and `k8s.io/kube-scheduler/framework` `HostPortInfo` (`CheckConflict`, `sanitize`):
- a pod uses the `hostPort` of every port of its containers and of its restartable (sidecar) init
  containers that sets one above 0; a plain init container's ports are not counted (it has ended before the
  pod runs);
- an empty `hostIP` means 0.0.0.0 (every address), an empty protocol means TCP;
- a node's used ports are those of every pod the scheduler counts on it;
- a wanted port conflicts with a used one of the same protocol and number when either address is 0.0.0.0 or
  both addresses are equal (10.0.0.1:80/TCP and 10.0.0.2:80/TCP do not conflict; 80/TCP and 80/UDP do not).

Pure: plain dicts in, tuples out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ALL_ADDRESSES = "0.0.0.0"  # the scheduler's name for every address (an empty hostIP)
DEFAULT_PROTOCOL = "TCP"

HostPort = tuple[str, str, int]  # (hostIP, protocol, port), sanitised as the scheduler does


def _containers(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for container in spec.get("initContainers") or ():
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            yield container
    for container in spec.get("containers") or ():
        if isinstance(container, Mapping):
            yield container


def of_pod(pod: Mapping[str, Any]) -> frozenset[HostPort]:
    """The host ports the pod uses (empty for most pods)."""
    used: set[HostPort] = set()
    for container in _containers(pod.get("spec") or {}):
        for port in container.get("ports") or ():
            if not isinstance(port, Mapping):
                continue
            number = port.get("hostPort")
            if type(number) is int and number > 0:
                used.add((str(port.get("hostIP") or ALL_ADDRESSES), str(port.get("protocol") or DEFAULT_PROTOCOL),
                          number))
    return frozenset(used)


def conflicts(wanted: Iterable[HostPort], used: frozenset[HostPort]) -> list[HostPort]:
    """The wanted ports that a used one rules out, sorted (empty: none)."""
    if not used:
        return []
    out = []
    for ip, protocol, number in wanted:
        if ip == ALL_ADDRESSES:
            if any(p == protocol and n == number for _, p, n in used):
                out.append((ip, protocol, number))
        elif (ALL_ADDRESSES, protocol, number) in used or (ip, protocol, number) in used:
            out.append((ip, protocol, number))
    return sorted(out)


def describe(port: HostPort) -> str:
    ip, protocol, number = port
    return f"{number}/{protocol}" if ip == ALL_ADDRESSES else f"{ip}:{number}/{protocol}"
