"""Engines still in service: what each `censored_training` rule makes of them, on FD001.

Half of FD001's 100 training engines (drawn with --draw-seed) are cut off at a random 30-80 %
of their life and marked in service, as a fleet whose engines have not all failed; the test
is NASA's 100 test units. `make train`'s recipe is evaluated over --seeds seeds (`rul
evaluate`: each seed its own validation split of the engines that failed) four ways:

- censored engines dropped (censored_training: dropped);
- today's rule (known: only their windows whose target the cap makes known);
- the lower-bound loss (lower_bound: every window, its target a range);
- every engine run to failure (FD001 itself: the reference).

    .venv/bin/python tools/in_service_study.py [--seeds 5] [--jobs 2] [--work in-service-study]
        [KEY=VALUE ...]   # overrides for every row, e.g. epochs=2 for a quick look

writes the table, the evaluations' store (WORK/mlflow.db) and docs/data/in_service.yaml,
which `make report` renders as the Results page's section "Engines still in service".
"""

import argparse
import shlex
import subprocess
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from rul import config as cfg
from rul.data import load_subset
from rul.data.schema import INFORMATIVE_SENSORS, SETTING_COLUMNS
from rul.data.sources import cmapss_file
from rul.data.tables import IgnoredColumnsWarning
from rul.machine import machine_tags
from rul.reporting.records import machine_text
from rul.workflows.evaluate import evaluate_seeds

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "data" / "in_service.yaml"
LIFE_SEEN = (0.3, 0.8)  # where an engine in service was last seen, as a share of its life
ROWS = [("censored engines dropped", {"censored_training": "dropped"}),
        ("today's rule (known targets)", {"censored_training": "known"}),
        ("the lower-bound loss", {"censored_training": "lower_bound"}),
        ("every engine run to failure", None)]
METRICS = ("test_rmse", "val_rmse", "test_interval_coverage", "seconds")


def write_fleet(folder: Path, draw_seed: int) -> tuple[Path, list[int]]:
    """FD001's training table with half of its engines cut off and marked `in_service`."""
    train = load_subset("FD001").train
    rng = np.random.default_rng(draw_seed)
    units = np.unique(train["unit"])
    censored = sorted(int(u) for u in rng.choice(units, len(units) // 2, replace=False))
    life = train.groupby("unit")["cycle"].transform("max")
    seen = dict(zip(censored, rng.uniform(*LIFE_SEEN, len(censored)), strict=True))
    fraction = train["unit"].map(seen).fillna(1.0)
    kept = train[train["cycle"] <= np.maximum(np.round(fraction * life), 1)]
    path = folder / "engines.csv"
    kept.assign(in_service=kept["unit"].isin(censored)).to_csv(path, index=False)
    return path, censored


def row_config(table: Path, changes: dict | None, store: str, extra: list[str]):
    common = [f"tracking_uri={store}", *extra]
    if changes is None:
        return cfg.load(None, [*common, "subset=FD001"])
    section = {"name": "fd001-in-service", "train": str(table),
               "test": str(cmapss_file("test_FD001.txt")),
               "test_rul": str(cmapss_file("RUL_FD001.txt")),
               "settings": list(SETTING_COLUMNS), "sensors": list(INFORMATIVE_SENSORS),
               "informative": list(INFORMATIVE_SENSORS), "conditions": 1,
               "censored_column": "in_service"}
    return cfg.load(None, [*common, *(f"{k}={v}" for k, v in changes.items()),
                           f"data={yaml.safe_dump(section, default_flow_style=True).strip()}"])


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True
                          ).stdout.strip()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--draw-seed", type=int, default=0)
    parser.add_argument("--work", default="in-service-study")
    parser.add_argument("--record", default=str(RECORD))
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", IgnoredColumnsWarning)  # the constant sensors: unread
    work = Path(args.work).absolute()
    work.mkdir(exist_ok=True)
    commit, dirty = _git("rev-parse", "--short", "HEAD"), bool(_git("status", "--porcelain"))
    table, censored = write_fleet(work, args.draw_seed)
    store = f"sqlite:///{work / 'mlflow.db'}"
    rows = []
    for name, changes in ROWS:
        print(f"== {name}", flush=True)
        config = row_config(table, changes, store, args.overrides)
        evaluation = evaluate_seeds(config, args.seeds, args.jobs, progress=False)
        rows.append({"name": name, "overrides": changes or {"subset": "FD001"},
                     "run": evaluation.parent_run_id,
                     "seeds": [int(r["seed"]) for r in evaluation.rows],
                     **{m: [round(float(r[m]), 3) for r in evaluation.rows]
                        for m in METRICS if all(m in r for r in evaluation.rows)}})
    record = {
        "command": shlex.join(["python", "tools/in_service_study.py", *argv]),
        "machine": machine_text(machine_tags()), "commit": commit, "dirty": dirty,  # at start
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "in_service": {"engines": len(censored), "of": 100, "life_seen": list(LIFE_SEEN),
                       "draw_seed": args.draw_seed, "units": censored},
        "rows": rows}
    Path(args.record).write_text(
        "# Engines still in service: tools/in_service_study.py's record, rendered by `make "
        "report`\n# (docs/results.md, Engines still in service).\n"
        + yaml.safe_dump(record, sort_keys=False, width=100, default_flow_style=None))
    print(f"wrote {args.record}")


if __name__ == "__main__":
    main(sys.argv[1:])
