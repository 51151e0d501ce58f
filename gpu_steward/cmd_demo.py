"""`gpu-steward demo`: build and start a local cluster, run a GPU workload with and without gpu-steward."""

from __future__ import annotations

import argparse
import logging
import pathlib


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="run a realistic GPU workload on a local cluster with and without gpu-steward, and compare",
        description="Builds (once, cached) and starts a local Kubernetes control plane with kwok GPU nodes, "
        "runs the same workload twice — default Kubernetes, then with gpu-steward's webhook and "
        "descheduler — narrates what happened, writes a PNG of GPU occupancy, and stops everything.",
    )
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo-output"),
                        help="where to write the picture and results (default: ./demo-output)")
    parser.add_argument("--keep", action="store_true",
                        help="leave the gpu-steward run's cluster running and print its kubeconfig path")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.getLogger().setLevel(logging.WARNING)  # the narration is the output; components log to files
    from gpu_steward import demo  # needs the `demo` extra (Pillow), which the image leaves out

    return demo.run(out_dir=args.out, keep=args.keep, say=lambda line: print(line, flush=True))
