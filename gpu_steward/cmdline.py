"""What every subcommand shares: the `--config` / `--output` flags and loading settings from them."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from common import settings, settings_loader


def add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=pathlib.Path,
                        help="settings file (as rendered by the Helm chart); default: $GPU_STEWARD_CONFIG")


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", choices=("text", "json"), default="text")


def load_settings(
    args: argparse.Namespace, *, overrides: Callable[[argparse.Namespace], dict[str, Any]] | None = None
) -> settings.Settings:
    """Settings from `--config`, the environment and the command's own flags; a bad value exits 2
    with a message naming the key (overrides may raise SettingsError too)."""
    try:
        config = settings_loader.load(config_file=args.config, overrides=overrides(args) if overrides else None)
    except settings.SettingsError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from exc
    logging.getLogger().setLevel(config.log_level)
    return config
