"""Validation RMSE of logged models on the same truncation points, whatever their window.

A model's `val_rmse` averages over every full window of its validation engines, so models with
different windows are scored on different targets (a 40-cycle window has no prediction at
cycles 30-39). This scores each model at every cycle from --from on of the validation engines
of seed --seed's split, each prediction made from the engine's rows up to that cycle, exactly
as for a test unit (histories shorter than the window edge-padded, docs: Inputs, Short units).

It prints two scores: every cycle once (long engines weigh more) and test-like, each engine
once at truncation points drawn as the test units end (rul.evaluation.truncation, with
cycles before --from scored at --from), the way the test set weighs its units.

    python tools/truncation_val.py --seed 42 runs:/<run id>/model ... [--from 30]

(with MLFLOW_TRACKING_URI pointing at the store). docs: Results, Decisions (window 40).
"""

import argparse
import warnings

import mlflow
import numpy as np
import torch

from rul.data import load_subset
from rul.data.split import rows_of, split_units
from rul.evaluation.metrics import rmse
from rul.evaluation.truncation import truncation_weights
from rul.preprocessing.windows import last_windows
from rul.training.seeding import derive_seeds


def parts(inner):
    """(preprocessing, windows -> RUL) of a loaded pyfunc's inner model: the lean model
    (rul.serving.lean_pyfunc: ONNX members, averaged) or a torch one (its Preprocessor and
    network, as models logged before the lean runtime hold them)."""
    if hasattr(inner, "preprocessor"):
        model = inner.model.eval()  # in eval mode the network clamps to [0, rul_cap] itself

        def predict(windows):
            with torch.inference_mode():
                return model(torch.from_numpy(windows)).float().numpy().reshape(-1)

        return inner.preprocessor, predict
    lean = inner.model
    return lean.spec.preprocessing, lambda windows: lean.member_predictions(windows).mean(0)


def truncation_errors(inner, rows, first_cycle: int) -> tuple[np.ndarray, np.ndarray]:
    """(error, unit) of the prediction at every (engine, cycle >= first_cycle) of `rows`,
    against capped targets, each engine's cycles in order."""
    preprocessing, predict = parts(inner)
    windows, targets, units = [], [], []
    cap = preprocessing.rul_cap
    for _, unit in rows.groupby("unit", sort=False):
        values = preprocessing.transform(unit)  # causal: row t sees rows up to t only
        ids = unit["unit"].to_numpy()
        for t in range(first_cycle, len(unit) + 1):
            windows.append(last_windows(values[:t], ids[:t], preprocessing.window)[1][0])
            targets.append(min(len(unit) - t, cap))
            units.append(ids[0])
    return predict(np.stack(windows)) - np.asarray(targets, np.float64), np.asarray(units)


def truncation_rmse(inner, rows, first_cycle: int) -> tuple[float, int]:
    """RMSE over every (engine, cycle >= first_cycle) of `rows`, capped targets."""
    errors, _ = truncation_errors(inner, rows, first_cycle)
    return rmse(errors, 0.0), len(errors)


def test_like_rmse(errors: np.ndarray, units: np.ndarray, first_cycle: int, seed: int) -> float:
    """The RMSE of truncation_errors' `errors` with each engine counted once, at points drawn
    as the test units end (truncation_weights, its first point the cycle `first_cycle`),
    from `seed` (the split seed, as training's test-like validation draws them)."""
    return rmse(errors, 0.0, truncation_weights(units, first_cycle, seed))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="model URIs (runs:/..., models:/...)")
    parser.add_argument("--seed", type=int, required=True, help="the runs' seed (their split)")
    parser.add_argument("--from", dest="first", type=int, default=30, help="first cycle scored")
    parser.add_argument("--subset", default="FD001")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    subset = load_subset(args.subset, args.data_dir)
    split_seed = derive_seeds(args.seed).split
    _, val_units = split_units(subset.train["unit"], args.val_fraction, split_seed)
    rows = rows_of(subset.train, val_units)
    for uri in args.models:
        inner = mlflow.pyfunc.load_model(uri).unwrap_python_model()
        errors, units = truncation_errors(inner, rows, args.first)
        score = rmse(errors, 0.0)
        test_like = test_like_rmse(errors, units, args.first, split_seed)
        window = parts(inner)[0].window
        print(f"{uri}: window {window}, val RMSE {score:.3f} on {len(errors)} truncations "
              f"(cycles >= {args.first} of {len(val_units)} validation engines), "
              f"test-like {test_like:.3f}")


if __name__ == "__main__":
    main()
