"""A config validated, or one line per problem: `<source>: <key>=<value>: <what is wrong>`,
each naming where its value came from (the file, the command line, a program's changes), never
pydantic's own dump. What `rul train`, `rul tune` and a config's `replace` share; it knows the
models it checks only through the one it is given (rul.config.training and rul.config.tuning
import it)."""

import re
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

from rul.config.data import DataSection
from rul.config.spelling import _did_you_mean
from rul.config.study import TUNING_KEYS, Categorical, FloatRange, IntRange
from rul.config.values import _positive_int
from rul.errors import ConfigError


def validated(model: type[BaseModel], values: dict, changes: dict | None = None,
              source: str = "config", changes_source: str | None = None):
    """`model` (TrainConfig or TuningConfig) of `values` (from `source`) with `changes` (from
    `changes_source`, default `source`) applied; an error names the source of the key it is
    about. A tuning config's training keys go to its `train`."""
    train = _training_model(model)
    changes = _auto_keeps_the_batch(train, values, changes or {},
                                    announce=changes_source is not None)
    merged = {**values, **changes}
    data = merged
    if train is not model:
        data = {k: v for k, v in merged.items() if k in TUNING_KEYS}
        data["train"] = {k: v for k, v in merged.items() if k not in TUNING_KEYS}
    origins = _Origins(source, changes_source, set(values), set(changes))
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_explain(error, model, merged, origins)) from None


def _training_model(model: type[BaseModel]) -> type[BaseModel]:
    """The training config's model: `model` itself, or a tuning config's `train`."""
    train = model.model_fields.get("train")
    return train.annotation if train is not None else model


def _auto_keeps_the_batch(train: type[BaseModel], values: dict, changes: dict,
                          announce: bool) -> dict:
    """`micro_batch_size=auto` as a change, with no effective_batch_size stated anywhere:
    the effective batch stays the one `values` (and the defaults) imply, micro x K, so that
    asking for the automatic split never changes the model. Said on stderr when `announce`."""
    if (changes.get("micro_batch_size") != "auto" or "effective_batch_size" in changes
            or values.get("effective_batch_size") is not None):
        return changes
    fields = train.model_fields
    micro = values.get("micro_batch_size", fields["micro_batch_size"].default)
    k = values.get("accumulation_steps", fields["accumulation_steps"].default)
    if not (_positive_int(micro) and _positive_int(k)):
        return changes  # the file's own split is auto or invalid: its error says so
    if announce:
        print(f"micro_batch_size=auto keeps the effective batch of the config, {micro} x {k} = "
              f"{micro * k} (state effective_batch_size to change it)", file=sys.stderr)
    return {**changes, "effective_batch_size": micro * k}


def must_be(model: type[BaseModel], key: str, item: dict) -> str:
    """What the value of a key of `model` (a training or tuning key) must be: a field
    validator's own message, else the field's description."""
    if item["type"] == "value_error":  # a field validator's own message
        return str(item["ctx"]["error"])
    field = _training_model(model).model_fields.get(key) or model.model_fields.get(key)
    return f"must be {field.description}" if field and field.description else item["msg"]


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


def _explain(error: ValidationError, model: type[BaseModel], flat: dict,
             origins: _Origins) -> str:
    """One line per problem, unknown keys first, each naming where its value came from (the
    file or the command line); never pydantic's own dump."""
    unknown, lines = [], []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        if loc[:1] == ("train",) and _training_model(model) is not model:
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
            line = f"{key}={flat.get(key)!r}: {must_be(model, key, item)}"
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
    train = _training_model(model)
    if train is model:
        tuning = [k for k in keys if k in TUNING_KEYS]
        keys = [k for k in keys if k not in TUNING_KEYS]
        if tuning:
            names = ", ".join(repr(k) for k in tuning)
            verb = "is a tuning key" if len(tuning) == 1 else "are tuning keys"
            lines.append(f"{source}: {names} {verb} used by `rul tune`, not by `rul train`")
        known = list(train.model_fields)
    else:
        known = [*train.model_fields, *TUNING_KEYS]
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
