"""Reading a config: a YAML file and `key=value` overrides in, a validated TrainConfig or
TuningConfig out; every problem becomes one line of a ConfigError that names where its value
came from (rul.config.validation): `<source>: <key>=<value>: <what is wrong>`."""

from pathlib import Path
from typing import Any

import yaml

from rul.config.training import TrainConfig
from rul.config.tuning import TuningConfig
from rul.config.validation import validated
from rul.errors import ConfigError
from rul.files import CONFIG_LIMIT, refusal


def load(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> TrainConfig:
    """Read a YAML config (or none: defaults) and apply overrides ('key=value' strings)."""
    values, changes, source, changes_source = _read(path, overrides)
    return build(values, changes, source, changes_source)


def load_tuning(path: str | Path | None = None,
                overrides: list[str] | dict | None = None) -> TuningConfig:
    """Read a flat tuning YAML (training and tuning keys side by side) and apply overrides."""
    values, changes, source, changes_source = _read(path, overrides)
    return build_tuning(values, changes, source, changes_source)


def build(values: dict, changes: dict | None = None, source: str = "config",
          changes_source: str | None = None) -> TrainConfig:
    """`values` (from `source`) with `changes` (from `changes_source`, default `source`)
    applied; an error names the source of the key it is about."""
    return validated(TrainConfig, values, changes, source, changes_source)


def build_tuning(values: dict, changes: dict | None = None, source: str = "config",
                 changes_source: str | None = None) -> TuningConfig:
    """A flat tuning mapping (training and tuning keys side by side) with `changes`."""
    return validated(TuningConfig, values, changes, source, changes_source)


COMMAND_LINE = "command line"


def _read(path, overrides) -> tuple[dict, dict, str, str]:
    """(the file's values, the overrides, the name of each's source)."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        refused = refusal(path, CONFIG_LIMIT)
        if refused == "file not found":
            raise ConfigError(f"{path}: config file not found")
        if refused:
            raise ConfigError(f"{path}: {refused}")
        values = _yaml_mapping(path)
    if isinstance(overrides, dict):
        changes, changes_source = overrides, "overrides"
    else:
        # a key given again wins, so that scripts may append to a line of overrides
        changes = dict(_parse_override(item) for item in overrides or [])
        changes_source = COMMAND_LINE
    return values, changes, str(path) if path is not None else "config", changes_source


def _yaml_mapping(path: Path) -> dict:
    """The file's mapping; any problem is one line `file:line:column: what is wrong`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {error.start}: "
                          f"{error.reason})") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read ({error.strerror})") from None
    try:
        values = yaml.load(text, Loader=_UniqueKeys) or {}
    except yaml.MarkedYAMLError as error:
        raise ConfigError(_yaml_problem(path, error)) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    return values


class _UniqueKeys(yaml.SafeLoader):
    """safe_load's loader, but a key given twice in one mapping is an error (YAML requires
    unique keys; PyYAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    continue  # an unhashable key: SafeLoader's own error says so
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {seen[key]})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _yaml_problem(path: Path, error: yaml.MarkedYAMLError) -> str:
    mark = error.problem_mark or error.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    what = error.problem or error.context or "unreadable"
    context = error.context_mark
    if error.problem and error.context and context is not None and (
            context.line, context.column) != (mark.line, mark.column):
        what += f" ({error.context} that starts at {context.line + 1}:{context.column + 1})"
    elif error.problem and error.context:
        what += f" ({error.context})"
    return f"{where}: not valid YAML: {what}"


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"{COMMAND_LINE}: override {item!r} must look like key=value")
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError:
        return key.strip(), raw


