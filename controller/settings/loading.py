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
from controller.settings.files import FILE_MAX_BYTES, read_regular
from controller.settings.schema import ENV_PREFIX, GivenSettings, Settings

# pydantic's name for a branch of a union or a validator: no field of the config
_BRANCHES = ("function-after", "function-before", "literal[", "constrained-")


def _format_loc(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.startswith(_BRANCHES):
            continue
        else:
            text += f".{part}" if text else part
    return text or "(top level)"


def _error_lines(exc: ValidationError) -> list[str]:
    """One line a problem, by field; where a union's value branch said why (``settle: 30x``,
    ``forecast_horizon: 1h``), its ``literal[0]`` branch ("Input should be 0") is dropped."""
    errors = exc.errors(include_url=False)

    def literal(error: Any) -> bool:
        return any(isinstance(p, str) and p.startswith("literal[") for p in error["loc"])

    said = {_format_loc(tuple(e["loc"])) for e in errors if not literal(e)}
    lines: dict[str, None] = {}  # in order, once each (a list's ``in`` made 20,000 take 11 s)
    for error in errors:
        where = _format_loc(tuple(error["loc"]))
        if literal(error) and where in said:
            continue
        message = error["msg"].removeprefix("Value error, ")
        for part in message.split("\n"):  # a cross-field check reports all it found
            lines[part if where == "(top level)" and ": " in part else f"{where}: {part}"] = None
    return list(lines)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: YAML 1.2 says keys
    are unique, and PyYAML would silently keep the last (a second ``clusters:`` would drop
    the first list)."""


class _DuplicateKeyError(yaml.YAMLError):
    pass


def _unique_keys(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[object, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor below says what is wrong
            continue
        if first is not None:
            raise _DuplicateKeyError(f"line {line}: duplicate key {key!r} (first on line {first})")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        # a regular file, and bounded: a FIFO hung check-config for ever, /dev/zero read
        # until memory ran out (found by an attack)
        text = read_regular(path, FILE_MAX_BYTES).decode("utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not a YAML file (not UTF-8 text)"]) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except _DuplicateKeyError as exc:
        raise ConfigError(
            [f"{path}: {exc}: YAML keys are unique, and the first would be lost"]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}".replace("\n", " ")]) from exc
    except RecursionError:  # 20,000 nested brackets: no config is shaped so
        raise ConfigError([f"{path}: not a config: nested too deeply"]) from None
    except ValueError as exc:  # a number of more digits than Python converts (4,300)
        raise ConfigError([f"{path}: not a config: {str(exc).split(';')[0]}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: the top level must be a mapping"])
    if _larger_than(data, CONFIG_MAX_VALUES):
        raise ConfigError(
            [
                f"{path}: not a config: more than {CONFIG_MAX_VALUES:,} values, anchors counted "
                "each time they are used"
            ]
        )
    return data


CONFIG_MAX_VALUES = 200_000
"""Values a config may hold, a YAML alias counted each time it is used (validation expands
it): a 66 KB file of one anchored list of 2,000 URLs used by 500 clusters ran check-config
past 300 s at 1.8 GB (found by an attack). 2,000 clusters of 100 values each fit."""


def _larger_than(data: object, limit: int) -> bool:
    """Whether ``data`` holds more than ``limit`` values; stops as soon as it does (an alias
    of an alias of ... grows exponentially)."""
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def unknown_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """``WEIGHT_CONTROLLER_*`` variables that name no setting: pydantic-settings ignores them,
    so a misspelt one would silently change nothing. Names are matched as pydantic-settings
    matches them (case-insensitive; ``__`` into a group, whose own fields the model checks)."""
    environ = os.environ if environ is None else environ
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | {CONFIG_ENV}
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        if upper.split("__", 1)[0] in known:
            continue  # WEIGHT_CONTROLLER_SCRAPE__TIMEOUT: the group validates its own fields
        fields = ", ".join(sorted(Settings.model_fields))
        problems.append(f"environment: {name} names no setting (top level: {fields})")
    return problems


def _named_by_variable(lines: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Each problem in a setting a ``WEIGHT_CONTROLLER_*`` variable gave, with the variable's
    name: the field alone sent an operator looking in a file that had it right."""
    environ = os.environ if environ is None else environ
    given = {
        name[len(ENV_PREFIX) :].lower().replace("__", "."): name
        for name in environ
        if name.upper().startswith(ENV_PREFIX)
    }
    if not given:
        return lines
    named = []
    for line in lines:
        where = line.split(": ", 1)[0]
        by = [v for path, v in given.items() if _under(where, path)]
        named.append(f"{line} (from {max(by, key=len)})" if by else line)  # the nearest
    return named


def _under(where: str, path: str) -> bool:
    """``where`` (``clusters[0].name``, ``weights.floor``) is ``path`` or a field in it."""
    return where.startswith(path) and where[len(path) : len(path) + 1] in ("", ".", "[")


def build_settings(data: Mapping[str, Any], environment: bool = True) -> Settings:
    """Validate a mapping (plus the environment, unless ``environment`` is false: the demo's
    and the simulator's own clusters) into Settings, or raise ConfigError with every
    problem: field errors and cross-field ones together, one line each."""
    if environment and (unknown := unknown_environment()):
        raise ConfigError(unknown)
    try:
        return Settings(**data) if environment else GivenSettings(**data)
    except RecursionError:  # a WEIGHT_CONTROLLER_* variable of JSON nested past the parser
        raise ConfigError(["environment: a value nested too deeply to be a setting"]) from None
    except ValidationError as exc:
        found = _error_lines(exc)
        if environment:
            found = _named_by_variable(found)
        lines = list(dict.fromkeys([*found, *cross_field_problems(data)]))
        raise ConfigError(_shown(lines)) from None
    except SettingsError as exc:  # a malformed WEIGHT_CONTROLLER_* variable
        cause = exc.__cause__
        detail = f": {cause}" if cause is not None else ""
        raise ConfigError([f"environment: {exc}{detail}".replace("\n", " ")]) from None


ERRORS_SHOWN = 100


def _shown(lines: list[str]) -> list[str]:
    """At most ``ERRORS_SHOWN`` problems, then how many more: 20,000 bad URLs are one mistake
    made many times, and the terminal's scrollback is no place for it."""
    if len(lines) <= ERRORS_SHOWN:
        return lines
    return [*lines[:ERRORS_SHOWN], f"... and {len(lines) - ERRORS_SHOWN:,} more problems"]


def load_settings(path: Path | None = None) -> Settings:
    """The file named by ``path`` or ``$WEIGHT_CONTROLLER_CONFIG``, then the environment."""
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    data = read_yaml(path) if path is not None else {}
    return build_settings(data)
