"""`gpu-steward release-gates`: remove our scheduling gate from every pod that carries it.

    gpu-steward release-gates --dry-run      # list the pods it would release
    gpu-steward release-gates [-n NAMESPACE] # release them (all namespaces by default)

For uninstalling (the Helm chart runs it in a pre-delete hook Job) or any time the descheduler will not
be back: once it is gone nothing removes `<prefix>gang`, and the pods stay `SchedulingGated`. Only our
gate goes; each patch carries a JSON-patch `test` of the gate's name at its index, so a list that moved
since it was read fails the patch (it is then read again) instead of removing another controller's gate.
Gang members released this way are scheduled one by one, without the all-or-nothing guarantee, except those
naming their gang's own PodGroup (`descheduler.gangs.native_binding`): that PodGroup is created first (without it
kube-scheduler would hold them for ever), and kube-scheduler binds them all-or-nothing (a pod whose PodGroup cannot
be made is not released, and counts as failed). A pod whose claim entry the webhook pointed at a claim of its own
(`settings.dra.domain_claims`) gets that claim first, made from its template (a pod whose claim cannot be made is not
released, and counts as failed).
Running it again finds nothing to do. Exit code: 0 when every gated pod was released (or was gone),
1 when any could not be, 2 on bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from common import gangs, gate_patch, settings
from gpu_steward import cmdline

JSON_PATCH = "application/json-patch+json"
PAGE_SIZE = 500
# A patch whose `test` failed means the gates moved since the pod was read: read it and try again,
# this many times (another controller removing its own gate at the same moment is the usual cause).
ATTEMPTS = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = cmdline.command(sub, "release-gates", run=run, parents=[cmdline.cluster_parent()],
                             help="remove gpu-steward's scheduling gate from every pod that carries it "
                                  "(before uninstalling)",
                             description=__doc__)
    parser.add_argument("--dry-run", action="store_true", help="list the pods that carry the gate; change nothing")


@dataclasses.dataclass
class Result:
    gate: str
    dry_run: bool
    released: list[str] = dataclasses.field(default_factory=list)  # pod keys (would be released, on a dry run)
    gone: list[str] = dataclasses.field(default_factory=list)  # deleted, or un-gated by someone else meanwhile
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # pod key -> why

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def as_text(self) -> str:
        verb = "would release" if self.dry_run else "released"
        lines = [f"{verb} {key}" for key in self.released]
        lines += [f"gone {key} (deleted or no longer gated)" for key in self.gone]
        lines += [f"failed {key}: {why}" for key, why in self.failed.items()]
        total = len(self.released) + len(self.gone) + len(self.failed)
        lines.append(f"{total} pod(s) carried {self.gate}: {len(self.released)} {verb}, {len(self.gone)} gone, "
                     f"{len(self.failed)} failed")
        return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = cmdline.load_settings(args)
    try:
        result = asyncio.run(release(config, namespace=args.namespace, dry_run=args.dry_run))
    except (_ListError, aiohttp.ClientError, TimeoutError, OSError) as exc:
        print(f"release-gates: cannot list pods: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.as_json(), indent=2) if args.output == "json" else result.as_text())
    return 1 if result.failed else 0


class _ListError(Exception):
    """The API server refused the pod list (the message carries its status and reason)."""


async def release(config: settings.Settings, *, namespace: str | None, dry_run: bool) -> Result:
    from common import claims, kube, pod_groups  # the Kubernetes client is slow to import; `--help` never needs it

    gate = config.names.gate
    timeout = config.kubernetes.request_timeout_seconds
    result = Result(gate=gate, dry_run=dry_run)
    api = await kube.api_client(config.kubernetes)
    try:
        try:
            every = [pod async for pod in _pods(api, namespace=namespace, timeout_seconds=timeout)]
        except kube.ApiError as exc:
            raise _ListError(str(exc)) from exc
        ensured: set[str] = set()  # our gangs' own PodGroups made sure of
        for pod in (pod for pod in every if gate_patch.ungate(pod, gate=gate)):
            key = f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"
            if dry_run:
                result.released.append(key)
                continue
            try:
                group = gangs.named_pod_group(pod, names=config.names)
                if group and f"{key.partition('/')[0]}/{group}" not in ensured:
                    # Un-gated while it is missing, the pod would wait in kube-scheduler's queue for ever.
                    members = gangs.same_pod_group(every, like=pod, names=config.names)
                    ensured.update(await pod_groups.ensure(api, members=members, names=config.names,
                                                           timeout_seconds=timeout))
                # Un-gated while its claim of its own is missing, the pod would wait for ever too.
                await claims.ensure(api, pod=pod, names=config.names, domain=None, timeout_seconds=timeout)
                outcome = await release_pod(api, pod, gate=gate, timeout_seconds=timeout)
            except (kube.ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                result.failed[key] = str(exc) or type(exc).__name__
                continue
            (result.released if outcome else result.gone).append(key)
    finally:
        await api.close()
    return result


async def _pods(api: Any, *, namespace: str | None, timeout_seconds: float) -> AsyncIterator[dict[str, Any]]:
    """Every pod, page by page (a cluster may hold tens of thousands)."""
    from common import kube

    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    token = ""
    while True:
        query: dict[str, kube.QueryValue] = {"limit": PAGE_SIZE, **({"continue": token} if token else {})}
        page = await kube.get(api, path, timeout_seconds=timeout_seconds, query=query)
        for pod in page.get("items") or []:
            yield pod
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return


async def release_pod(api: Any, pod: dict[str, Any], *, gate: str, timeout_seconds: float) -> bool:
    """Remove our gate from `pod`: True when removed, False when the pod is gone or no longer carries it."""
    from common import kube

    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
    attempt = 1
    while patch := gate_patch.ungate(pod, gate=gate):
        try:
            await kube.request(api, "PATCH", path, body=patch, content_type=JSON_PATCH, timeout_seconds=timeout_seconds)
            return True
        except kube.ApiError as exc:
            if exc.status == 404:
                return False
            if exc.status != 422 or attempt == ATTEMPTS:  # 422: our `test` failed, the gates moved
                raise
        attempt += 1
        try:
            pod = await kube.get(api, path, timeout_seconds=timeout_seconds)
        except kube.ApiError as exc:
            if exc.status == 404:
                return False
            raise
    return False
