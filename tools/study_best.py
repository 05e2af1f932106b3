"""Print a study's best trial as KEY=VALUE overrides, for `rul evaluate CONFIG $(...)`.

    python tools/study_best.py STORAGE STUDY_NAME

STORAGE as `rul tune --storage` takes it (a .journal file, sqlite:///..., a server URL). The
best trial is the one `rul tune` registers for a single objective (the lowest validation
RMSE; nothing read from the test set). Exit 1 with one line when the study has no completed trial.
"""

import sys

import optuna

from rul.tuning.storage import is_journal, open_storage


def best_overrides(storage: str, study_name: str) -> list[str]:
    opened = open_storage(storage, 2 if is_journal(storage) else 1)
    study = optuna.load_study(study_name=study_name, storage=opened)
    if len(study.directions) != 1:
        raise ValueError("a study of several objectives: pick from its Pareto front "
                         "(rul tune prints it)")
    best = study.best_trial
    return [f"{key}={value}" for key, value in sorted(best.params.items())]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        print(" ".join(best_overrides(*argv)))
    except ValueError as error:  # Optuna: no completed trial
        print(f"{argv[1]}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
