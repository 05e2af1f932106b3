"""`rul tune`: an Optuna study whose trials are nested MLflow runs of `rul train`.

Storage (rul.tuning.storage): SQLite for one worker; a JournalStorage file for several workers
on one machine; a PostgreSQL URL for `rul tune` processes on many machines (with Optuna's
heartbeat). Re-running the same command loads the study (sampler and pruner are passed again,
they are not stored) and adds trials; the MLflow parent run is kept in the study's user
attributes. A process that joins a study on a server while another is working towards its
target helps reach that target rather than adding n_trials of its own.
"""

import multiprocessing
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import optuna
from mlflow.tracking import MlflowClient

from rul.config import NOT_COMPARED_IN_A_STUDY, TuningConfig
from rul.errors import ConfigError
from rul.interrupts import deferred, exit_code, immediate, interrupts_as_exceptions
from rul.plan import plan_run
from rul.tracking.lifecycle import run_ends_cleanly
from rul.tracking.registry import (
    logged_model_uri,
    register_and_promote,
    registered_model_name,
)
from rul.tracking.run_owner import owner_tags, reopen
from rul.tracking.store import Store, open_store
from rul.training.listener import TrainingListener
from rul.tuning import objectives as objs
from rul.tuning.report import format_pareto_table, log_figures, log_pareto_table, pareto_table
from rul.tuning.space import suggest, trial_overrides
from rul.tuning.storage import (  # noqa: F401 (DEFAULT_*: re-exported)
    DEFAULT_JOURNAL,
    DEFAULT_SQLITE,
    check_url,
    has_heartbeat,
    open_storage,
    retried_trial_numbers,
    study_lock,
    wait_for_server,
)
from rul.workflows.tracked import RunRole, track

STARTED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
           optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING)
TARGET_ATTR, TARGET_SET_AT_ATTR = "n_trials_target", "n_trials_target_set_at"
OBJECTIVES_ATTR = "objectives"  # stored by multi-objective studies (Optuna keeps directions)
BASE_ATTR = "base_config"  # the training keys every trial shares (what the trials mean)
# The keys the machines or invocations of one study may differ in are
# rul.config.NOT_COMPARED_IN_A_STUDY; the batch keys are compared as far as they decide B.
BATCH_KEYS = ("micro_batch_size", "accumulation_steps", "effective_batch_size")
TRAINED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
           optuna.trial.TrialState.RUNNING)


def open_study_storage(config: TuningConfig, url: str | None, workers: int):
    """`open_storage` with the config's heartbeat settings (used by server URLs only)."""
    with warnings.catch_warnings():  # heartbeat_interval is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return open_storage(url, workers, heartbeat_interval=config.heartbeat_interval,
                            grace_period=config.heartbeat_grace_period,
                            retry_dead_trials=config.retry_dead_trials)


def counted_trials(study: optuna.Study) -> int:
    """Trials that count towards n_trials: started ones, less FAIL ones a retry replaced."""
    trials = study.get_trials(deepcopy=False, states=STARTED)
    return len(trials) - len(retried_trial_numbers(study.get_trials(deepcopy=False)))


def _stop_at(target: int):
    def callback(study: optuna.Study, trial) -> None:
        if counted_trials(study) >= target:
            study.stop()

    return callback


def _study_target(study: optuna.Study, n_trials: int, join_within: float | None) -> int:
    """How many counted trials this process works towards. On a shared server
    (`join_within` seconds: the heartbeat grace period) a target still open, with a trial
    running or set moments ago by a process starting at the same time, is joined; otherwise
    n_trials are added to the trials there. Called under the study lock."""
    counted = counted_trials(study)
    target = study.user_attrs.get(TARGET_ATTR)
    if join_within is not None and target is not None and counted < target:
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if running or time.time() - study.user_attrs.get(TARGET_SET_AT_ATTR, 0) < join_within:
            return target
    target = counted + n_trials
    study.set_user_attr(TARGET_ATTR, target)
    study.set_user_attr(TARGET_SET_AT_ATTR, time.time())
    return target


def make_pruner(config: TuningConfig):
    """Optuna cannot prune a multi-objective study (no `trial.report`): no pruner then."""
    if objs.is_multi(config.objectives):
        return optuna.pruners.NopPruner()
    if config.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2,
                                           n_warmup_steps=config.pruner_warmup_epochs)
    if config.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, config.pruner_warmup_epochs),
                                              max_resource=config.train.epochs)
    return optuna.pruners.NopPruner()


def load_study(config: TuningConfig, storage, study_name: str, worker: int = 0) -> optuna.Study:
    """Create or load the study. Sampler and pruner are not stored, so they are passed again;
    the sampler's seed also depends on the trials already there, so a resumed study does not
    replay the draws of its first invocation (and each worker draws differently)."""
    if objs.is_multi(config.objectives):
        study = optuna.create_study(
            storage=storage, study_name=study_name, load_if_exists=True,
            directions=objs.directions(config.objectives), pruner=make_pruner(config),
        )
    else:
        study = optuna.create_study(
            storage=storage, study_name=study_name, direction="minimize", load_if_exists=True,
            pruner=make_pruner(config),
        )
    _check_objectives(study, config.objectives)
    _check_base_config(study, config)
    entropy = [config.train.seed, worker, len(study.trials)]
    seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    return study


def _check_objectives(study: optuna.Study, objectives: list[str]) -> None:
    """A study keeps the objectives it was created with: Optuna loads an existing study with
    its stored directions whatever is asked, so a different list is an error here."""
    stored = study.user_attrs.get(OBJECTIVES_ATTR)
    wanted = [optuna.study.StudyDirection[d.upper()] for d in objs.directions(objectives)]
    if stored is None and objs.is_multi(objectives) and study.directions == wanted \
            and not study.trials:  # a new multi-objective study
        study.set_user_attr(OBJECTIVES_ATTR, list(objectives))
        return
    if stored is None:  # single-objective studies store nothing: theirs is val_rmse
        stored = list(objs.DEFAULT) if len(study.directions) == 1 else "unknown"
    if stored != list(objectives):
        raise ConfigError(
            f"study {study.study_name!r}: objectives={list(objectives)}: the study was created "
            f"with objectives {stored}; tune it with those, or name a new study (--study-name)")


def _batch_keys_of_base(config: TuningConfig) -> set[str]:
    """The batch keys whose base values decide a trial's effective batch B (rul.tuning.space):
    B itself unless drawn; with the (deprecated) split in the space, micro x K, the undrawn one
    of the two. Never the split of a base B: exact accumulation trains the same model."""
    drawn = set(config.search_space)
    if "effective_batch_size" in drawn:
        return set()
    if not drawn & {"micro_batch_size", "accumulation_steps"} or (
            "micro_batch_size" not in drawn and config.train.micro_batch_size == "auto"):
        return {"effective_batch_size"}
    return {"micro_batch_size", "accumulation_steps"} - drawn


def base_config(config: TuningConfig) -> dict:
    """The training keys a trial does not draw, as JSON values: with the search space's draws
    they say what a trial trained."""
    values = config.train.model_dump(mode="json")
    batch = _batch_keys_of_base(config)
    base = {key: value for key, value in values.items()
            if key not in NOT_COMPARED_IN_A_STUDY and key not in config.search_space
            and (key not in BATCH_KEYS or key in batch)}
    base["scale_lr_with_batch"] = config.scale_lr_with_batch
    return base


def _check_base_config(study: optuna.Study, config: TuningConfig) -> None:
    """A study's trials are comparable only if they share what they do not draw: resuming it
    with another epochs, schedule, seed (another validation split) or a changed default would
    mix trials of two base configs under one best. Keys drawn by either search space are
    not compared (the space itself may change). A study without a trial that trained (only
    failed ones, or none) takes the config it is run with; so does a study from before this
    check, saying so."""
    wanted = base_config(config)
    stored = study.user_attrs.get(BASE_ATTR)
    if stored is None or not study.get_trials(deepcopy=False, states=TRAINED):
        if stored is None and study.trials:
            print(f"study {study.study_name!r} has no stored base config (made by an older "
                  "rul): its trials are taken to share this config's", file=sys.stderr)
        if stored != wanted:
            study.set_user_attr(BASE_ATTR, wanted)
        return
    differ = sorted(key for key in stored.keys() & wanted.keys() if stored[key] != wanted[key])
    if differ:
        had = ", ".join(f"{key}={stored[key]!r}" for key in differ)
        has = ", ".join(f"{key}={wanted[key]!r}" for key in differ)
        raise ConfigError(
            f"study {study.study_name!r}: its trials were trained with {had}; this config has "
            f"{has}: tune it with the study's values, or name a new study (--study-name)")


class PruningListener(TrainingListener):
    """Reports validation RMSE to Optuna after each epoch (after the run's MLflow listener
    has recorded it) and stops a hopeless trial."""

    def __init__(self, trial: optuna.Trial):
        self.trial = trial

    def on_epoch(self, epoch, step, metrics) -> None:
        with deferred():  # Optuna's storage write
            self.trial.report(metrics["val_rmse"], epoch)  # per epoch: fair across K
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at epoch {epoch}: "
                                     f"val_rmse {metrics['val_rmse']:.3f}")


def objective_for(base: TuningConfig, parent_run_id: str, store: Store):
    multi = objs.is_multi(base.objectives)

    def objective(trial: optuna.Trial) -> float | list[float]:
        values = suggest(trial, base.search_space)
        changes, reason = trial_overrides(base, values)
        if reason:
            _pruned_before_training(trial, reason)
        config = base.train.replace(**changes, register=False,
                                    checkpoint_dir=str(Path(base.train.checkpoint_dir) / "tune"))
        tags = {"optuna.trial": str(trial.number), "optuna.study": trial.study.study_name}
        if "peak_memory_mb" in base.objectives:
            objs.reset_peak_memory()  # not charged for the worker's previous trial
        role = RunRole(parent_run_id, f"trial-{trial.number:03d}", tags, register=False,
                       resumable=False, stop_exceptions=(optuna.TrialPruned,),
                       on_run_created=lambda run_id: trial.set_user_attr("mlflow_run_id", run_id))
        try:
            with immediate():  # training may stop at once; its own writes defer the signal
                try:
                    plan = plan_run(config)
                except ConfigError as error:  # the data refuses it: a window over every unit
                    _pruned_before_training(trial, str(error))
                outcome, _ = track(plan, role, store, None if multi else
                                   PruningListener(trial), progress=False)
        except optuna.TrialPruned as pruned:
            _mark(trial, "PRUNED", str(pruned))
            raise
        except Exception as error:
            if _is_out_of_memory(error):
                reason = f"CUDA out of memory at micro_batch_size={config.micro_batch_size}"
                _mark(trial, "PRUNED", reason)
                raise optuna.TrialPruned(reason) from None
            _mark(trial, "FAIL", f"{type(error).__name__}: {error}")
            raise
        except KeyboardInterrupt as interruption:
            _mark(trial, "FAIL", f"interrupted ({type(interruption).__name__})")
            raise
        _mark(trial, "COMPLETE", "")
        if multi:
            return objs.trial_values(base.objectives, outcome.state)
        return outcome.state.best_val_rmse

    return objective


def _is_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error)


def _pruned_before_training(trial: optuna.Trial, reason: str) -> None:
    """A trial whose drawn config cannot train (no MLflow run): pruned, its reason one line
    on stderr and on the trial, never a traceback."""
    trial.set_user_attr("prune_reason", reason)
    print(f"trial {trial.number}: pruned before training: {reason}", file=sys.stderr)
    raise optuna.TrialPruned(reason)


def _mark(trial, state: str, reason: str) -> None:
    run_id = trial.user_attrs.get("mlflow_run_id")
    if reason:
        trial.set_user_attr("reason", reason[:1000])
    if run_id:
        client = MlflowClient()
        client.set_tag(run_id, "optuna.trial_state", state)
        if reason:
            client.set_tag(run_id, "optuna.reason", reason[:5000])


def _close_interrupted_trials(study: optuna.Study, client: MlflowClient) -> None:
    """Trials left RUNNING by a killed earlier invocation become FAIL (their MLflow runs
    KILLED), so a resumed study neither counts nor repeats them. Assumes no other `rul tune`
    is working on this study right now."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
        run_id = trial.user_attrs.get("mlflow_run_id")
        if run_id and client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, "optuna.trial_state", "FAIL")
            client.set_tag(run_id, "optuna.reason", "interrupted: the tuning process was killed")
            client.set_terminated(run_id, status="KILLED")


@dataclass(frozen=True)
class StudyWork:
    """What every worker of one `rul tune` invocation shares."""

    config: TuningConfig
    storage: str | None  # the URL as given (None: the default for `workers`)
    workers: int
    study_name: str
    parent_run_id: str
    store: Store  # the MLflow store, opened once by the command
    target: int  # counted trials to reach
    timeout: float | None  # seconds; no new trial starts after it


def _worker(work: StudyWork, worker: int):
    config, target = work.config, work.target
    storage = open_study_storage(config, work.storage, work.workers)
    study = load_study(config, storage, work.study_name, worker)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    deadline = None if work.timeout is None else time.monotonic() + work.timeout
    while counted_trials(study) < target:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        with deferred():  # Optuna's own storage writes are never cut; trials are `immediate`
            study.optimize(objective_for(config, work.parent_run_id, work.store), timeout=left,
                           catch=(Exception,), callbacks=[_stop_at(target)])
        if not has_heartbeat(storage):
            break
        # A dead worker's trial, retried, is short of the target again: run it too.
        _await_running_trials(study, config.heartbeat_interval)


def _await_running_trials(study: optuna.Study, interval: float) -> None:
    """Wait while other workers' trials run, so the study's parent run ends with its last
    trial; a dead worker's trial is failed by the heartbeat check (its run ends KILLED)."""
    from optuna.trial import TrialState

    while True:
        with warnings.catch_warnings(), deferred():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            return
        time.sleep(min(interval, 2.0))  # a cheap query; stale means silent > grace period


def quiet_optuna() -> None:
    """Optuna logs an interrupted trial with its traceback; an interruption is not a bug."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def _worker_process(*args) -> None:
    """A spawned worker: a signal ends its trial's run KILLED, then it exits 130 or 143."""
    try:
        with interrupts_as_exceptions(on_first_signal=quiet_optuna):
            _worker(*args)
    except KeyboardInterrupt as interruption:
        sys.exit(exit_code(interruption))


def _run_workers(work: StudyWork) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_worker_process, args=(work, i))
                 for i in range(work.workers)]
    try:
        for p in processes:
            p.start()
        for p in processes:
            p.join()
    except KeyboardInterrupt:  # this process was signalled: stop the workers, let them clean up
        for p in processes:
            if p.is_alive():
                p.terminate()  # SIGTERM; ignored by a worker already stopping
        for p in processes:
            p.join(timeout=120)
        raise
    failed = [p.exitcode for p in processes if p.exitcode]
    if failed:
        raise RuntimeError(f"tuning workers exited with codes {failed}")


def run_study(config: TuningConfig, n_trials: int | None = None, timeout: float | None = None,
              workers: int = 1, storage: str | None = None, study_name: str | None = None):
    if not config.search_space:
        raise ConfigError("the config has no search_space to tune (a tuning config lists one: "
                          "experiments/tune_fd001.yaml)")
    check_url(storage, workers)  # before anything is written
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # rul says what the study is
    n_trials = n_trials if n_trials is not None else config.n_trials
    study_name = study_name or config.effective_study_name
    wait_for_server(storage, workers)  # a server that does not answer: bounded, then one line
    store = open_store(config.train)  # once, before any worker
    client = MlflowClient()
    with study_lock(storage, workers, study_name):  # `rul tune` processes starting at once
        opened = open_study_storage(config, storage, workers)  # may create Optuna's tables
        heartbeat = has_heartbeat(opened)
        study = load_study(config, opened, study_name)
        done = len(study.trials)
        print(f"study {study_name}: " + (f"continuing ({done} trials so far)" if done else
                                         "new"), file=sys.stderr)
        parent_run_id = study.user_attrs.get("mlflow_parent_run_id")
        if parent_run_id is None:
            parent_run_id = client.create_run(store.experiment_id, run_name=study_name,
                                              tags={"optuna.study": study_name,
                                                    **owner_tags()}).info.run_id
            study.set_user_attr("mlflow_parent_run_id", parent_run_id)
            space = config.to_dict()["search_space"]
            client.log_param(parent_run_id, "search_space", str(space)[:6000])
            if objs.is_multi(config.objectives):
                client.log_param(parent_run_id, "objectives", ", ".join(config.objectives))
        else:
            reopen(client, parent_run_id)
        if not heartbeat:  # with a heartbeat, Optuna fails dead workers' trials itself
            _close_interrupted_trials(study, client)
        grace = config.heartbeat_grace_period or 2 * config.heartbeat_interval
        target = _study_target(study, n_trials, grace if heartbeat else None)
    if objs.is_multi(config.objectives) and config.pruner != "none":
        print(f"objectives {', '.join(config.objectives)}: a multi-objective study is not "
              f"pruned (Optuna cannot prune several objectives); pruner={config.pruner!r} is "
              "ignored", file=sys.stderr)
    work = StudyWork(config, storage, workers, study_name, parent_run_id, store, target,
                     timeout)
    with run_ends_cleanly(parent_run_id):
        if workers == 1:
            _worker(work, 0)
        else:
            _run_workers(work)
        with study_lock(storage, workers, study_name):  # one registration at a time
            study = load_study(config, open_storage(storage, workers), study_name)
            summary = _record_study(study, parent_run_id, config)
    return summary


def _record_study(study: optuna.Study, parent_run_id: str, config: TuningConfig) -> str:
    """Counts, trials table, figures and the registered best trial, on the parent run.
    Several objectives: the best trial is the Pareto trial with the lowest val_rmse, and the
    Pareto front is printed and logged (pareto_front.csv, figures/pareto_front.png)."""
    from optuna.trial import TrialState

    client = MlflowClient()
    objectives, multi = config.objectives, objs.is_multi(config.objectives)
    states = {s: len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    counts = {f"trials_{s.name.lower()}": n for s, n in states.items() if n}
    lines = [f"study {study.study_name}: {len(study.trials)} trials "
             + ", ".join(f"{k.removeprefix('trials_')} {v}" for k, v in counts.items())]
    with mlflow.start_run(run_id=parent_run_id):
        mlflow.log_metrics({k: float(v) for k, v in counts.items()}, step=len(study.trials))
        with tempfile.TemporaryDirectory() as scratch:
            table = Path(scratch) / "trials.csv"
            study.trials_dataframe().to_csv(table, index=False)
            mlflow.log_artifact(str(table))
        if states[TrialState.COMPLETE] == 0:
            return "\n".join([*lines, "no trial completed: nothing to register"])
        best = objs.best_accuracy_trial(study, objectives)
        best_value = objs.accuracy_of(best, objectives)
        mlflow.log_metric("best_val_rmse", best_value, step=len(study.trials))
        mlflow.set_tags({"best_trial": str(best.number),
                         **{f"best.{k}": str(v) for k, v in best.params.items()}})
        if multi:
            front = pareto_table(study, objectives)
            log_pareto_table(front)
            mlflow.log_metric("pareto_trials", float(len(front)), step=len(study.trials))
            lines += [f"Pareto front ({', '.join(objectives)}): {len(front)} trials",
                      format_pareto_table(front, objectives)]
        log_figures(study, objectives)
    best_run = best.user_attrs.get("mlflow_run_id")
    chosen = "best trial" if not multi else "best val_rmse on the Pareto front: trial"
    lines.append(f"{chosen} {best.number}: val_rmse {best_value:.3f} with {best.params}")
    name = registered_model_name(config.train.dataset_name)
    if best_run and config.train.register and client.search_model_versions(
        f"name='{name}' and run_id='{best_run}'"
    ):
        lines.append(f"best trial's model is already registered as {name}")
    elif best_run and config.train.register:  # reuse the best trial's logged model
        record = register_and_promote(logged_model_uri(client, best_run), name, best_run,
                                      best_value)
        for key, value in record.items():
            client.set_tag(parent_run_id, key, value)
        lines.append(f"registered {record['registered_model']} v{record['registered_version']}"
                     f" (champion moved: {record['champion_promoted']})")
    return "\n".join(lines)
