"""Print a study's best trial as KEY=VALUE overrides, for `rul evaluate CONFIG $(...)`.

    python tools/study_best.py STORAGE STUDY_NAME

STORAGE as `rul tune --storage` takes it (a .journal file, sqlite:///..., a server URL). The
best trial is the one `rul tune` registers for a single objective (the lowest validation
RMSE; nothing read from the test set). Exit 1 with one line when the file, the study or a
completed trial is missing (a file is read, never created).
"""

import sys
from pathlib import Path

import optuna

from rul.tuning.storage import open_storage


def best_overrides(storage: str, study_name: str) -> list[str]:
    file = storage.removeprefix("sqlite:///").removeprefix("journal:")
    if "://" not in file and not Path(file).is_file():  # read a file, never create one
        raise ValueError(f"{storage}: no such file")
    opened = open_storage(storage, 1)  # one reader: any storage URL rul tune takes
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
    except KeyError:  # Optuna: no study of that name
        print(f"{argv[1]}: no such study in {argv[0]}", file=sys.stderr)
        return 1
    except ValueError as error:  # no such file; Optuna: no completed trial
        print(f"{argv[1]}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
