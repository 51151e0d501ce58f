"""Where settings come from: the one place that reads the settings file and the environment.

Lowest priority first: the defaults of `common.settings`, the YAML file (`--config` / `GPU_STEWARD_CONFIG`),
environment variables `GPU_STEWARD_<GROUP>__<FIELD>` (e.g. `GPU_STEWARD_WEBHOOK__PORT=9443`; lists and
mappings as JSON), then `overrides` (command-line flags). The model itself reads nothing, so
only a process that calls `load()` is configured by its environment.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import yaml

from common import settings

ENV_PREFIX = "GPU_STEWARD_"
CONFIG_ENV = "GPU_STEWARD_CONFIG"


def load(
    *,
    config_file: pathlib.Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> settings.Settings:
    """Load settings from defaults, the YAML file, the environment, then `overrides` (CLI flags).
    `environ`: the environment to read (default: this process's)."""
    env = os.environ if environ is None else environ
    path = config_file or (pathlib.Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise settings.SettingsError(f"settings file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise settings.SettingsError(f"settings file {path}: expected a mapping at the top level")
        data = loaded
    origin = f"{path} and environment" if path else "environment"
    loaded_settings = settings.validate(settings.merge(data, _environment(env)), source=origin)
    if overrides:
        merged = settings.merge(loaded_settings.model_dump(mode="json"), overrides)
        loaded_settings = settings.validate(merged, source="command-line flags")
    return loaded_settings


def _environment(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings document that `GPU_STEWARD_<GROUP>__<FIELD>` variables spell (names case-insensitive),
    unvalidated: validation names a bad key inside a group. A variable whose first part names no group or
    top-level setting is not ours (GPU_STEWARD_LOG_FORMAT is the command line's). A value that starts with
    `[` or `{` is JSON (lists, mappings)."""
    document: dict[str, Any] = {}
    for name, raw in sorted(env.items()):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() == CONFIG_ENV:
            continue
        *groups, field = name[len(ENV_PREFIX):].lower().split("__")
        if (groups[0] if groups else field) not in settings.Settings.model_fields:
            continue
        value: Any = raw
        if raw.lstrip().startswith(("[", "{")):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise settings.SettingsError(f"invalid settings (environment):\n  {name}: not JSON: {exc}") from exc
        target = document
        for group in groups:
            nested = target.setdefault(group, {})
            if not isinstance(nested, dict):
                raise settings.SettingsError(f"invalid settings (environment):\n  {name}: {group} is not a group")
            target = nested
        target[field] = value
    return document
