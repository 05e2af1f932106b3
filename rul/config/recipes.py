"""The experiments/ recipes, and the command that trains a config again: the recipe file
closest to it plus `key=value` for every key that differs (where data and results live left
out)."""

import shlex
from pathlib import Path

import yaml

from rul.config.loading import load
from rul.config.training import TrainConfig, keys_with

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
PLACE_KEYS = set(keys_with("place"))  # where data and results live, not what is trained


def recipe_files() -> list[Path]:
    return sorted(p for p in EXPERIMENTS.glob("*.yaml") if not p.name.startswith("tune"))


def differences(config: TrainConfig, base: TrainConfig, ignore: set[str] = frozenset()) -> dict:
    """The keys `config` sets otherwise than `base` (where data and results live left out); a
    `data:` section whole, less the keys at their defaults."""
    mine, theirs = config.model_dump(), base.model_dump()
    found = {k: v for k, v in mine.items()
             if k not in PLACE_KEYS | set(ignore) and theirs.get(k) != v}
    if found.get("data") is not None:
        found["data"] = {k: v for k, v in found["data"].items()
                         if v != type(config.data).model_fields[k].default}
    return found


def closest_recipe(config: TrainConfig) -> tuple[str | None, dict]:
    """(experiments/<file>, the keys that differ from it): of the files that name a C-MAPSS
    subset, or describe a data set of their own, as `config` does, the one with the fewest
    differences; the seed counts as one. (None, the keys that differ from the defaults) when
    none does."""
    best = (None, None, differences(config, TrainConfig()))
    for path in recipe_files():
        recipe = load(path)
        if (recipe.data is None) != (config.data is None):
            continue  # a data section and a subset do not combine
        diff = differences(config, recipe)
        rank = (len(diff), path.name != "fd001.yaml", path.name)
        if best[0] is None or rank < best[0]:
            best = (rank, f"experiments/{path.name}", diff)
    return best[1], best[2]


def value_text(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip(
        ).removesuffix("...").strip()


def overrides_text(diff: dict) -> str:
    """`key=value ...`, each value one shell word (quoted where it must be)."""
    return " ".join(f"{k}={shlex.quote(value_text(v))}" for k, v in diff.items())


def train_command(config: TrainConfig, places: bool = False) -> str:
    """`rul train experiments/<closest>.yaml key=value ...`: the command that trains `config`
    again (given its data where it was; `places`: with where its data, store and checkpoints
    are, where the recipe says otherwise)."""
    file, diff = closest_recipe(config)
    if places:
        recipe = load(EXPERIMENTS.parent / file) if file else TrainConfig()
        diff.update({k: getattr(config, k) for k in sorted(PLACE_KEYS)
                     if getattr(config, k) != getattr(recipe, k)})
    return " ".join(part for part in ("rul train", file, overrides_text(diff)) if part)
