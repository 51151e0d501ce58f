"""`python -m gpu_steward_lab demo` (what scripts/demo runs): a local cluster, a GPU workload with and
without gpu-steward. The lab lives in the clone only: neither the image nor the `gpu-steward` CLI has it."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpu_steward_lab",
                                     description="gpu-steward's lab: the local demo (run it with scripts/demo).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run a realistic GPU workload on a local cluster with and without gpu-steward, and compare",
        description="Builds (once, cached) and starts a local Kubernetes control plane with kwok GPU nodes, "
        "runs the same workload twice — default Kubernetes, then with gpu-steward's webhook and "
        "descheduler — narrates what happened, writes a PNG of GPU occupancy, and stops everything.",
    )
    demo.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo-output"),
                      help="where to write the picture and results (default: ./demo-output)")
    demo.add_argument("--keep", action="store_true",
                      help="leave the gpu-steward run's cluster running and print its kubeconfig path")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # the narration is the output; components log to files
    from gpu_steward_lab import demo  # needs the `demo` extra (Pillow)

    return demo.run(out_dir=args.out, keep=args.keep, say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())
