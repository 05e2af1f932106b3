"""The Results page's section "Engines still in service": what each `censored_training` rule
made of a fleet whose engines have not all failed, as tools/in_service_study.py recorded it in
docs/data/in_service.yaml."""

from pathlib import Path

import numpy as np
import yaml

from rul.reporting.markdown import table

GOAL = 0.5  # the lower-bound loss earns its place when it closes half the gap or more


def read_in_service(path: Path) -> dict | None:
    """The study's record, or None when it has not been run."""
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _mean_std(values: list[float], digits: int = 2) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "n/a"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


def _rule(row: dict) -> str:
    return (f"`censored_training: {row['overrides']['censored_training']}`"
            if "censored_training" in row["overrides"] else "FD001 itself")


def _by_rule(record: dict) -> dict:
    """Each row by its rule (`failure`: every engine run to failure)."""
    return {row["overrides"].get("censored_training", "failure"): row for row in record["rows"]}


def _test_means(record: dict) -> dict:
    """Each rule's mean test RMSE over the seeds ("failure": every engine run to failure)."""
    return {name: np.mean(row["test_rmse"]) for name, row in _by_rule(record).items()}


def _gap(record: dict) -> float:
    """The mean test RMSE lost by dropping the engines in service, against all run to
    failure."""
    means = _test_means(record)
    return means["dropped"] - means["failure"]


def gap_closed(record: dict, rule: str = "lower_bound") -> float:
    """The share of that gap `rule` closes (1: as good as every engine run to failure)."""
    means = _test_means(record)
    return (means["dropped"] - means[rule]) / _gap(record)


def _lower_on(record: dict, metric: str, rule: str, other: str) -> str:
    """`3 of 5`: the seeds on which `rule` scored lower than `other`."""
    rows = _by_rule(record)
    pairs = list(zip(rows[rule][metric], rows[other][metric], strict=True))
    return f"{sum(a < b for a, b in pairs)} of {len(pairs)}"


def in_service_section(record: dict | None) -> list[str]:
    if not record:
        return []
    cut = record["in_service"]
    low, high = (round(100 * f) for f in cut["life_seen"])
    table_rows = [[row["name"], _rule(row), _mean_std(row["test_rmse"]),
                   _mean_std(row["val_rmse"]), " / ".join(f"{v:.2f}" for v in row["test_rmse"])]
                  for row in record["rows"]]
    header = ["the engines in service", "rule", "test RMSE", "val RMSE", "test RMSE per seed"]
    closed, known = gap_closed(record), gap_closed(record, "known")
    verdict = (f"The lower-bound loss closes {100 * closed:.0f} % of it, against a goal of "
               f"{100 * GOAL:.0f} %" + (
                   "." if closed >= GOAL else
                   ": short of it, so the mode stays opt-in (`censored_training: known` "
                   "remains the default)."))
    seeds = record["rows"][0]["seeds"]
    return [
        "## Engines still in service", "",
        "In a real fleet most engines have not failed. Each one seen up to cycle T is a lower "
        "bound on its life: its RUL at cycle t exceeds T - t. `censored_training` says what "
        "such an engine teaches (see [Train on your own fleet](guides/fleet.md)): nothing "
        "(`dropped`); only its windows whose target the cap makes known (`known`, the "
        "default); or every window, the loss penalising a prediction below min(T - t, cap) "
        "and above the cap, never one between (`lower_bound`). Validation and the interval "
        "stay on engines that failed.", "",
        f"FD001 with {cut['engines']} of its {cut['of']} training engines cut off at a random "
        f"{low}-{high} % of their life and marked in service (drawn with seed "
        f"{cut['draw_seed']}), tested on NASA's 100 test units; `make train`'s recipe over "
        f"seeds {seeds[0]}-{seeds[-1]} (`rul evaluate`: each seed validates on its own split "
        "of the engines that failed, the same for the three rules; the reference, with twice "
        "as many failed engines, validates on more). Test figures are reported, never "
        "selected on.", "",
        *table(header, table_rows), "",
        f"The gap between dropping the engines in service and running every engine to failure "
        f"is {_gap(record):.2f} cycles of test RMSE; today's rule closes {100 * known:.0f} % "
        "of it. "
        f"{verdict} Seed by seed against today's rule, on the same validation engines, it "
        f"scores a lower validation RMSE on {_lower_on(record, 'val_rmse', 'lower_bound', 'known')}"
        f" seeds and a lower test RMSE on {_lower_on(record, 'test_rmse', 'lower_bound', 'known')}"
        ".", "",
        f"Measured with `{record['command']}` on {record['machine']}, commit "
        f"{record['commit']}{' (with local changes)' if record.get('dirty') else ''}, "
        f"{record['date']}.", ""]
