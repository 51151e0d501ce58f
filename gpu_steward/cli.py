"""`gpu-steward` — one console script, one subcommand per job.

Each subcommand lives in its own module in this package exposing `register(subparsers)`, which adds
its parser and sets `func`, a callable taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "gpu_steward.cmd_webhook",
    "gpu_steward.cmd_explain",
    "gpu_steward.cmd_descheduler",
    "gpu_steward.cmd_gangs",
    "gpu_steward.cmd_demo",
    "gpu_steward.cmd_label_node",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-steward",
        description="NVLink-aware placement, gang release and idle-GPU reclaim for Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
