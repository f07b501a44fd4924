"""Loading: a YAML file, overridden by ``WEIGHT_CONTROLLER_*`` environment, into ``Settings``;
every validation problem becomes one line ``field.path: reason`` inside a ``ConfigError``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import SettingsError

from controller import CONFIG_ENV
from controller.errors import ConfigError
from controller.settings.checks import cross_field_problems
from controller.settings.schema import Settings


def _format_loc(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.startswith(("function-after", "function-before")):
            continue
        else:
            text += f".{part}" if text else part
    return text or "(top level)"


def _error_lines(exc: ValidationError) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        where = _format_loc(tuple(error["loc"]))
        for part in message.split("\n"):  # a cross-field check reports all it found
            lines.append(part if where == "(top level)" and ": " in part else f"{where}: {part}")
    return lines


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not a YAML file (not UTF-8 text)"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}".replace("\n", " ")]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: the top level must be a mapping"])
    return data


def build_settings(data: Mapping[str, Any]) -> Settings:
    """Validate a mapping (plus the environment) into Settings, or raise ConfigError with
    every problem: field errors and cross-field ones together, one line each."""
    try:
        return Settings(**data)
    except ValidationError as exc:
        lines = _error_lines(exc)
        lines += [p for p in cross_field_problems(data) if p not in lines]
        raise ConfigError(lines) from None
    except SettingsError as exc:  # a malformed WEIGHT_CONTROLLER_* variable
        cause = exc.__cause__
        detail = f": {cause}" if cause is not None else ""
        raise ConfigError([f"environment: {exc}{detail}".replace("\n", " ")]) from None


def load_settings(path: Path | None = None) -> Settings:
    """The file named by ``path`` or ``$WEIGHT_CONTROLLER_CONFIG``, then the environment."""
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    data = read_yaml(path) if path is not None else {}
    return build_settings(data)
