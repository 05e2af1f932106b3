"""What the engine's age costs when the counter is not what training saw: FD001 test RMSE of
logged models with every test unit's counter offset (+25, +50 cycles) and with its record
starting 25 or 50 cycles late, renumbered from 1 (rul.evaluation.age), beside the age-only
baseline; and the errors by age bucket as recorded.

Models are grouped by track (sensors, sensors+age) and by `late_start_max` (training with late
starts), one mean +- std per group over its models (seeds). A late start drops the test units
with no more than that many rows; each scenario is scored on the units it keeps, and the
table gives the same units as recorded beside it.

    MLFLOW_TRACKING_URI=sqlite:///mlflow.db python tools/age_offsets.py \\
        --parent <rul evaluate run, sensors> --parent <rul evaluate run, age> [RUN_ID ...]
"""

import warnings
from collections import defaultdict

import numpy as np

from rul.data import load_subset
from rul.evaluation.age import SCENARIOS, AgeOnly, errors_by_age, last_ages, perturbed
from rul.evaluation.metrics import rmse
from rul.preprocessing.target import cap_rul


def group_of(logged) -> str:
    late = int(logged.params.get("late_start_max", 0))
    kind = f", ensemble of {len(logged.networks)}" if len(logged.networks) > 1 else ""
    return logged.track + (f", trained with late starts 0-{late}" if late else "") + kind


def scenario_scores(logged, subset) -> dict[str, dict]:
    """Per scenario: RMSE on the units it keeps, the same units as recorded, their count."""
    true = cap_rul(np.asarray(subset.test_rul, dtype=np.float64), logged.preprocessor.rul_cap)
    truth = dict(zip(np.unique(subset.test["unit"]), true))
    units, recorded = logged.last_cycle(subset.test)
    recorded = dict(zip(units, recorded.mean(axis=0)))
    found = {}
    for scenario in SCENARIOS:
        rows, _ = perturbed(subset.test, scenario)
        kept, predicted = logged.last_cycle(rows)
        target = np.array([truth[u] for u in kept])
        found[scenario] = {"rmse": rmse(predicted.mean(axis=0), target),
                           "same_units": rmse([recorded[u] for u in kept], target),
                           "units": len(kept)}
    return found


def baseline_scores(subset, cap: float) -> dict[str, dict]:
    """The age-only predictor (fitted on every training engine) under each scenario."""
    model = AgeOnly.fit(subset.train, cap)
    true = cap_rul(np.asarray(subset.test_rul, dtype=np.float64), cap)
    truth = dict(zip(np.unique(subset.test["unit"]), true))
    found = {}
    for scenario in SCENARIOS:
        rows, _ = perturbed(subset.test, scenario)
        ages = last_ages(rows)
        found[scenario] = rmse(model.predict(ages.to_numpy()), [truth[u] for u in ages.index])
    return found


def mean_std(values) -> str:
    values = np.asarray(values, dtype=np.float64)
    return (f"{values.mean():.2f} ± {values.std(ddof=1):.2f}" if len(values) > 1
            else f"{values.mean():.2f}")


def offset_table(groups: dict[str, list[dict]], baseline: dict[str, float]) -> str:
    names = sorted(groups)
    header = ["test records", "units", *(f"{g} ({len(groups[g])})" for g in names),
              "age only"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for scenario in SCENARIOS:
        cells = []
        for g in names:
            scores = [s[scenario] for s in groups[g]]
            cell = mean_std([s["rmse"] for s in scores])
            if scenario.startswith("starts"):
                cell += f" (as recorded {mean_std([s['same_units'] for s in scores])})"
            cells.append(cell)
        units = groups[names[0]][0][scenario]["units"]
        lines.append(f"| {scenario} | {units} | " + " | ".join(cells)
                     + f" | {baseline[scenario]:.2f} |")
    return "\n".join(lines)


def age_table(by_group: dict[str, list[list[dict]]]) -> str:
    names = sorted(by_group)
    buckets = [row["ages"] for row in by_group[names[0]][0]]
    units = [row["units"] for row in by_group[names[0]][0]]
    header = ["age at the last cycle", "units",
              *(f"{g}: RMSE / bias" for g in names)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for i, (bucket, n) in enumerate(zip(buckets, units)):
        cells = [f"{np.mean([m[i]['rmse'] for m in by_group[g]]):.2f} / "
                 f"{np.mean([m[i]['bias'] for m in by_group[g]]):+.2f}" for g in names]
        lines.append(f"| {bucket} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    from rul.tracking.logged_models import load_logged, log_report, named_runs, tool_arguments

    parser = tool_arguments(__doc__.splitlines()[0], "age-offsets")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    run_ids = named_runs(parser, args)
    subset = load_subset(args.subset, args.data_dir)
    groups, ages = defaultdict(list), defaultdict(list)
    cap = None
    for run_id in run_ids:
        logged = load_logged(run_id)
        cap = logged.preprocessor.rul_cap
        groups[group_of(logged)].append(scenario_scores(logged, subset))
        units, predicted = logged.last_cycle(subset.test)
        true = cap_rul(np.asarray(subset.test_rul, dtype=np.float64), cap)
        ages[group_of(logged)].append(errors_by_age(predicted.mean(axis=0), true,
                                                    last_ages(subset.test).loc[units]))
    text = ("## FD001 test RMSE when the counter is not what training saw (mean ± std over "
            "models)\n\n" + offset_table(groups, baseline_scores(subset, cap))
            + "\n\n## Errors by age (test units as recorded; mean over models)\n\n"
            + age_table(ages))
    print(text)
    if args.log:
        print(f"\nkept as run {log_report(text, 'age-offsets', run_ids)} (age-offsets)")


if __name__ == "__main__":
    main()
