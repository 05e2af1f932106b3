"""The search space, read from the config's `search_space` mapping."""

import optuna

REFERENCE_BATCH = 512  # lr in the config is meant for this effective batch


def suggest(trial: optuna.Trial, space: dict) -> dict:
    """Draw one value per key: categorical (static choices), int or float (low, high, log)."""
    values = {}
    for key, spec in space.items():
        if spec["type"] == "categorical":
            values[key] = trial.suggest_categorical(key, list(spec["choices"]))
        elif spec["type"] == "int":
            values[key] = trial.suggest_int(key, int(spec["low"]), int(spec["high"]),
                                            log=bool(spec.get("log", False)))
        else:
            values[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]),
                                              log=bool(spec.get("log", False)))
    return values


def trial_overrides(base, values: dict) -> tuple[dict, str | None]:
    """Config changes for a trial, or a reason to prune it before it runs."""
    micro = values.get("micro_batch_size", base.micro_batch_size)
    k = values.get("accumulation_steps", base.accumulation_steps)
    if base.max_effective_batch and micro * k > base.max_effective_batch:
        return values, f"effective batch {micro}x{k}={micro * k} > max {base.max_effective_batch}"
    changes = dict(values)
    if base.scale_lr_with_batch:
        changes["lr"] = values.get("lr", base.lr) * micro * k / REFERENCE_BATCH
    if base.model == "transformer" or changes.get("model") == "transformer":
        heads = changes.get("num_heads", base.num_heads)
        hidden = changes.get("hidden_size", base.hidden_size)
        if hidden % heads:
            return values, f"hidden_size {hidden} not divisible by num_heads {heads}"
    return changes, None
