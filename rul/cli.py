"""Command line: `rul train`, `rul evaluate`, `rul predict`, `rul tune`, `rul promote`,
`rul report`, `rul cmapss-file`."""

import errno
import math
import os
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

import click

from rul import config as cfg
from rul import services
from rul.console import masked_tracebacks, no_logged_tracebacks, one_line_warnings
from rul.errors import InputError
from rul.files import INPUT_LIMIT
from rul.interrupts import Terminated, exit_code, interrupts_as_exceptions
from rul.reporting.cli import report
from rul.serving.columns import served
from rul.urls import scrubbed


class Said(click.ClickException):
    """A command's one-line end, its URLs' secrets masked (rul.urls), whoever wrote it."""

    def __init__(self, message: str):
        super().__init__(scrubbed(message))


class UserError(Said):
    exit_code = 2


class WriteFailed(Said):
    """A write that found no space or a read-only place: exit 1, one line."""

    exit_code = 1


class ServiceError(Said):
    """A server that did not answer (rul.services): exit 69, EX_UNAVAILABLE."""

    exit_code = services.EXIT_CODE


def _user_errors() -> tuple:
    """What ends a command with its one line and exit code 2: rul's own InputError (a config,
    data, a checkpoint, what --resume finds), a path that is not there, and MLflow's refusals
    (an unknown model or alias) once MLflow is loaded (not imported just to catch one)."""
    mlflow_errors = sys.modules.get("mlflow.exceptions")
    return (InputError, FileNotFoundError,
            *((mlflow_errors.MlflowException,) if mlflow_errors else ()))


def _check_inputs(config, storage: str | None = None):
    """What can be checked before torch, mlflow or onnx is imported (slow): the data files'
    presence and shape, and the drivers of the tracking store's and the study's database URLs.
    Returns the loaded subset; bad input ends the command (exit 2, one line)."""
    from rul.data import load_dataset
    from rul.tracking_uri import missing_folder, store_uri
    from rul.urls import masked, missing_driver, remember, same_database

    with _ends_cleanly("nothing was started"):
        for what, url in (("tracking_uri", store_uri(config.tracking_uri)),
                          ("--storage", storage)):
            remember(url)  # its secrets are masked in whatever the command prints
            missing = (missing_driver(url) or missing_folder(url)) if url else None
            if missing:
                raise cfg.ConfigError(f"{what} {masked(url)}: {missing}")
        if same_database(storage, store_uri(config.tracking_uri)):
            raise cfg.ConfigError(f"--storage {masked(storage)}: the tracking store's database; "
                                  "MLflow's and Optuna's tables cannot share one (both keep "
                                  "their schema version in one table): give the study a "
                                  "database of its own")
        return load_dataset(config.dataset, config.data_dir, limit=config.data_limit)


def _load_config(config_path, overrides, data_dir=None, loader=cfg.load):
    """`loader` is cfg.load (`rul train`) or cfg.load_tuning (`rul tune`); a bad file or key
    ends the command with its one-line error, an interrupt with the signal's exit code."""
    overrides = list(overrides)
    if config_path and "=" in config_path and not Path(config_path).exists():
        overrides.insert(0, config_path)  # `rul train key=value` without a config file
        config_path = None
    if data_dir:
        overrides.append(f"data_dir={data_dir}")
    with _ends_cleanly("nothing was started"):
        return loader(config_path, overrides)


@contextmanager
def _ends_cleanly(after_interrupt, on_first_signal=None):
    """The block's bad inputs end the command with their one-line error (exit 2); SIGINT or
    SIGTERM end it, once the block has cleaned up (runs marked KILLED), with the signal's name
    and `after_interrupt` (a text, or a function saying what is left), exit 130 or 143."""
    from rul.services import ServiceUnavailable

    try:
        with interrupts_as_exceptions(on_first_signal=on_first_signal):
            yield
    except ServiceUnavailable as error:
        raise ServiceError(str(error)) from None
    except Exception as error:
        failed = _failed_write(error)
        if failed:
            raise WriteFailed(f"{failed}, then run the command again (a run with a checkpoint "
                              "continues with --resume)") from None
        if isinstance(error, _user_errors()):
            raise UserError(str(error)) from None
        raise
    except KeyboardInterrupt as interruption:
        said = after_interrupt() if callable(after_interrupt) else after_interrupt
        click.echo(f"\n{_signal_name(interruption)}: {said}", err=True)
        sys.exit(exit_code(interruption))


def _failed_write(error: Exception) -> str | None:
    """What a write found and what to do: no space (ENOSPC, SQLite's "full") or a read-only
    place (EROFS, SQLite's readonly database); None for any other error."""
    said = str(error)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EROFS):
        where = error.filename or "a file rul wrote"
        return (f"no space left on the device of {where}: free some"
                if error.errno == errno.ENOSPC else f"{where} is on a read-only filesystem: "
                                                   "make it writable")
    if "database or disk is full" in said:
        return "no space left on the device of the tracking store: free some"
    if "readonly database" in said:
        return "the tracking store cannot be written (SQLite: a readonly database): make it " \
               "writable"
    return None


def _after_interrupted_training(config, run_ids: list, world, command: list[str]) -> str:
    """What an interrupted `rul train` leaves: an ensemble's runs (never resumable), a run and
    its checkpoint to resume (`command`, the words that started it, with --resume RUN_ID), a
    run without one, or no run yet."""
    from rul.tracking.run_checkpoints import RunCheckpoints

    if config.ensemble > 1:
        return "the ensemble's runs are marked KILLED; run the command again to train it anew"
    if not world.is_main:
        return "rank 0 ends the run and says what is kept"
    if not run_ids:
        return "nothing was started (no run was created)"
    checkpoints = RunCheckpoints(config.checkpoint_dir)
    if checkpoints.has_checkpoint(run_ids[-1]):
        return ("the run is marked KILLED and its checkpoint kept; continue it with: "
                + scrubbed(shlex.join([*command, "--resume", run_ids[-1]]), config.tracking_uri))
    epochs = _epochs_logged(config, run_ids[-1])
    if epochs:
        return (f"the run is marked KILLED; it finished {epochs} epoch(s) but its checkpoint "
                f"{checkpoints.path(run_ids[-1])} is gone, so nothing can be resumed: run the "
                "command again")
    return ("the run is marked KILLED; it stopped before its first epoch ended, so it has no "
            "checkpoint and nothing can be resumed: run the command again")


def _epochs_logged(config, run_id: str) -> int:
    """The epochs a run logged as finished (0 when the store cannot say)."""
    from mlflow.tracking import MlflowClient

    from rul.tracking.store import for_mlflow, store_uri

    try:
        metrics = MlflowClient(for_mlflow(store_uri(config.tracking_uri))).get_run(
            run_id).data.metrics
    except Exception:  # noqa: BLE001 (a message on the way out: say the general case)
        return 0
    return int(metrics.get("epoch", 0))


@click.group()
@click.version_option(package_name="rul")
def main():
    """Remaining Useful Life of turbofan engines (NASA C-MAPSS), tracked in MLflow."""
    one_line_warnings()
    masked_tracebacks()
    no_logged_tracebacks()


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("config_path", required=False, metavar="[CONFIG]")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Local C-MAPSS folder.")
@click.option("--resume", is_flag=False, flag_value="newest", default=None, metavar="[RUN_ID]",
              help="Continue an interrupted run of this config: its only one, or RUN_ID.")
@click.option("--new-data", is_flag=True,
              help="With --resume: continue although the data files changed since the run "
                   "started (the run records both).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ensemble members trained side by side in worker processes, the CPU "
                   "threads split between them.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def train(config_path, overrides, data_dir, resume, **options):
    """Train a model (CONFIG is a YAML file in experiments/; KEY=VALUE overrides any key).

    Under `torchrun --nproc-per-node N -m rul train ...` one run trains on N processes (DDP):
    rank 0 tracks, checkpoints and registers; the other ranks only train."""
    if options["new_data"] and not resume:
        raise UserError("--new-data: only with --resume (a new run records its files anyway)")
    config = _load_config(config_path, overrides, data_dir)
    subset = _check_inputs(config)
    from rul.training.distributed import PeerLost, World
    from rul.workflows.train import Resume, train_tracked

    world = World.from_env()
    run_ids = []
    again = ["rul", "train", *([config_path] if config_path else []), *overrides,
             *(["--data-dir", data_dir] if data_dir else [])]
    with _ends_cleanly(lambda: _after_interrupted_training(config, run_ids, world, again)):
        try:
            asked = resume and Resume(None if resume == "newest" else resume,
                                      options["new_data"])
            outcome, run_id = train_tracked(config, asked, options["jobs"],
                                            not options["no_progress"], subset,
                                            on_run_created=run_ids.append)
        except PeerLost as error:
            click.echo(f"error: {error}; the run is marked FAILED" if world.is_main
                       else f"error: {error}", err=True)
            sys.exit(1)
    if outcome is None:  # a rank other than 0 of torchrun: rank 0 says what was trained
        return
    click.echo(_ensemble_summary(config, outcome) if config.ensemble > 1
               else _run_summary(outcome))
    click.echo(_where_lines(config, outcome, run_id))


def _run_summary(outcome) -> str:
    m = outcome.metrics
    test, val = _engines(outcome)
    return (f"\ntest RMSE {m['test_rmse']:.2f}{test} (uncapped {m['test_rmse_uncapped']:.2f})  "
            f"MAE {m['test_mae']:.2f}  score {m['test_score']:.1f}  "
            f"best epoch {m['best_epoch']} (val RMSE {m['best_val_rmse']:.2f}{val})")


def _ensemble_summary(config, outcome) -> str:
    m = outcome.metrics
    test, val = _engines(outcome)
    members = "  ".join(f"{o.metrics['test_rmse']:.2f}" for o in outcome.members)
    return (f"\nensemble of {config.ensemble}: test RMSE {m['test_rmse']:.2f}{test} (members "
            f"{members}; mean {m['member_test_rmse_mean']:.2f})  MAE {m['test_mae']:.2f}  "
            f"score {m['test_score']:.1f}  "
            f"{'out-of-fold ' if config.ensemble_split == 'folds' else ''}val RMSE "
            f"{m['val_rmse']:.2f}{val}")


def _engines(outcome) -> tuple[str, str]:
    """(` from 3 engines` after a test figure, and after a validation figure, of a split below
    its minimum (rul.data.engines); else nothing). The validation figure counts every engine
    a member validated on (out-of-fold: all the failed ones)."""
    import numpy as np

    from rul.data.engines import MIN_TEST, MIN_VALIDATION, counted

    data = outcome.data
    members = getattr(outcome, "members", [outcome])  # folds: each validates on its own
    validating = np.unique(np.concatenate([m.data.val_units for m in members]))
    return (counted(len(data.test_units), MIN_TEST), counted(len(validating), MIN_VALIDATION))


def _where_lines(config, outcome, run_id: str) -> str:
    """The track, the registry, the run and where to browse it (the store as configured)."""
    from mlflow.tracking import MlflowClient

    from rul.tracking_uri import store_uri

    run = MlflowClient().get_run(run_id)
    return (f"{_track_line(config, outcome)}\n{_registry_line(run.data.tags)}"
            f"run {run_id} in experiment {config.experiment_name!r}\n"
            f"browse: {browse_hint(store_uri(config.tracking_uri), run.info.experiment_id)}")


def _registry_line(tags: dict) -> str:
    """Where the run's model went in the registry (what tracking.registry recorded on the
    run's `tags`), as a line ending in a newline; '' when it was not registered."""
    from rul.tracking.registry import registry_line

    return registry_line(tags) + "\n" if "registered_version" in tags else ""


TRACK_WORDS = {  # rul.preprocessing.features.track's names, as a person reads them
    False: "reads the sensors only: comparable with published figures",
    True: "reads the sensors and the engine's age: not comparable with published figures "
          "(they read the sensors only)",
}


def _track_line(config, outcome) -> str:
    """What the model reads (compare it with published figures only when it reads sensors
    alone), and how many test engines its interval held, against its target, when it has one."""
    metrics = outcome.metrics
    line = TRACK_WORDS[bool(config.include_cycle)]
    if "test_interval_coverage" in metrics:
        engines = len(outcome.data.test_units)
        line += (f"\ntest interval: the true RUL inside it for "
                 f"{metrics['test_interval_coverage']:.0%} of {engines} engine"
                 f"{'s' if engines != 1 else ''} (target {config.interval_coverage:.0%}), "
                 f"mean width {metrics['test_interval_width']:.1f} cycles")
    return line


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("config_path", required=False, metavar="[CONFIG]")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--seeds", "n_seeds", type=click.IntRange(min=1), default=5, show_default=True,
              help="Trainings of the config, seeds seed, seed+1, ... (x ensemble).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Local C-MAPSS folder.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Seeds trained side by side in worker processes, the CPU threads split "
                   "between them.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def evaluate(config_path, overrides, n_seeds, data_dir, jobs, no_progress):
    """Train a config with N seeds and report test metrics as mean ± std (and each seed).

    Nothing is selected on the test set; one parent MLflow run holds the aggregates, one child
    run per seed; nothing is registered."""
    config = _load_config(config_path, overrides, data_dir)
    _check_inputs(config)
    from rul.evaluation.seeds import summary_table
    from rul.workflows.evaluate import evaluate_seeds

    with _ends_cleanly("the evaluation's runs are marked KILLED; run the command again to "
                       "start it over"):
        evaluation = evaluate_seeds(config, n_seeds, jobs, progress=not no_progress)
    click.echo("\n" + summary_table(evaluation))
    click.echo(_browse_line(config))


def _browse_line(config) -> str:
    """`browse: ...`: where the experiment's runs are seen (browse_hint)."""
    from mlflow.tracking import MlflowClient

    from rul.tracking_uri import store_uri

    experiment = MlflowClient().get_experiment_by_name(config.experiment_name)
    return f"browse: {browse_hint(store_uri(config.tracking_uri), experiment.experiment_id)}"


def _signal_name(interruption: KeyboardInterrupt) -> str:
    return "terminated (SIGTERM)" if isinstance(interruption, Terminated) else "interrupted"


def browse_hint(tracking_uri: str, experiment_id: str) -> str:
    """Where to look at the runs: the server itself, or how to start the UI on the store used
    (RUL_UI_PORT, default 5000; a relative SQLite path made absolute), and the experiment's
    runs view; `make ui` (STORE= unless ./mlflow.db) where a Makefile here has a `ui` target."""
    import shlex
    import shutil

    from rul.tracking.store import DEFAULT_URI, sqlite_path
    from rul.tracking.ui import experiment_page
    from rul.urls import masked

    page = experiment_page(experiment_id)
    if tracking_uri.startswith(("http://", "https://")):
        return masked(tracking_uri).rstrip("/") + page
    port = os.environ.get("RUL_UI_PORT", "5000")
    database = sqlite_path(tracking_uri)
    store = f"sqlite:///{database.absolute()}" if database else masked(tracking_uri)
    secret = " (the password masked: give yours)" if store != tracking_uri and not database \
        else ""
    beside = Path(sys.executable).with_name("mlflow")  # the mlflow of this environment
    mlflow_ui = "mlflow" if shutil.which("mlflow") == str(beside) or not beside.exists() \
        else str(beside)
    ui = f"{mlflow_ui} ui --backend-store-uri {shlex.quote(store)} --port {port}"
    then = f"then http://127.0.0.1:{port}{page}{secret}"
    if not _makefile_has_ui():
        return f"{ui}, {then}"
    chosen = "" if tracking_uri == DEFAULT_URI else f" STORE={shlex.quote(store)}"
    return f"make ui{chosen} UI_PORT={port} (or: {ui}), {then}"


def _makefile_has_ui() -> bool:
    try:
        return "\nui:" in "\n" + Path("Makefile").read_text()
    except (OSError, UnicodeDecodeError):
        return False


@main.command(help=f"""Predict the RUL of each engine at its last cycle; writes CSV
    `{",".join(column.name for column in served())}` (bounds: the
    model's calibrated interval, if any; p_fail_within: the probability of failing within
    --horizon cycles; flagged: the unit lies outside the training fleet, and why; an ensemble
    adds rul_std, its members' spread).""")
@click.option("--model", "model_uri", required=True,
              help="Model URI, e.g. models:/rul-fd001@champion or runs:/<id>/model")
@click.option("--input", "input_path", required=True, type=click.Path(dir_okay=False),
              help="C-MAPSS rows: a test_FDxxx.txt file, or a CSV with a header row.")
@click.option("--output", type=click.Path(dir_okay=False),
              help="CSV to write (default: stdout); its folder must exist.")
@click.option("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
@click.option("--short-history", type=click.Choice(["pad", "reject"]), default="pad",
              show_default=True,
              help="A unit with fewer rows than the window: edge-pad it (flagged `padded`) "
                   "or reject the input.")
@click.option("--strict", is_flag=True,
              help="Refuse the input when a unit lies outside the training fleet (otherwise "
                   "such units are flagged and named in a warning).")
@click.option("--horizon", type=float, default=None,
              help="Cycles ahead for p_fail_within, the probability that the engine fails "
                   "within them (default 20; below the model's RUL cap).")
@click.option("--max-input-mb", type=click.FloatRange(min=0, min_open=True),
              default=INPUT_LIMIT.megabytes, show_default=True,
              help="A larger --input file is refused before it is read.")
def predict(model_uri, input_path, output, tracking_uri, short_history, strict, horizon,
            max_input_mb):
    from rul.inference import PredictOptions, outside_warning, predict_file, write_predictions
    from rul.services import ServiceUnavailable

    try:
        if output and not Path(output).parent.is_dir():  # before the work, not after it
            raise UserError(f"{output}: folder {Path(output).parent} does not exist")
        result = predict_file(model_uri, input_path, tracking_uri,
                              PredictOptions(short_history, strict, horizon, max_input_mb))
        if output:
            write_predictions(result, output)
    except ServiceUnavailable as error:
        raise ServiceError(str(error)) from None
    except (*_user_errors(), ValueError) as error:
        raise UserError(str(error)) from None
    warning = outside_warning(result)
    if warning:
        click.echo(warning, err=True)
    if output:
        click.echo(f"wrote {len(result)} predictions to {output}", err=True)
    else:
        click.echo(result.to_csv(index=False), nl=False)


@main.command("fleet-page")
@click.option("--model", "model_uri", required=True,
              help="Model URI, e.g. models:/rul-fd001@champion, or a model folder")
@click.option("--input", "input_path", required=True, type=click.Path(dir_okay=False),
              help="The engines in service: each one's rows so far (CSV, Parquet or NASA text).")
@click.option("--output", required=True, type=click.Path(dir_okay=False),
              help="The HTML page to write; its folder must exist.")
@click.option("--tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
@click.option("--horizon", type=float, default=None,
              help="Cycles ahead: engines are ranked by their probability of failing within "
                   "them (default 20; below the model's RUL cap).")
def fleet_page(model_uri, input_path, output, tracking_uri, horizon):
    """One self-contained HTML page of the engines in service: ranked by their probability of
    failing within --horizon cycles, each engine's predicted RUL with its interval in a chart,
    and its flags (outside the training fleet, a short history). It opens offline."""
    from rul.inference import PredictOptions, predict_file
    from rul.services import ServiceUnavailable
    from rul.serving.fleet_page import write_page
    from rul.serving.predictor import PARAMS

    try:
        if not Path(output).parent.is_dir():  # before the work, not after it
            raise UserError(f"{output}: folder {Path(output).parent} does not exist")
        result = predict_file(model_uri, input_path, tracking_uri,
                              PredictOptions(horizon=horizon))
        write_page(result, output, PARAMS["horizon"] if horizon is None else horizon,
                   model_uri, str(input_path))
    except ServiceUnavailable as error:
        raise ServiceError(str(error)) from None
    except (*_user_errors(), ValueError) as error:
        raise UserError(str(error)) from None
    flagged = int(result["flagged"].sum()) if "flagged" in result else 0
    click.echo(f"wrote {output}: {len(result)} engines, {flagged} flagged", err=True)


def _positive_seconds(ctx, param, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value} is not a number of seconds > 0")
    return value


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("config_path", required=False, metavar="[CONFIG]")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--n-trials", type=click.IntRange(min=1), default=None,
              help="Trials to add (default: config).")
@click.option("--timeout", type=float, default=None, callback=_positive_seconds,
              help="Stop starting trials after S seconds.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parallel worker processes on this machine (journal storage).")
@click.option("--storage", default=None,
              help="Optuna storage URL (default: sqlite, or a journal file with --workers>1).")
@click.option("--study-name", default=None, help="Study name (default: from the config).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Local C-MAPSS folder.")
def tune(config_path, overrides, data_dir, **study):
    """Search the effective batch, learning rate and more with Optuna."""
    config = _load_config(config_path, overrides, data_dir, loader=cfg.load_tuning)
    _check_inputs(config.train, study["storage"])
    from rul.tuning.study import quiet_optuna
    from rul.workflows.tune import run_study

    with _ends_cleanly("the study's runs are marked KILLED and the study is kept; run the same "
                       "command again to continue it", on_first_signal=quiet_optuna):
        summary = run_study(config, **study)
    click.echo(summary)
    click.echo(_browse_line(config.train))


@main.command()
@click.argument("model")
@click.argument("version")
@click.option("--why", default=None,
              help="Move the champion alias to VERSION, this reason kept on the version "
                   "(without it: only compare).")
@click.option("--tracking-uri", default=None,
              help="MLflow store (default: MLFLOW_TRACKING_URI or ./mlflow.db).")
def promote(model, version, why, tracking_uri):
    """Compare VERSION of registered MODEL (e.g. rul-fd001) with its champion on the same
    engines; with --why, move the champion alias to it by hand."""
    from rul.tracking.store import configure
    from rul.workflows.promote import promote as move
    from rul.workflows.promote import side_by_side

    with _ends_cleanly("the alias was not moved"):
        configure(tracking_uri)
        click.echo("\n".join(side_by_side(model, version)))
        if why:
            click.echo(move(model, version, why))


@main.command("cmapss-file")
@click.argument("name")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Local C-MAPSS folder.")
def cmapss_file(name, data_dir):
    """Print the path rul reads C-MAPSS file NAME from (e.g. test_FD001.txt): --data-dir,
    then CMAPSS_DIR, then the cache data/cmapss/, downloading into it when no copy is found,
    as `rul train` does. In a shell: --input "$(rul cmapss-file test_FD001.txt)"."""
    from rul.data import cmapss_file as where

    with _ends_cleanly("nothing was downloaded"):
        click.echo(where(name, data_dir))


main.add_command(report)  # rul/reporting/cli.py

if __name__ == "__main__":
    main()
