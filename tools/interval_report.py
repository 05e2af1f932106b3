"""Prediction intervals and failure probabilities of logged models, measured.

For each logged model (a training or a shared-split ensemble run; `--parent` adds every seed
of a `rul evaluate` run) the validation engines of its split are rebuilt and predicted at
every truncation point, and the interval is calibrated on them exactly as training does now
(rul.evaluation.intervals.fit_interval; a model logged before keeps its stored interval, this
recalibrates). Then, on the validation engines, each left out in turn (calibrated on the
others, scored on its test-like truncation points), and on the FD001 test units (reported
only, never calibrated on):

- per model, its validation RMSE over every full window (as training reports it) and
  test-like (each validation engine once, at its truncation points, as a test unit counts);
- coverage and mean width, over the units and per true-RUL band (<= 25, 26-75, > 75 cycles),
  per model and as the mean over models of one track and kind, beside a bound: the same bands
  fitted on the test units themselves, the narrowest any calibration could make them;
- per engine: each held-out validation engine's coverage, each test unit's over the models;
- the reliability of p_fail_within: predictions pooled per track and kind, in buckets of the
  predicted probability, against the share that failed within the horizon, and its Brier
  score, on the test units and on the validation engines left out in turn.

--study compares calibration methods on the left-out validation engines only (how the
method was chosen): every window with one width (before), test-like weights with one width,
and Mondrian bands by predicted RUL with other edges; ensembles also a width scaled by the
members' spread.

    MLFLOW_TRACKING_URI=sqlite:///mlflow.db python tools/interval_report.py \\
        --parent <evaluate run id> [RUN_ID ...] [--horizon 20] [--study]
"""

import warnings
from collections import defaultdict

import numpy as np

from rul.data import load_subset
from rul.evaluation.conformal import (
    DEFAULT_HORIZON,
    Interval,
    Spans,
    Weighting,
    fit_banded,
    fit_conformal,
    weighted_quantile,
)
from rul.evaluation.intervals import (
    BAND_EDGES,
    TAIL_SHARE,
    TRUE_RUL_BANDS,
    CalibrationSet,
    calibration_level,
    fit_interval,
    interval_metrics,
)
from rul.evaluation.metrics import rmse
from rul.evaluation.truncation import truncation_weights
from rul.preprocessing.target import cap_rul

BUCKETS = (0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0)  # predicted-probability buckets [low, high)


def scored(logged, subset) -> dict:
    """What a logged model predicts: validation windows (mean and spread over members) and
    the test units' last cycles."""
    windows, members = logged.validation(subset)
    units, test = logged.last_cycle(subset.test)
    true = np.asarray(subset.test_rul, dtype=np.float64)
    return {"name": logged.run_name, "run_id": logged.run_id, "seed": logged.seed,
            "split_seed": logged.split_seed, "track": logged.track, "members": len(members),
            "cap": float(logged.preprocessor.rul_cap),
            "val": CalibrationSet.of(members.mean(axis=0), windows),
            "val_spread": members.std(axis=0),
            "test_units": units, "test_predicted": test.mean(axis=0),
            "test_spread": test.std(axis=0), "test_true": true,
            "test_capped": cap_rul(true, logged.preprocessor.rul_cap)}


def leave_one_engine_out(model: dict, fit, horizon: float) -> list[dict]:
    """Each validation engine scored on its test-like truncation points by `fit` calibrated
    on the others: its weights, coverage, width, true-RUL band and p_fail per point."""
    val = model["val"]
    weights = truncation_weights(val.units, val.window, model["split_seed"])
    found = []
    for engine in np.unique(val.units):
        out, held = val.units != engine, val.units == engine
        calibration = CalibrationSet(val.predicted[out], val.targets[out], val.units[out],
                                     val.window)
        interval, spread = fit(calibration, weights[out], model["val_spread"][out],
                               model["cap"])
        predicted, true = val.predicted[held], val.targets[held]
        lower, upper = interval.bounds(predicted, high=model["cap"],
                                       **spread(model["val_spread"][held]))
        point = {"engine": engine, "weight": weights[held] / weights[held].sum(),
                 "covered": (lower <= true) & (true <= upper), "width": upper - lower,
                 "true": true}
        if interval.method == "banded":
            point["p_fail"] = interval.failure_probability(predicted, horizon)
            point["failed"] = true <= horizon
        found.append(point)
    return found


def validation_rmse(model: dict) -> tuple[float, float]:
    """The model's validation RMSE over every full window (each window once, as training
    reports it) and test-like (each engine once, at its truncation points, as the test units
    are scored): recipes with the same windows compared as the test would see them."""
    val = model["val"]
    weights = truncation_weights(val.units, val.window, model["split_seed"])
    return rmse(val.predicted, val.targets), rmse(val.predicted, val.targets, weights)


def validation_brier(points: list[dict]) -> float:
    """The Brier score of p_fail_within on left-out validation engines' points, each engine
    counted once (its points weighted as the test units are cut off)."""
    return float(np.average(np.concatenate([(p["p_fail"] - p["failed"]) ** 2 for p in points]),
                            weights=np.concatenate([p["weight"] for p in points])))


def summarize_points(points: list[dict]) -> dict:
    """Coverage and width over engines (each counts once) and per true-RUL band."""
    w = np.concatenate([p["weight"] for p in points])
    covered = np.concatenate([p["covered"] for p in points])
    width = np.concatenate([p["width"] for p in points])
    true = np.concatenate([p["true"] for p in points])
    found = {"coverage": np.sum(w * covered) / w.sum(), "width": np.sum(w * width) / w.sum()}
    for name, (low, high) in TRUE_RUL_BANDS.items():
        inside = (true >= low) & (true <= high) & (w > 0)
        if inside.any():
            found[f"coverage_{name}"] = np.sum((w * covered)[inside]) / w[inside].sum()
            found[f"width_{name}"] = np.sum((w * width)[inside]) / w[inside].sum()
    per_engine = [np.sum(p["weight"] * p["covered"]) for p in points]
    found["engine_min"], found["engine_median"] = min(per_engine), float(np.median(per_engine))
    return found


# ------------------------------------------------------------------ calibration methods


def shipped(calibration, weights, spread, cap):
    """What training calibrates now (rul.evaluation.intervals.fit_interval), on `weights`."""
    return banded(BAND_EDGES, TAIL_SHARE, shortest=True)(calibration, weights, spread, cap)


def _no_spread(spread):
    return {}


def every_window(calibration, weights, spread, cap):
    """Before: |error| of every window, one width."""
    return fit_conformal(calibration.predicted - calibration.targets, 0.9), _no_spread


def test_like_absolute(calibration, weights, spread, cap):
    q = weighted_quantile(np.abs(calibration.predicted - calibration.targets), weights, 0.9)
    return Interval(0.9, q, len(weights)), _no_spread


def banded(edges, tail_share=1.0, shortest=False):
    """Mondrian bands by predicted RUL, each band's bounds its central span of the errors or
    (`shortest`) its narrowest once clipped to [0, cap]."""
    def fit(calibration, weights, spread, cap):
        return fit_banded(calibration.predicted, calibration.targets, 0.9, edges,
                          Weighting(weights, calibration.units),
                          Spans(calibration_level(0.9, tail_share), shortest, cap)), _no_spread
    return fit


def scaled(floor):
    """|error| / (members' spread + floor), one quantile: each prediction its own width."""
    def fit(calibration, weights, spread, cap):
        score = np.abs(calibration.predicted - calibration.targets) / (spread + floor)
        return (Interval(0.9, weighted_quantile(score, weights, 0.9), len(weights), "scaled"),
                lambda s: {"spread": s + floor})
    return fit


STUDY = {
    "every window, one width (before)": every_window,
    "test-like, one width": test_like_absolute,
    "test-like, signed, one band": banded(()),
    "test-like, bands 25/75": banded((25.0, 75.0)),
    "test-like, bands 25/50/75/100": banded((25.0, 50.0, 75.0, 100.0)),
    "test-like, bands 25/50/75/100/115": banded((25.0, 50.0, 75.0, 100.0, 115.0)),
    "test-like, bands of 20 cycles": banded((20.0, 40.0, 60.0, 80.0, 100.0)),
    "test-like, bands of 10 cycles": banded(tuple(float(e) for e in range(10, 121, 10))),
    **{f"test-like, bands 25/50/75/100, tails x {share}": banded((25.0, 50.0, 75.0, 100.0),
                                                                 share)
       for share in (0.9, 0.8, 0.7, 0.6)},
    **{f"test-like, bands 25/75, tails x {share}": banded((25.0, 75.0), share)
       for share in (0.8, 0.7)},
    **{f"test-like, bands 25/50/75/100, shortest span, tails x {share}":
       banded((25.0, 50.0, 75.0, 100.0), share, shortest=True) for share in (1.0, 0.8, 0.6)},
    f"shipped (bands {'/'.join(f'{e:g}' for e in BAND_EDGES)}, shortest span, tails x "
    f"{TAIL_SHARE})": shipped,
}
STUDY_ENSEMBLE = {
    "test-like, scaled by spread + 1": scaled(1.0),
    "test-like, scaled by spread + 4": scaled(4.0),
}


# ------------------------------------------------------------------ tables

REPORTED = ("coverage", "coverage_rul_le25", "coverage_rul_26_75", "coverage_rul_gt75",
            "width", "width_rul_le25", "width_rul_26_75", "width_rul_gt75")


def markdown(header: list[str], rows: list[list]) -> str:
    def cell(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def percent_or_cycles(key: str, value: float) -> str:
    return f"{100 * value:.1f} %" if key.startswith("coverage") or key.startswith(
        "engine") else f"{value:.1f}"


def reliability(p_fail: np.ndarray, failed: np.ndarray, buckets=BUCKETS,
                weights=None) -> list[list]:
    """Rows: bucket, predictions in it (their total weight when weighted), mean predicted
    probability, observed failure share."""
    weights = np.ones(len(p_fail)) if weights is None else np.asarray(weights)
    rows = []
    for low, high in zip(buckets[:-1], buckets[1:]):
        inside = (p_fail >= low) & ((p_fail < high) if high < 1 else (p_fail <= high))
        inside &= weights > 0
        if inside.any():
            w = weights[inside]
            rows.append([f"{low:.2f}-{high:.2f}",
                         int(inside.sum()) if np.all(weights == 1) else f"{w.sum():.1f}",
                         f"{np.average(p_fail[inside], weights=w):.3f}",
                         f"{np.average(failed[inside], weights=w):.3f}"])
    return rows


def fitted_on_test(model: dict) -> dict:
    """The shipped bands fitted on the test units themselves, scored on them: how narrow a
    90 % banded interval of this model could be at best. A bound for reading the widths, never
    a model's interval (nothing is selected on the test units)."""
    interval = fit_banded(model["test_predicted"], model["test_capped"], 0.9, BAND_EDGES,
                          spans=Spans(0.9, shortest=True, high=model["cap"]))
    return interval_metrics(interval, model["test_predicted"], model["test_capped"],
                            model["cap"])


def report(models: list[dict], horizon: float) -> str:
    out = []
    groups = defaultdict(list)
    per_model = []
    for m in models:
        interval = fit_interval(m["val"], 0.9, m["split_seed"], m["cap"])
        test = interval_metrics(interval, m["test_predicted"], m["test_capped"], m["cap"],
                                horizon)
        m["test_lower"], m["test_upper"] = interval.bounds(m["test_predicted"], high=m["cap"])
        m["test_p_fail"] = interval.failure_probability(m["test_predicted"], horizon)
        points = leave_one_engine_out(m, shipped, horizon)
        m["val_points"] = points
        val = summarize_points(points)
        kind = "ensemble" if m["members"] > 1 else "single"
        groups[(m["track"], kind)].append((test, val, fitted_on_test(m)))
        rmse_windows, rmse_test_like = validation_rmse(m)
        per_model.append([m["track"], kind, m["seed"], m["name"],
                          f"{rmse_windows:.2f}", f"{rmse_test_like:.2f}",
                          *(percent_or_cycles(k, test[k]) for k in REPORTED),
                          f"{test['p_fail_brier']:.3f}",
                          percent_or_cycles("coverage", val["coverage"]),
                          percent_or_cycles("engine_min", val["engine_min"])])
    header = ["track", "kind", "seed", "run", "val RMSE", "val RMSE test-like",
              "test coverage", "<= 25", "26-75", "> 75", "test width", "<= 25", "26-75", "> 75"]
    out.append("## Per model (test units; validation engines left out in turn)\n")
    out.append(markdown([*header, f"Brier p_fail({horizon:g})", "val coverage",
                         "val worst engine"], per_model))
    out.append("\n## Mean over models (test units, then validation engines left out)\n")
    rows = []
    for (track, kind), pairs in sorted(groups.items()):
        for where, index in (("test", 0), ("validation", 1), ("test, fitted on them: bound", 2)):
            mean = {k: np.mean([p[index][k] for p in pairs]) for k in REPORTED}
            rows.append([track, kind, len(pairs), where,
                         *(percent_or_cycles(k, mean[k]) for k in REPORTED)])
    out.append(markdown(["track", "kind", "models", "units", "coverage", "<= 25", "26-75",
                         "> 75", "width", "<= 25", "26-75", "> 75"], rows))
    out.append("\nThe bound rows are no method: the same bands fitted on the test units "
               "themselves (each band's shortest span of their errors holding 90 % of them). "
               "No interval of this form (one pair of offsets per band) that covers 90 % of "
               "the test units in each band is narrower on average, however it is calibrated.")
    out.append(f"\n## Reliability of p_fail_within (horizon {horizon:g} cycles), test units "
               "pooled over models\n")
    for (track, kind) in sorted(groups):
        chosen = [m for m in models if (m["track"], "ensemble" if m["members"] > 1
                                        else "single") == (track, kind)]
        p = np.concatenate([m["test_p_fail"] for m in chosen])
        failed = np.concatenate([m["test_true"] <= horizon for m in chosen])
        out.append(f"\n{track}, {kind} ({len(chosen)} models x {len(chosen[0]['test_true'])} "
                   f"units; {failed.mean():.1%} failed within {horizon:g}; Brier "
                   f"{np.mean((p - failed) ** 2):.4f}, always the base rate "
                   f"{np.mean((failed.mean() - failed) ** 2):.4f}):\n")
        out.append(markdown(["predicted", "predictions", "mean predicted", "observed"],
                            reliability(p, failed)))
        points = [point for m in chosen for point in m["val_points"]]
        out.append(f"\nthe same on the validation engines, each left out in turn (weighted: "
                   f"engines counted once, {len(points)} engine-models; Brier "
                   f"{validation_brier(points):.4f}):\n")
        out.append(markdown(["predicted", "engines (weight)", "mean predicted", "observed"],
                            reliability(np.concatenate([q["p_fail"] for q in points]),
                                        np.concatenate([q["failed"] for q in points]),
                                        weights=np.concatenate([q["weight"] for q in points]))))
    out.append("\n## Per test unit: covered by how many of the models\n")
    for (track, kind) in sorted(groups):
        chosen = [m for m in models if (m["track"], "ensemble" if m["members"] > 1
                                        else "single") == (track, kind)]
        hits = np.sum([(m["test_lower"] <= m["test_capped"])
                       & (m["test_capped"] <= m["test_upper"]) for m in chosen], axis=0)
        counts = np.bincount(hits, minlength=len(chosen) + 1)
        missed = [f"{u} (true {t:g})" for u, t, h in zip(chosen[0]["test_units"],
                                                         chosen[0]["test_true"], hits)
                  if 2 * h < len(chosen)]
        out.append(f"- {track}, {kind}: units covered by k of {len(chosen)} models, k = 0.."
                   f"{len(chosen)}: {counts.tolist()}; missed by most: "
                   f"{', '.join(missed) or 'none'}")
    return "\n".join(out)


def study(models: list[dict], horizon: float) -> str:
    rows = []
    ensembles = all(m["members"] > 1 for m in models)
    methods = {**STUDY, **(STUDY_ENSEMBLE if ensembles else {})}
    for name, fit in methods.items():
        results = [summarize_points(leave_one_engine_out(m, fit, horizon)) for m in models]
        mean = {k: np.mean([r[k] for r in results]) for k in (*REPORTED, "engine_min")}
        rows.append([name, *(percent_or_cycles(k, mean[k]) for k in REPORTED),
                     percent_or_cycles("engine_min", mean["engine_min"])])
    return ("## Calibration methods on validation engines, each left out in turn "
            f"({len(models)} models, mean)\n\n"
            + markdown(["method", "coverage", "<= 25", "26-75", "> 75", "width", "<= 25",
                        "26-75", "> 75", "worst engine"], rows))


def main():
    from rul.tracking.logged_models import load_logged, log_report, named_runs, tool_arguments

    parser = tool_arguments(__doc__.splitlines()[0], "interval-report (interval-study)")
    parser.add_argument("--horizon", type=float, default=DEFAULT_HORIZON)
    parser.add_argument("--study", action="store_true",
                        help="compare calibration methods on validation engines instead")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    run_ids = named_runs(parser, args)
    subset = load_subset(args.subset, args.data_dir)
    models = [scored(load_logged(r), subset) for r in run_ids]
    text = study(models, args.horizon) if args.study else report(models, args.horizon)
    print(text)
    if args.log:
        name = "interval-study" if args.study else "interval-report"
        print(f"\nkept as run {log_report(text, name, run_ids)} ({name})")


if __name__ == "__main__":
    main()
