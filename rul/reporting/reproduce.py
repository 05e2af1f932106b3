"""The command that re-runs an evaluation: the experiments/ config closest to the evaluated
one, plus `key=value` for every key that differs."""

from pathlib import Path

import yaml

from rul import config as cfg
from rul.config.training import with_legacy_values

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
# Keys that say where data and results live, not what is trained.
PLACE_KEYS = {"data_dir", "tracking_uri", "experiment", "register", "run_name", "checkpoint_dir"}
# Keys a run logs beside the config: an evaluation's parent (seeds), a training run (its world
# and what the window cost its data; rul.tracking.run_logging.log_plan).
EXTRA_PARAMS = {"seeds", "world_size", "short_units_dropped", "windows_lost"}


def config_from_params(params: dict[str, str]) -> cfg.TrainConfig:
    """The evaluated TrainConfig rebuilt from a run's params (strings as MLflow keeps them)."""
    values = {}
    for key, value in params.items():  # a section (data:) was logged one param per key
        if key not in EXTRA_PARAMS:
            section, _, sub = key.partition(".")
            into = values.setdefault(section, {}) if sub else values
            into[sub or key] = yaml.safe_load(value)
    return cfg.build(with_legacy_values(values), source="params")


def recipe_files() -> list[Path]:
    return sorted(p for p in EXPERIMENTS.glob("*.yaml") if not p.name.startswith("tune"))


def differences(config: cfg.TrainConfig, base: cfg.TrainConfig,
                ignore: set[str] = frozenset()) -> dict:
    mine, theirs = config.model_dump(), base.model_dump()
    return {k: v for k, v in mine.items()
            if k not in PLACE_KEYS | set(ignore) and theirs.get(k) != v}


def closest_recipe(config: cfg.TrainConfig) -> tuple[str, dict]:
    """(experiments/<file>, the keys that differ from it): the file with the fewest
    differences; the seed counts as one."""
    best = None
    for path in recipe_files():
        diff = differences(config, cfg.load(path))
        rank = (len(diff), path.name != "fd001.yaml", path.name)
        if best is None or rank < best[0]:
            best = (rank, f"experiments/{path.name}", diff)
    return best[1], best[2]


def value_text(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def overrides_text(diff: dict) -> str:
    return " ".join(f"{k}={value_text(v)}" for k, v in diff.items())


def evaluate_command(config_file: str, diff: dict, n_seeds: int) -> str:
    extra = overrides_text(diff)
    return f"rul evaluate {config_file} --seeds {n_seeds}" + (f" {extra}" if extra else "")


def recipe_label(config_file: str, diff: dict) -> str:
    """e.g. fd001_b32_e150_cycle.yaml + ensemble=5 (the seed left out: the seeds column says)."""
    shown = {k: v for k, v in diff.items() if k != "seed"}
    name = Path(config_file).name
    return name + (f" + {overrides_text(shown)}" if shown else "")
