"""What every subcommand shares: flags spelled the same everywhere, and loading settings from them.

Every command that talks to a cluster takes `connection_parent()` (`--config`, `--kubeconfig`, `--context`);
those that list what they read also take `cluster_parent()` (`-n/--namespace`, `-o/--output`), as kubectl does.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from common import settings, settings_loader


def command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    run: Callable[[argparse.Namespace], int],
    help: str,
    description: str | None,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    """The subcommand `name`, calling `run(args)`; its `--help` shows `description` as written (a module docstring
    keeps its lines)."""
    parser = sub.add_parser(name, help=help, description=description, parents=list(parents),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=run)
    return parser


def add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=pathlib.Path,
                        help="settings file (as rendered by the Helm chart); default: $GPU_STEWARD_CONFIG")


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text or json")


def connection_parent() -> argparse.ArgumentParser:
    """`--config`, `--kubeconfig`, `--context`: pass as `parents=[...]` to `add_parser`."""
    parent = argparse.ArgumentParser(add_help=False)
    add_config(parent)
    parent.add_argument("--kubeconfig", type=pathlib.Path,
                        help="kubeconfig file (kubernetes.kubeconfig); default: in-cluster, else $KUBECONFIG "
                             "or ~/.kube/config")
    parent.add_argument("--context", help="kubeconfig context (kubernetes.context); default: its current context")
    return parent


def cluster_parent() -> argparse.ArgumentParser:
    """`connection_parent()` plus `-n/--namespace` and `-o/--output`, for commands that list what they read."""
    parent = argparse.ArgumentParser(add_help=False, parents=[connection_parent()])
    parent.add_argument("-n", "--namespace", help="only this namespace (default: all namespaces)")
    add_output(parent)
    return parent


def connection_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `--kubeconfig` and `--context` set (none when absent)."""
    kube = {key: str(value) for key, value in (("kubeconfig", args.kubeconfig), ("context", args.context)) if value}
    return {"kubernetes": kube} if kube else {}


def load_settings(
    args: argparse.Namespace, *, overrides: Callable[[argparse.Namespace], dict[str, Any]] | None = None
) -> settings.Settings:
    """Settings from `--config`, the environment, `--kubeconfig`/`--context` and the command's own flags; a bad
    value exits 2 with a message naming the key (overrides may raise SettingsError too)."""
    try:
        flags = settings.merge(connection_overrides(args) if hasattr(args, "context") else {},
                               overrides(args) if overrides else {})
        config = settings_loader.load(config_file=args.config, overrides=flags or None)
    except settings.SettingsError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from exc
    logging.getLogger().setLevel(config.log_level)
    return config
