"""What a finished study leaves on its parent MLflow run besides the trials table: Optuna's
own figures and, for a multi-objective study, the Pareto front as a table (printed by
`rul tune` and logged as `pareto_front.csv`).

Figures (optuna.visualization.matplotlib), under figures/: optimization history and parameter
importances (of val_rmse when there are several objectives), and the Pareto front when there
are several. A figure that cannot be drawn (too few completed trials, parameters that never
varied) is skipped with a log line and a `figure_skipped.<name>` tag; it never fails the study.
"""

import sys
import tempfile
import warnings
from pathlib import Path

import mlflow
import optuna
import pandas as pd
from mlflow.tracking import MlflowClient

from rul.tracking.metric_names import read
from rul.tuning.objectives import ACCURACY, accuracy_of, is_multi

PARETO_FILE = "pareto_front.csv"


def log_figures(study: optuna.Study, objectives) -> None:
    """Optuna's figures on the active (parent) run."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    figures = [("optimization_history.png", vis.plot_optimization_history, {}),
               ("param_importances.png", vis.plot_param_importances, {})]
    if is_multi(objectives):
        accuracy = {"target": lambda t: accuracy_of(t, objectives), "target_name": ACCURACY}
        figures = [(name, plot, accuracy) for name, plot, _ in figures]
        figures.append(("pareto_front.png", vis.plot_pareto_front,
                        {"target_names": list(objectives)}))
    for name, plot, options in figures:
        problem = _importance_problem(study) if plot is vis.plot_param_importances else None
        if problem:
            _skip(name, problem)
            continue
        try:
            with warnings.catch_warnings():  # matplotlib plots are marked experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                axes = plot(study, **options)
            mlflow.log_figure(axes.figure, f"figures/{name}")
            plt.close(axes.figure)
        except Exception as error:  # a figure never fails the study
            plt.close("all")
            _skip(name, str(error))


def _importance_problem(study: optuna.Study) -> str | None:
    """Why parameter importances would mean nothing (Optuna would draw equal bars)."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < 2:
        return f"parameter importances need at least 2 completed trials (have {len(done)})"
    names = {name for trial in done for name in trial.params}
    if not any(len({repr(t.params.get(name)) for t in done}) > 1 for name in names):
        return "parameter importances need a parameter that varies across completed trials"
    return None


def _skip(name: str, reason: str) -> None:
    mlflow.set_tag(f"figure_skipped.{name}", reason[:500])
    print(f"figure {name} skipped: {reason}", file=sys.stderr)


def pareto_table(study: optuna.Study, objectives) -> pd.DataFrame:
    """One row per trial of the Pareto front, best val_rmse first: its objectives, the
    effective batch and the micro-batch x K its run trained with, lr as trained (after any
    batch scaling), the sampled parameters and the trial's MLflow run."""
    client = MlflowClient()
    rows = []
    for trial in study.best_trials:
        run_id = trial.user_attrs.get("mlflow_run_id", "")
        metrics, params = {}, {}
        if run_id:
            run = client.get_run(run_id)
            metrics, params = run.data.metrics, run.data.params
        micro, k = (_split_value(metrics, params, key)
                    for key in ("micro_batch_size", "accumulation_steps"))
        rows.append({
            "trial": trial.number,
            **dict(zip(objectives, trial.values, strict=True)),
            "effective_batch": _int(_split_value(metrics, params, "effective_batch_size")),
            "micro_x_k": f"{_int(micro)}x{_int(k)}" if micro and k else "",
            "lr": float(params["lr"]) if "lr" in params else float("nan"),
            **{f"params_{name}": value for name, value in trial.params.items()},
            "mlflow_run_id": run_id,
        })
    table = pd.DataFrame(rows)
    return table.sort_values([ACCURACY, "trial"], ignore_index=True) if rows else table


def _split_value(metrics: dict, params: dict, key: str):
    """The run's last micro-batch size, accumulation steps or effective batch: a metric where
    it changed during the run (an out-of-memory back-off; every epoch in runs logged before
    constants became params), else its param."""
    value = read(metrics, key)
    if value is None and str(params.get(key, "")).isdigit():
        value = params[key]
    return value


def _int(value):
    return None if value is None else int(value)


def log_pareto_table(table: pd.DataFrame) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / PARETO_FILE
        table.to_csv(path, index=False)
        mlflow.log_artifact(str(path))


def format_pareto_table(table: pd.DataFrame, objectives) -> str:
    """The columns a person reads at the end of `rul tune`."""
    shown = table[["trial", *objectives, "effective_batch", "micro_x_k", "lr"]]
    formats = {"val_rmse": "{:.3f}".format, "samples_per_s": "{:,.0f}".format,
               "peak_memory_mb": "{:,.1f}".format, "lr": "{:.2e}".format}
    return shown.to_string(index=False, formatters=formats)
