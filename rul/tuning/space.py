"""The search space, read from the tuning config's typed `search_space` mapping."""

from collections.abc import Mapping

import optuna
from pydantic import TypeAdapter

from rul.config import Categorical, Dimension, IntRange, TuningConfig
from rul.models.spec import NETWORK_KINDS

REFERENCE_BATCH = 512  # lr in the config is meant for this effective batch
_SPACE = TypeAdapter(dict[str, Dimension])


def suggest(trial: optuna.Trial, space: Mapping) -> dict:
    """Draw one value per key: categorical (static choices), int or float (low, high, log).
    `space` holds Dimension models, or plain mappings of the same shape."""
    values = {}
    for key, spec in _SPACE.validate_python(dict(space)).items():
        if isinstance(spec, Categorical):
            values[key] = trial.suggest_categorical(key, list(spec.choices))
        elif isinstance(spec, IntRange):
            values[key] = trial.suggest_int(key, spec.low, spec.high, log=spec.log)
        else:
            values[key] = trial.suggest_float(key, spec.low, spec.high, log=spec.log)
    return values


def trial_overrides(tuning: TuningConfig, values: dict) -> tuple[dict, str | None]:
    """Training config changes for a trial, or a reason to prune it before it runs.

    A drawn effective_batch_size is the accuracy decision; the trial's micro-batch and K are
    then measured, never drawn: micro_batch_size becomes auto (see rul.training.micro_batch)."""
    base = tuning.train
    changes = dict(values)
    if "effective_batch_size" in values:
        b = values["effective_batch_size"]
        changes["micro_batch_size"] = "auto"
        described = f"effective batch {b}"
    else:
        micro = values.get("micro_batch_size", base.micro_batch_size)
        k = values.get("accumulation_steps", base.accumulation_steps)
        b = base.effective_batch_size if micro == "auto" else micro * k
        described = f"effective batch {micro}x{k}={b}"
    if tuning.max_effective_batch and b > tuning.max_effective_batch:
        return values, f"{described} > max {tuning.max_effective_batch}"
    if tuning.scale_lr_with_batch:
        changes["lr"] = values.get("lr", base.lr) * b / REFERENCE_BATCH
    trial = base.model_copy(update=changes)  # not validated: the kind's rule says why not
    if problem := NETWORK_KINDS[trial.model].problem(trial.architecture):
        return values, ": ".join(problem)
    return changes, None
