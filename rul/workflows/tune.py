"""`rul tune`: an Optuna study (rul.tuning) whose trials are nested MLflow runs of `rul train`.

`run_study` opens the study and its MLflow parent run (reopened on resume), closes the trials
an earlier invocation left RUNNING, runs the trials here or in `workers` spawned processes (each
a tracked run per seed under the parent), then records the study on the parent run and
registers the best trial's model (docs: Tune).
"""

import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import mlflow
import optuna
from mlflow.tracking import MlflowClient

from rul.config import TuningConfig
from rul.errors import ConfigError
from rul.interrupts import (
    Terminated,
    deferred,
    exit_code,
    immediate,
    interrupts_as_exceptions,
)
from rul.orphans import end_with
from rul.parallel import stop_workers, threads_per_job, use_threads
from rul.plan import plan_seeds, prepared
from rul.tracking import study_runs
from rul.tracking.lifecycle import run_ends_cleanly
from rul.tracking.metric_names import logged
from rul.tracking.registry import (
    logged_model_uri,
    register_and_promote,
    registered_model_name,
    registry_line,
)
from rul.tracking.run_logging import data_tags
from rul.tracking.run_owner import owner_tags, reopen
from rul.tracking.store import Store, open_store
from rul.training.listener import Listeners
from rul.tuning import objectives as objs
from rul.tuning import progress
from rul.tuning.report import format_pareto_table, log_figures, log_pareto_table, pareto_table
from rul.tuning.space import suggest, trial_overrides
from rul.tuning.storage import check_url, has_heartbeat, open_storage, study_lock, wait_for_server
from rul.tuning.study import (
    PruningListener,
    await_running_trials,
    counted_trials,
    load_study,
    open_study_storage,
    quiet_optuna,
    stop_at,
    study_target,
)
from rul.workflows.tracked import RunRole, track

SEED_VALUES_ATTR = "seed_val_rmse"  # a trial's best val_rmse by seed (seeds_per_trial > 1)


def run_study(config: TuningConfig, n_trials: int | None = None, timeout: float | None = None,
              workers: int = 1, storage: str | None = None, study_name: str | None = None):
    """`rul tune`: the study `config` describes (`storage`: its URL, None: the default for
    `workers`), `n_trials` more trials (default: the config's) by `workers` processes, no
    trial started after `timeout` seconds; returns the summary lines it ends with."""
    if not config.search_space:
        raise ConfigError("the config has no search_space to tune (a tuning config lists one: "
                          "experiments/tune_fd001.yaml)")
    check_url(storage, workers)  # before anything is written
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # rul says what the study is
    wait_for_server(storage, workers)  # a server that does not answer: bounded, then one line
    store = open_store(config.train)  # once, before any worker
    work = _opened(StudyWork(config, storage, workers, study_name or config.effective_study_name,
                             None, store, None, timeout),
                   n_trials if n_trials is not None else config.n_trials)
    if objs.is_multi(config.objectives) and config.pruner != "none":
        print(f"objectives {', '.join(config.objectives)}: a multi-objective study is not "
              f"pruned (Optuna cannot prune several objectives); pruner={config.pruner!r} is "
              "ignored", file=sys.stderr)
    with run_ends_cleanly(work.parent_run_id):
        if workers == 1:
            _worker(work, 0)
        else:
            _run_workers(work)
        with study_lock(storage, workers, work.study_name):  # one registration at a time
            study = load_study(config, open_storage(storage, workers), work.study_name)
            return _record_study(study, work.parent_run_id, config)


def _opened(work: "StudyWork", n_trials: int) -> "StudyWork":
    """`work` with its study (created or loaded), its parent run (created or reopened), the
    trials left RUNNING closed and its target set, under the study's lock."""
    config, name = work.config, work.study_name
    with study_lock(work.storage, work.workers, name):
        opened = open_study_storage(config, work.storage, work.workers)  # may make its tables
        heartbeat = has_heartbeat(opened)
        study = load_study(config, opened, name)
        done = len(study.trials)
        print(f"study {name}: " + (f"continuing ({done} trials so far)" if done else "new"),
              file=sys.stderr)
        parent_run_id = _parent_run(study, config, work.store)
        if not heartbeat:  # with a heartbeat, Optuna fails dead workers' trials itself
            _close_interrupted_trials(study, MlflowClient())
        if config.baseline_trial:
            _enqueue_baseline(study, config)
        grace = config.heartbeat_grace_period or 2 * config.heartbeat_interval
        target = study_target(study, n_trials, grace if heartbeat else None)
    return replace(work, parent_run_id=parent_run_id, target=target)


def _enqueue_baseline(study: optuna.Study, config: TuningConfig) -> None:
    """The trial of the base config's own values (baseline_trial), unless one has trained,
    runs or waits; one that failed (interrupted, killed) is trained again."""
    from optuna.trial import TrialState

    alive = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    if not any(t.user_attrs.get(study_runs.BASELINE_ATTR)
               for t in study.get_trials(deepcopy=False, states=alive)):
        study.enqueue_trial(config.baseline_params(),
                            user_attrs={study_runs.BASELINE_ATTR: True})


def _parent_run(study: optuna.Study, config: TuningConfig, store: Store) -> str:
    """The study's MLflow parent run: the one it keeps (RUNNING again, this process's), or a
    new one holding the search space (and the objectives) and its data's tags (a training
    run's `data.*`, of the base config's data)."""
    client = MlflowClient()
    parent_run_id = study.user_attrs.get("mlflow_parent_run_id")
    if parent_run_id is not None:
        reopen(client, parent_run_id)
        return parent_run_id
    data = data_tags(prepared(config.train, config.train.split_seed))
    parent_run_id = client.create_run(store.experiment_id, run_name=study.study_name,
                                      tags={study_runs.STUDY: study.study_name,
                                            **owner_tags(), **data}).info.run_id
    study.set_user_attr("mlflow_parent_run_id", parent_run_id)
    space = config.to_dict()["search_space"]
    client.log_param(parent_run_id, study_runs.SEARCH_SPACE, str(space)[:6000])
    if objs.is_multi(config.objectives):
        client.log_param(parent_run_id, "objectives", ", ".join(config.objectives))
    if config.seeds_per_trial > 1:
        client.log_param(parent_run_id, study_runs.SEEDS_PER_TRIAL, config.seeds_per_trial)
    return parent_run_id


def _record_study(study: optuna.Study, parent_run_id: str, config: TuningConfig) -> str:
    """Counts, trials table, figures and the registered best trial, on the parent run; with
    several objectives the best is the Pareto trial of lowest val_rmse, and the front logged."""
    from optuna.trial import TrialState

    objectives, multi = config.objectives, objs.is_multi(config.objectives)
    states = {s: len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    counts = {study_runs.count_metric(s.name): n for s, n in states.items() if n}
    lines = [f"study {study.study_name}: {len(study.trials)} trials "
             + ", ".join(f"{s.name.lower()} {n}" for s, n in states.items() if n)]
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
        mlflow.log_metric(logged("best_val_rmse"), best_value, step=len(study.trials))
        mlflow.set_tags({"best_trial": str(best.number),
                         **{f"best.{k}": str(v) for k, v in best.params.items()}})
        if multi:
            front = pareto_table(study, objectives)
            log_pareto_table(front)
            mlflow.log_metric("pareto_trials", float(len(front)), step=len(study.trials))
            lines += [f"Pareto front ({', '.join(objectives)}): {len(front)} trials",
                      format_pareto_table(front, objectives)]
        log_figures(study, objectives)
    chosen = "best trial" if not multi else "best val_rmse on the Pareto front: trial"
    seeds = config.seeds_per_trial
    mean = f" (mean of {seeds} seeds: {_listed(best.user_attrs.get(SEED_VALUES_ATTR))})" \
        if seeds > 1 else ""
    lines.append(f"{chosen} {best.number}: val_rmse {best_value:.3f}{mean} with {best.params}")
    return "\n".join([*lines, *_register_best(best, best_value, parent_run_id, config)])


def _listed(values) -> str:
    return " / ".join(f"{v:.3f}" for v in values or [])


def _register_best(best, value: float, parent_run_id: str, config: TuningConfig) -> list[str]:
    """Register the best trial's logged model (once), its record on the parent run; the
    model is its first seed's and competes for champion with that run's validation RMSE."""
    client = MlflowClient()
    best_run = best.user_attrs.get(study_runs.RUN_ATTR)
    name = registered_model_name(config.train.dataset_name)
    if not best_run or not config.train.register:
        return []
    if client.search_model_versions(f"name='{name}' and run_id='{best_run}'"):
        return [f"best trial's model is already registered as {name}"]
    own = best.user_attrs.get(SEED_VALUES_ATTR, [value])[0]  # the first seed's: its model
    record = register_and_promote(logged_model_uri(client, best_run), name, best_run, own,
                                  promote=config.promote)
    for key, said in record.items():
        client.set_tag(parent_run_id, key, said)
    return [registry_line(record)]


def objective_for(base: TuningConfig, parent_run_id: str, store: Store,
                  target: int | None = None, workers: int = 1):
    """The study's objective: a trial trains as a tracked run per seed (`seeds_per_trial`,
    each its own validation split), its start, each epoch and its end said in a line each
    (`target`: the counted trials to reach, by `workers`); its value is the mean over its
    seeds, pruned on the first's."""
    multi = objs.is_multi(base.objectives)

    def objective(trial: optuna.Trial) -> float | list[float]:
        values = suggest(trial, base.search_space)
        progress.say(progress.started_line(trial, counted_trials(trial.study), target))
        watch = progress.TrialWatch()
        changes, reason = trial_overrides(base, values)
        if reason:
            _pruned_before_training(trial, reason)
        config = base.train.replace(**changes, register=False,
                                    checkpoint_dir=str(Path(base.train.checkpoint_dir) / "tune"))
        ended = trial.study.get_trials(deepcopy=False, states=progress.ENDED)
        watch.say_epochs(trial.number, config.epochs, base.seeds_per_trial,
                         None if ended or not target else target / workers)
        try:
            with immediate():  # training may stop at once; its own writes defer the signal
                states = _train_seeds(trial, base, config, parent_run_id, store, watch)
        except optuna.TrialPruned as pruned:
            _mark(trial, "PRUNED", str(pruned), watch)
            raise
        except Exception as error:
            if _is_out_of_memory(error):
                reason = f"CUDA out of memory at micro_batch_size={config.micro_batch_size}"
                _mark(trial, "PRUNED", reason, watch)
                raise optuna.TrialPruned(reason) from None
            _mark(trial, "FAIL", f"{type(error).__name__}: {error}", watch)
            raise
        except KeyboardInterrupt as interruption:
            _mark(trial, "FAIL", interrupted_reason(interruption), watch)
            raise
        trial_values = objs.over_seeds(base.objectives, states)
        if len(states) > 1:  # what the mean is of, by seed
            trial.set_user_attr(SEED_VALUES_ATTR, [state.best_val_rmse for state in states])
        _mark(trial, "COMPLETE", "", watch)
        return trial_values if multi else trial_values[0]

    return objective


def _train_seeds(trial: optuna.Trial, base: TuningConfig, config, parent_run_id: str,
                 store: Store, watch: progress.TrialWatch) -> list:
    """Train the trial's `config` once per seed (base.seeds_per_trial), each a tracked run,
    every seed's split checked before the first trains; the first seed reports to the pruner.
    Returns their `TrainState`s in seed order (the models and data go as each ends)."""
    memory = "peak_memory_mb" in base.objectives
    if memory:
        objs.reset_peak_memory()  # not charged for the worker's previous trial
    try:
        plans = plan_seeds(config, base.seeds_per_trial)
    except ConfigError as error:  # the data refuses it: a window over every unit
        _pruned_before_training(trial, str(error))
    states = []
    for index in range(len(plans)):
        plan, plans[index] = plans[index], None
        if memory and index:
            objs.reset_peak_memory()  # nor for the seed before
        pruning = None if objs.is_multi(base.objectives) or index else PruningListener(trial)
        watch.start_seed()
        role = _trial_role(trial, parent_run_id, index, len(plans), plan)
        states.append(track(plan, role, store, Listeners(watch, pruning), progress=False)[0].state)
    return states


def _trial_role(trial: optuna.Trial, parent_run_id: str, index: int, seeds: int,
                plan) -> RunRole:
    """The run of a trial's `index`-th seed of `seeds`, a child of the study's parent run: the
    first is `trial-NNN` (the trial's model: the one registered if it is the best), the others
    `trial-NNN-s<seed>`, each tagged with the trial (and with its seed's index, of several)."""
    tags = {study_runs.TRIAL: str(trial.number), study_runs.STUDY: trial.study.study_name}
    if trial.user_attrs.get(study_runs.BASELINE_ATTR):
        tags[study_runs.BASELINE] = "true"
    if seeds > 1:
        tags[study_runs.SEED_INDEX] = str(index)
    name = f"trial-{trial.number:03d}" + (f"-s{plan.config.seed}" if index else "")

    def created(run_id: str) -> None:
        if not index:
            trial.set_user_attr(study_runs.RUN_ATTR, run_id)
            if study_runs.SEED_RUNS_ATTR in trial.user_attrs:  # a retry's, copied from the dead
                trial.set_user_attr(study_runs.SEED_RUNS_ATTR, [])
        else:
            others = trial.user_attrs.get(study_runs.SEED_RUNS_ATTR, [])
            trial.set_user_attr(study_runs.SEED_RUNS_ATTR, [*others, run_id])

    return RunRole(parent_run_id, name, tags, register=False, resumable=False,
                   stop_exceptions=(optuna.TrialPruned,), on_run_created=created)


def _is_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error)


def _pruned_before_training(trial: optuna.Trial, reason: str) -> None:
    """A trial whose drawn config cannot train (no MLflow run): pruned, its reason one line
    on stderr and on the trial, never a traceback."""
    trial.set_user_attr("prune_reason", reason)
    print(f"trial {trial.number}: pruned before training: {reason}", file=sys.stderr)
    raise optuna.TrialPruned(reason)


def interrupted_reason(interruption: KeyboardInterrupt) -> str:
    """What an interrupted trial's records say, in Optuna (the trial's `reason`, state FAIL)
    and in MLflow (its run's `optuna.reason`, `optuna.trial_state` FAIL, status KILLED)."""
    return "interrupted (SIGTERM)" if isinstance(interruption, Terminated) \
        else "interrupted (SIGINT)"


def _mark(trial, state: str, reason: str, watch: progress.TrialWatch | None = None) -> None:
    """The trial's end on its records (its reason in Optuna, its state and reason on its
    MLflow run) and, with its `watch`, in a line on the console."""
    if watch is not None and "prune_reason" not in trial.user_attrs:  # else said already
        interrupted = reason.startswith("interrupted")  # `interrupted (SIGINT)`
        progress.say(progress.ended_line(trial.number, reason if interrupted else state.lower(),
                                         watch, "" if interrupted else reason))
    if reason:
        trial.set_user_attr("reason", reason[:1000])
    client = MlflowClient()
    for run_id in study_runs.trial_run_ids(trial.user_attrs):  # one per seed it trained
        client.set_tag(run_id, study_runs.STATE, state)
        if reason:
            client.set_tag(run_id, study_runs.REASON, reason[:5000])


def _close_interrupted_trials(study: optuna.Study, client: MlflowClient) -> None:
    """Trials left RUNNING by a killed earlier invocation become FAIL (their runs KILLED), so
    a resumed study neither counts nor repeats them; no other `rul tune` may be working on it."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
        study_runs.end_failed_trial_runs(client, trial.user_attrs,
                                         "interrupted: the tuning process was killed")


@dataclass(frozen=True)
class StudyWork:
    """What every worker of one `rul tune` invocation shares."""

    config: TuningConfig
    storage: str | None  # the URL as given (None: the default for `workers`)
    workers: int
    study_name: str
    parent_run_id: str | None  # set once the study is opened (_opened)
    store: Store  # the MLflow store, opened once by the command
    target: int | None  # counted trials to reach (set with the parent run)
    timeout: float | None  # seconds; no new trial starts after it


def _worker(work: StudyWork, worker: int):
    config, target = work.config, work.target
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a spawned worker starts at INFO
    storage = open_study_storage(config, work.storage, work.workers)
    study = load_study(config, storage, work.study_name, worker)
    deadline = None if work.timeout is None else time.monotonic() + work.timeout
    while counted_trials(study) < target:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        with deferred():  # Optuna's own storage writes are never cut; trials are `immediate`
            study.optimize(objective_for(config, work.parent_run_id, work.store, target,
                                         work.workers),
                           timeout=left, catch=(Exception,),
                           callbacks=[stop_at(target), _estimate(target, work.workers)])
        if not has_heartbeat(storage):
            break
        # A dead worker's trial, retried, is short of the target again: run it too.
        await_running_trials(study, config.heartbeat_interval)


def _estimate(target: int | None, workers: int):
    """After each trial, once Optuna has stored its end: the study's time in all and left."""
    def callback(study: optuna.Study, trial) -> None:
        line = progress.estimate_line(study, target, workers)
        if line:
            progress.say(line)

    return callback


def _worker_process(work: StudyWork, worker: int, threads: int, parent: int) -> None:
    """A spawned worker computing with `threads` torch threads (its share of the command's): a
    signal ends its trial's run KILLED, then it exits 130 or 143; so does the end of `parent`
    (the command's process), however it ends (rul.orphans)."""
    end_with(parent)
    use_threads(threads)
    try:
        with interrupts_as_exceptions(on_first_signal=quiet_optuna):
            _worker(work, worker)
    except KeyboardInterrupt as interruption:
        sys.exit(exit_code(interruption))


def _run_workers(work: StudyWork) -> None:
    context = multiprocessing.get_context("spawn")
    threads = threads_per_job(work.workers)
    processes = [context.Process(target=_worker_process, args=(work, i, threads, os.getpid()))
                 for i in range(work.workers)]
    try:
        for p in processes:
            p.start()
        for p in processes:
            p.join()
    except KeyboardInterrupt as interruption:  # this process was signalled: stop the workers
        stop_workers(processes, interruption)  # with the same signal, let them clean up
        raise
    failed = [p.exitcode for p in processes if p.exitcode]
    if failed:
        raise RuntimeError(f"tuning workers exited with codes {failed}")


