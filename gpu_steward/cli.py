"""`gpu-steward` — one console script, one subcommand per job.

Each subcommand lives in its own module in this package exposing `register(subparsers)`, which adds
its parser and sets `func`, a callable taking the parsed arguments and returning an exit code.
Every subcommand also takes `--log-format`, added here.

Exit codes: 0 done, 1 failed while working, 2 bad arguments, settings, cluster state or Kubernetes
configuration (one line on stderr saying which and why, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from common import buildinfo, settings
from gpu_steward import logs

COMMAND_MODULES = (
    "gpu_steward.cmd_webhook",
    "gpu_steward.cmd_explain",
    "gpu_steward.cmd_descheduler",
    "gpu_steward.cmd_gangs",
    "gpu_steward.cmd_release_gates",
    "gpu_steward.cmd_label_node",
    "gpu_steward.cmd_check",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-steward",
        description="NVLink-aware placement, gang release and idle-GPU reclaim for Kubernetes.",
    )
    parser.add_argument("--version", action="version",
                        version=f"gpu-steward {buildinfo.VERSION} (Python {buildinfo.PYTHON})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in sub.choices.values():
        command.add_argument(
            "--log-format", choices=logs.FORMATS, default=os.environ.get(logs.FORMAT_ENV, "text"),
            help=f"text, or one JSON object per line (default: ${logs.FORMAT_ENV}, else text)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_format not in logs.FORMATS:  # argparse checks flags against choices, not defaults
        parser.error(f"${logs.FORMAT_ENV}={args.log_format!r}: expected one of {', '.join(logs.FORMATS)}")
    logs.configure(args.log_format)
    try:
        code: int = args.func(args)
    except settings.SettingsError as exc:  # e.g. no usable kubeconfig, found once the command needs the API
        print(f"gpu-steward {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
