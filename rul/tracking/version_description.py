"""What a registered version says of itself, from its run: the evidence it is promoted on, its
test figures, its data (name, digests, the columns read in order, the conditions found), the
engines held out, validating and in service, the recipe's key values and the command that
trains it again; as the version's description (Markdown) and its tags."""

from rul.config.recipes import train_command
from rul.data.schema import COLUMNS
from rul.errors import ConfigError
from rul.evaluation.intervals import DEFAULT_HORIZON
from rul.tracking.metric_names import read
from rul.tracking.run_logging import TRACK_TAG
from rul.tracking.run_params import config_from_params

VAL_RMSE_TAG = "val_rmse"
REPRODUCE_TAG = "reproduce"
COPIED_TAGS = ("subset", TRACK_TAG, "data.columns", "data.features", "data.conditions",
               "data.censored")  # beside the data's digests and the selection's tags
MAX_TAG = 5000  # MLflow's limit on a model version tag's value


def _number(values: dict, key: str, digits: int = 3) -> str:
    value = read(values, key)
    return "n/a" if value is None else f"{float(value):.{digits}f}"


def config_summary(params: dict) -> str:
    """One line from a run's params: model, optimizer, lr, window, batch (micro x K), epochs,
    precision."""
    p = {k: params.get(k, "?") for k in ("model", "optimizer", "lr", "window",
                                         "effective_batch_size", "micro_batch_size",
                                         "accumulation_steps", "epochs", "precision")}
    return (f"{p['model']}, {p['optimizer']} lr {p['lr']}, window {p['window']}, effective "
            f"batch {p['effective_batch_size']} ({p['micro_batch_size']} x "
            f"{p['accumulation_steps']}), {p['epochs']} epochs, {p['precision']}")


def data_digests(tags: dict) -> dict:
    """The run's data SHA-256 tags (`data.sha256.<role>`)."""
    return {k: v for k, v in sorted(tags.items()) if k.startswith("data.sha256.")}


def id_ranges(ids) -> str:
    """[1, 2, 3, 5, 7, 8] -> '1-3, 5, 7-8'; 'none' when there are none."""
    ids, spans = sorted(int(i) for i in ids), []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans) or "none"


def reproduce_command(params: dict) -> str:
    """The command that trains the run's config again, or n/a where its params do not make a
    config of today's rul (an earlier rul's keys)."""
    try:
        return train_command(config_from_params(params))
    except ConfigError:
        return "n/a"


def _engines_line(engines: dict | None) -> str:
    if not engines:
        return "Engines: not recorded"
    return "Engines: " + "; ".join(
        f"{said} {len(engines.get(role, []))} ({id_ranges(engines.get(role, []))})"
        for role, said in (("train", "trained on"), ("validate", "validating"),
                           ("test", "held out for test"), ("in_service", "in service")))


def _test_lines(metrics: dict) -> list[str]:
    lines = [f"Test (held out, reported, never selected on): RMSE {_number(metrics, 'test_rmse')}, "
             f"MAE {_number(metrics, 'test_mae')}, PHM08 score "
             f"{_number(metrics, 'test_score', 1)}."]
    target = read(metrics, "interval_coverage_target")
    if target is not None:
        lines.append(
            f"Interval: target {float(target):.0%}, test coverage "
            f"{_number(metrics, 'test_interval_coverage')}, mean width "
            f"{_number(metrics, 'test_interval_width', 1)} cycles, calibrated on "
            f"{_number(metrics, 'interval_engines', 0)} engines; p_fail within "
            f"{DEFAULT_HORIZON:g} cycles: Brier {_number(metrics, 'test_p_fail_brier')}.")
    return lines


def version_description(run, val_rmse: float, engines: dict | None = None) -> str:
    """The version's description: `run`'s (an MLflow Run) evidence, figures, data, engines
    (`engines`: the run's engines.json), recipe and the command that trains it again."""
    metrics, tags, params = run.data.metrics, run.data.tags, run.data.params
    digests = "; ".join(f"{k.removeprefix('data.sha256.')} {v}"
                        for k, v in data_digests(tags).items()) or "n/a"
    columns = tags.get("data.columns", ",".join(COLUMNS)).split(",")
    used = tags.get("data.features")
    conditions = tags.get("data.conditions")
    selection = (f"Selection score {float(val_rmse):.3f} cycles ({tags['selection.score']}, "
                 f"on the {tags.get('selection.engine_count', '?')} validating engines below): "
                 "what the champion alias compares."
                 if "selection.score" in tags else
                 f"Validation RMSE {float(val_rmse):.3f} cycles.")
    return "\n".join([
        selection, *_test_lines(metrics),
        f"Data: {tags.get('subset', 'n/a')} ({tags.get(TRACK_TAG, 'n/a')} track), SHA-256 "
        f"{digests}.",
        f"Columns read, in order ({len(columns)}): {', '.join(columns)}."
        + (f" Inputs the model uses ({len(used.split(','))}): {used.replace(',', ', ')}."
           if used else "")
        + (f" Operating conditions: {conditions}." if conditions else ""),
        _engines_line(engines) + ".",
        f"Recipe: {config_summary(params)}; seed {params.get('seed', '?')}, validation split "
        f"seed {params.get('split_seed', params.get('seed', '?'))}.",
        f"Reproduce: `{reproduce_command(params)}`",
        f"Run {run.info.run_id} ({run.info.run_name}).",
    ])


def version_tags(run, val_rmse: float) -> dict:
    tags = {VAL_RMSE_TAG: repr(float(val_rmse)), "run_id": run.info.run_id,
            REPRODUCE_TAG: reproduce_command(run.data.params)[:MAX_TAG],
            **{k: v for k, v in run.data.tags.items() if k.startswith("selection.")}}
    test_rmse = read(run.data.metrics, "test_rmse")
    if test_rmse is not None:
        tags["test_rmse"] = repr(float(test_rmse))
    tags.update({k: run.data.tags[k][:MAX_TAG] for k in COPIED_TAGS if k in run.data.tags})
    tags.update(data_digests(run.data.tags))
    return tags
