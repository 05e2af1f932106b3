"""What limits a recipe's accuracy, read from its validation engines only.

For each logged model (a training run; `--parent` adds every seed of a `rul evaluate` run):

- its curves, from the run's per-epoch metrics: validation RMSE (of the weights it validates,
  the weight average when the recipe keeps one) and the training loss on the target's scale
  (RMSE in cycles, over the epoch's training windows with dropout on): the epoch where
  validation first came within 0.1 cycles of its best, and both curves at epochs 10, 20 and
  the last;
- its errors on the validation engines, each engine once at its test-like truncation points
  (as a test unit is scored), by true RUL (<= 25, 26-75, > 75 cycles, capped as the target
  is): each band's RMSE, mean signed error (positive: late) and share of the squared error.

Then the mean over models. Nothing here reads the test units.

    MLFLOW_TRACKING_URI=sqlite:///mlflow.db python tools/validation_limits.py \\
        --parent <evaluate run id> [RUN_ID ...]
"""

import math
import warnings

import numpy as np

from rul.data import load_subset
from rul.evaluation.intervals import TRUE_RUL_BANDS
from rul.evaluation.truncation import truncation_weights
from rul.tracking.metric_names import logged as logged_name

NEAR = 0.1  # cycles: "within this of its best"
EPOCHS = (10, 20)  # where the curves are read, beside the last epoch


def curves(client, run_id: str, rul_cap: float) -> dict:
    """Validation RMSE and training RMSE (cycles) per epoch, read from the run's history."""
    val = [m.value for m in sorted(client.get_metric_history(run_id, logged_name("val_rmse")),
                                   key=lambda m: m.step)]
    loss = [m.value for m in sorted(
        client.get_metric_history(run_id, logged_name("train_loss_epoch")), key=lambda m: m.step)]
    if not val or not loss:
        raise ValueError(f"run {run_id}: no per-epoch val/rmse or train/loss_epoch")
    # the loss is the MSE of RUL / the config's rul_cap (rul.plan.step_settings)
    train = [math.sqrt(v) * rul_cap for v in loss]
    best = min(val)
    return {"val": val, "train": train, "best": best, "best_epoch": val.index(best) + 1,
            "near_epoch": next(i for i, v in enumerate(val, 1) if v <= best + NEAR)}


def band_errors(predicted, true, weights) -> dict:
    """Test-like RMSE (each engine once), mean signed error and share of the squared error,
    overall and per true-RUL band."""
    error, w = predicted - true, weights / weights.sum()
    total = float(np.sum(w * error ** 2))
    found = {"rmse": math.sqrt(total)}
    for name, (low, high) in TRUE_RUL_BANDS.items():
        inside = (true >= low) & (true <= high)
        share = w[inside].sum()
        if share > 0:
            found[name] = {"rmse": math.sqrt(np.sum(w[inside] * error[inside] ** 2) / share),
                           "bias": float(np.sum(w[inside] * error[inside]) / share),
                           "points": float(share), "squared": float(
                               np.sum(w[inside] * error[inside] ** 2) / total)}
    return found


def limits(logged, client, subset) -> dict:
    windows, members = logged.validation(subset)
    predicted, true = members.mean(axis=0), windows.targets.astype(np.float64)
    cap = float(logged.preprocessor.rul_cap)
    return {"name": logged.run_name, "seed": logged.seed,
            "curves": curves(client, logged.run_id, cap),
            "bands": band_errors(predicted, true,
                                 truncation_weights(windows.units, windows.window,
                                                    logged.split_seed))}


def _at(curve: list, epoch: int) -> str:
    return f"{curve[epoch - 1]:.2f}" if epoch <= len(curve) else "-"


def report(models: list[dict]) -> str:
    bands = list(TRUE_RUL_BANDS)
    lines = ["## Curves (validation RMSE / training RMSE, cycles)", "",
             "| seed | run | epochs | best (epoch) | within 0.1 of best from | "
             + " | ".join(f"epoch {e}" for e in EPOCHS) + " | last |",
             "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in EPOCHS) + " | --- |"]
    for m in models:
        c = m["curves"]
        read = [f"{_at(c['val'], e)} / {_at(c['train'], e)}" for e in EPOCHS]
        lines.append(f"| {m['seed']} | {m['name']} | {len(c['val'])} | {c['best']:.2f} "
                     f"({c['best_epoch']}) | {c['near_epoch']} | " + " | ".join(read)
                     + f" | {c['val'][-1]:.2f} / {c['train'][-1]:.2f} |")
    last_gap = np.mean([m["curves"]["val"][-1] - m["curves"]["train"][-1] for m in models])
    lines += ["", f"Mean over {len(models)} models: within 0.1 of the best from epoch "
              f"{np.mean([m['curves']['near_epoch'] for m in models]):.1f}, best at epoch "
              f"{np.mean([m['curves']['best_epoch'] for m in models]):.1f}; at the last epoch "
              f"validation sits {last_gap:.2f} cycles above training.", "",
              "## Test-like validation errors by true RUL (each engine once)", "",
              "| seed | RMSE | " + " | ".join(f"{b}: RMSE / bias / share of error²"
                                          for b in bands) + " |",
              "| --- | --- | " + " | ".join("---" for _ in bands) + " |"]

    def cell(found):
        return (f"{found['rmse']:.2f} / {found['bias']:+.2f} / {100 * found['squared']:.0f} %"
                if found else "-")

    for m in models:
        lines.append(f"| {m['seed']} | {m['bands']['rmse']:.2f} | "
                     + " | ".join(cell(m["bands"].get(b)) for b in bands) + " |")
    mean = {b: {k: float(np.mean([m["bands"][b][k] for m in models if b in m["bands"]]))
                for k in ("rmse", "bias", "points", "squared")} for b in bands}
    lines += [f"| mean | {np.mean([m['bands']['rmse'] for m in models]):.2f} | "
              + " | ".join(cell(mean[b]) for b in bands) + " |", "",
              "Share of the test-like points per band: " + ", ".join(
                  f"{b} {100 * mean[b]['points']:.0f} %" for b in bands) + "."]
    return "\n".join(lines)


def main():
    from mlflow.tracking import MlflowClient

    from rul.tracking.logged_models import load_logged, log_report, named_runs, tool_arguments

    parser = tool_arguments(__doc__.splitlines()[0], "validation-limits")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    run_ids = named_runs(parser, args)
    subset = load_subset(args.subset, args.data_dir)
    client = MlflowClient()
    try:
        models = [limits(load_logged(r, client), client, subset) for r in run_ids]
    except ValueError as error:
        parser.exit(1, f"{error}\n")
    text = report(models)
    print(text)
    if args.log:
        print(f"\nkept as run {log_report(text, 'validation-limits', run_ids)}")


if __name__ == "__main__":
    main()
