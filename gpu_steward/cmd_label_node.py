"""`gpu-steward label-node`: publish this node's NVLink domains as labels and an annotation.

    gpu-steward label-node --once --dry-run          # read, parse, print the merge patch; no API call
    gpu-steward label-node                           # the DaemonSet: re-check every --interval seconds

Each check runs `nvidia-smi topo -m` (with a timeout), parses it (`common.nvtopo`), reads the Node and
sends a JSON merge patch with only those of our keys that differ. A failed read (nvidia-smi missing,
failing, hanging, or printing something we cannot parse) is logged and writes nothing: the labels of
the last good read stay, never a guess. With `--once` the exit code says how the check went:
0 published or current, 1 failed, 2 bad arguments or settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

from common import nvtopo, settings, settings_loader
from gpu_steward import cmdline

log = logging.getLogger("gpu_steward.label_node")
NODE_NAME_ENV = "NODE_NAME"
MERGE_PATCH = "application/merge-patch+json"


class ReadError(Exception):
    """nvidia-smi could not be run or gave no usable topology; the message says which and why."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = cmdline.command(sub, "label-node", run=run, parents=[cmdline.connection_parent()],
                             help="label this node with its NVLink domains (from nvidia-smi topo -m)",
                             description=__doc__)
    parser.add_argument("--node", default=os.environ.get(NODE_NAME_ENV),
                        help=f"Node to label (default: ${NODE_NAME_ENV}, set from the downward API)")
    parser.add_argument("--once", action="store_true", help="check once and exit (exit code 1 if the check failed)")
    parser.add_argument("--interval", type=_positive, default=300.0, metavar="SECONDS",
                        help="re-check period (default: %(default)s)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", metavar="PATH", help="nvidia-smi binary")
    parser.add_argument("--nvidia-smi-timeout", type=_positive, default=30.0, metavar="SECONDS",
                        help="kill nvidia-smi after this long (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the merge patch instead of sending it")


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        config = settings_loader.load(config_file=args.config, overrides=cmdline.connection_overrides(args) or None)
    except settings.SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    logging.getLogger().setLevel(config.log_level)
    if not args.node and not args.dry_run:
        print(f"label-node: no node name: pass --node or set ${NODE_NAME_ENV}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args, config=config))
    except settings.SettingsError:
        raise  # bad configuration found on the way (no usable kubeconfig): one line, exit 2 (cli.main)
    except Exception:
        log.exception("label-node stopped on an error")
        return 1


async def read_topology(nvidia_smi: str, *, timeout_seconds: float) -> nvtopo.Topology:
    """Run `nvidia-smi topo -m` and parse it; any failure is a ReadError."""
    try:
        process = await asyncio.create_subprocess_exec(
            nvidia_smi, "topo", "-m", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        raise ReadError(f"cannot run {nvidia_smi}: {exc}") from exc
    try:
        async with asyncio.timeout(timeout_seconds):
            out, err = await process.communicate()
    except TimeoutError:
        raise ReadError(f"{nvidia_smi} topo -m did not finish within {timeout_seconds:g}s") from None
    finally:
        if process.returncode is None:  # timed out or cancelled: do not leave it running
            process.kill()
            await process.wait()
    if process.returncode != 0:
        detail = (err or out).decode(errors="replace").strip()[:500]
        raise ReadError(f"{nvidia_smi} topo -m exited with {process.returncode}: {detail}")
    try:
        return nvtopo.parse(out.decode(errors="replace"))
    except nvtopo.ParseError as exc:
        raise ReadError(f"{nvidia_smi} topo -m printed a matrix we cannot parse: {exc}") from exc


async def check(args: argparse.Namespace, *, config: settings.Settings, api: Any) -> bool:
    """One read-and-publish; True when the node now carries the topology just read."""
    try:
        topology = await read_topology(args.nvidia_smi, timeout_seconds=args.nvidia_smi_timeout)
    except ReadError as exc:
        log.error("%s; node labels left as they are", exc)
        return False
    summary = f"{len(topology.domains)} NVLink domain(s), largest {topology.domain_size}: {'; '.join(topology.reasons)}"
    if api is None:
        patch = nvtopo.node_patch({}, topology, names=config.names)
        print(json.dumps(patch, indent=2))
        log.info("dry run: %s", summary)
        return True

    from common import kube  # the Kubernetes client takes a second to import; --dry-run never needs it

    path = f"/api/v1/nodes/{args.node}"
    timeout = config.kubernetes.request_timeout_seconds
    try:
        node = await kube.get(api, path, timeout_seconds=timeout)
        patch = nvtopo.node_patch(node, topology, names=config.names)
        if patch is None:
            log.info("node %s up to date: %s", args.node, summary)
            return True
        await kube.request(api, "PATCH", path, body=patch, content_type=MERGE_PATCH, timeout_seconds=timeout)
    except (kube.ApiError, TimeoutError, OSError) as exc:
        log.error("node %s: cannot publish the topology: %s", args.node, exc)
        return False
    changed = sorted(key for field in patch["metadata"].values() for key in field)
    log.info("node %s patched %s: %s", args.node, changed, summary)
    return True


async def _main(args: argparse.Namespace, *, config: settings.Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with _api(config, live=not args.dry_run) as api:
            if args.once:
                return 0 if await check(args, config=config, api=api) else 1
            async with asyncio.TaskGroup() as group:
                checks = group.create_task(_every(args, config=config, api=api), name="label-node")
                await stop.wait()
                checks.cancel()  # also kills a running nvidia-smi (read_topology's finally)
            log.info("label-node stopped on a signal")
            return 0
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _every(args: argparse.Namespace, *, config: settings.Settings, api: Any) -> None:
    while True:
        await check(args, config=config, api=api)
        await asyncio.sleep(args.interval)


@contextlib.asynccontextmanager
async def _api(config: settings.Settings, *, live: bool) -> Any:
    if not live:
        yield None
        return
    from common import kube

    api = await kube.api_client(config.kubernetes)
    try:
        yield api
    finally:
        await api.close()
