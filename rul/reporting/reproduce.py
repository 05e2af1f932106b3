"""The command that re-runs an evaluation: the experiments/ config closest to the evaluated
one (rul.config.recipes), plus `key=value` for every key that differs."""

from pathlib import Path

from rul.config.recipes import overrides_text


def evaluate_command(config_file: str | None, diff: dict, n_seeds: int) -> str:
    """`config_file` None: the keys alone (a data set of one's own without a recipe file)."""
    return " ".join(part for part in ("rul evaluate", config_file, f"--seeds {n_seeds}",
                                      overrides_text(diff)) if part)


def recipe_label(config_file: str | None, diff: dict) -> str:
    """e.g. fd001_b32_e150_cycle.yaml + ensemble=5 (the seed left out: the seeds column says)."""
    shown = {k: v for k, v in diff.items() if k != "seed"}
    name = Path(config_file).name if config_file else "the defaults"
    return name + (f" + {overrides_text(shown)}" if shown else "")
