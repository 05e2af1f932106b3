"""Reading a config: a YAML file and `key=value` overrides in, a validated TrainConfig or
TuningConfig out; every problem becomes one line of a ConfigError that names where its value
came from: `<source>: <key>=<value>: <what is wrong>`."""

import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rul.config.data import DataSection
from rul.config.spelling import _did_you_mean
from rul.config.training import TrainConfig
from rul.config.tuning import (
    TUNING_KEYS,
    Categorical,
    FloatRange,
    IntRange,
    TuningConfig,
    _must_be,
)
from rul.config.values import _positive_int
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
    changes = _auto_keeps_the_batch(values, changes or {}, announce=changes_source is not None)
    merged = {**values, **changes}
    return _validate(TrainConfig, merged, merged,
                     _Origins(source, changes_source, set(values), set(changes)))


def build_tuning(values: dict, changes: dict | None = None, source: str = "config",
                 changes_source: str | None = None) -> TuningConfig:
    changes = _auto_keeps_the_batch(values, changes or {}, announce=changes_source is not None)
    merged = {**values, **changes}
    tuning = {k: v for k, v in merged.items() if k in TUNING_KEYS}
    train = {k: v for k, v in merged.items() if k not in TUNING_KEYS}
    return _validate(TuningConfig, {**tuning, "train": train}, merged,
                     _Origins(source, changes_source, set(values), set(changes)))


def _auto_keeps_the_batch(values: dict, changes: dict, announce: bool) -> dict:
    """`micro_batch_size=auto` as a change, with no effective_batch_size stated anywhere:
    the effective batch stays the one `values` (and the defaults) imply, micro x K, so that
    asking for the automatic split never changes the model. Said on stderr when `announce`."""
    if (changes.get("micro_batch_size") != "auto" or "effective_batch_size" in changes
            or values.get("effective_batch_size") is not None):
        return changes
    fields = TrainConfig.model_fields
    micro = values.get("micro_batch_size", fields["micro_batch_size"].default)
    k = values.get("accumulation_steps", fields["accumulation_steps"].default)
    if not (_positive_int(micro) and _positive_int(k)):
        return changes  # the file's own split is auto or invalid: its error says so
    if announce:
        print(f"micro_batch_size=auto keeps the effective batch of the config, {micro} x {k} = "
              f"{micro * k} (state effective_batch_size to change it)", file=sys.stderr)
    return {**changes, "effective_batch_size": micro * k}


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


# ------------------------------------------------------------------ errors


class _Origins:
    """Where each key's value came from: the file (or `config`: the defaults) or the
    overrides (the command line)."""

    def __init__(self, file: str, changes: str | None, written: set, changed: set):
        self.file, self.changes = file, changes or file
        self.written, self.changed = written - changed, changed

    def of_key(self, key) -> str:
        return self.changes if key in self.changed else self.file

    def of_rule(self, line: str) -> str:
        """A cross-field rule names its keys (`key=value`, the first one leading): the
        sources of those keys, the file's (or the defaults') when none was written."""
        named = {*re.findall(r"\b([a-z_]+)=", line), re.match(r"[a-z_]*", line).group()}
        sources = [self.file] if named & self.written else []
        if named & self.changed:
            sources.append(self.changes)
        return " and ".join(dict.fromkeys(sources)) or self.file


def _validate(model: type[BaseModel], data: dict, flat: dict, origins: _Origins):
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_explain(error, model, flat, origins)) from None


def _explain(error: ValidationError, model: type[BaseModel], flat: dict,
             origins: _Origins) -> str:
    """One line per problem, unknown keys first, each naming where its value came from (the
    file or the command line); never pydantic's own dump."""
    unknown, lines = [], []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        if loc[:1] == ("train",) and model is TuningConfig:
            loc = loc[1:]
        if item["type"] == "extra_forbidden" and len(loc) == 1:
            unknown.append(loc[0])
            continue
        if loc[:1] == ("data",) and len(loc) > 1 and item["type"] != "config_rule":
            line = _data_problem(loc[1:], item, flat.get("data"))
            source = origins.of_key("data")
        elif loc[:1] == ("search_space",) and len(loc) > 1:
            line = _space_problem(str(loc[1]), loc[2:], item, flat.get("search_space"))
            source = origins.of_key("search_space")
        elif item["type"] == "config_rule":
            line = item["msg"]
            source = origins.of_rule(line)
        else:
            key = loc[0]
            line = f"{key}={flat.get(key)!r}: {_must_be(key, item)}"
            source = origins.of_key(key)
        if f"{source}: {line}" not in lines:
            lines.append(f"{source}: {line}")
    by_source = {}
    for key in unknown:
        by_source.setdefault(origins.of_key(key), []).append(key)
    named = [line for source, keys in by_source.items()
             for line in _unknown_keys(keys, model, source)]
    return "\n".join(sorted(named, key=lambda line: "unknown key" not in line) + lines)


def _unknown_keys(keys: list, model: type[BaseModel], source: str) -> list[str]:
    lines = []
    if model is TrainConfig:
        tuning = [k for k in keys if k in TUNING_KEYS]
        keys = [k for k in keys if k not in TUNING_KEYS]
        if tuning:
            names = ", ".join(repr(k) for k in tuning)
            verb = "is a tuning key" if len(tuning) == 1 else "are tuning keys"
            lines.append(f"{source}: {names} {verb} used by `rul tune`, not by `rul train`")
        known = list(TrainConfig.model_fields)
    else:
        known = [*TrainConfig.model_fields, *TUNING_KEYS]
    if keys:
        hints = ", ".join(f"{k!r}{_did_you_mean(str(k), known)}" for k in keys)
        lines.insert(0, f"{source}: unknown key(s) {hints}")
    return lines


def _data_problem(loc: tuple, item: dict, data: Any) -> str:
    """One line about a key of the `data:` section: `data.<key>=<value>: what it must be`."""
    key = str(loc[0])
    if item["type"] == "extra_forbidden":
        return f"data: unknown key {key!r}{_did_you_mean(key, DataSection.model_fields)}"
    field = DataSection.model_fields.get(key)
    if item["type"] == "missing":
        return f"data.{key} is missing (data needs name, train and sensors)"
    value = data.get(key) if isinstance(data, dict) else None
    kind = field.description if field and field.description else None
    return f"data.{key}={value!r}: " + (f"must be {kind}" if kind else item["msg"])


# What a search-space entry that is not a distribution is told.
SPACE_HINT = "needs type categorical (choices) or int/float (low, high, optional log)"


def _space_problem(key: str, rest: tuple, item: dict, space: Any) -> str:
    spec_values = space.get(key) if isinstance(space, dict) else None
    where = f"search_space.{key}"
    if item["type"] == "config_rule":  # low/high order, log bounds
        return f"{where}: {item['msg']}"
    if len(rest) < 2:  # the entry itself: not a mapping, or no/unknown type
        return f"{where}: {SPACE_HINT}"
    kind, name = rest[0], rest[1]
    spec = {"categorical": Categorical, "int": IntRange, "float": FloatRange}[kind]
    if item["type"] == "missing":
        needs = "choices" if kind == "categorical" else "low, high and optional log"
        return f"{where}: {name} is missing ({kind} needs {needs})"
    if item["type"] == "extra_forbidden":
        return f"{where}: unknown key {name!r}{_did_you_mean(str(name), spec.model_fields)}"
    field = spec.model_fields[name]
    wanted = f"must be {field.description}" if field.description else item["msg"]
    given = spec_values.get(name, item["input"]) if isinstance(spec_values, dict) else None
    value = given if len(rest) > 2 else item["input"]  # inside a list: show the whole list
    return f"{where}: {name}={value!r}: {wanted}"
