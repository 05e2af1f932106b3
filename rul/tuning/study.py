"""The Optuna side of `rul tune` (rul.workflows.tune runs the MLflow runs around the trials):
the study with its sampler and pruner, what it keeps (objectives, base config) and checks on
resume, how many trials a process works towards, the pruning listener, waiting for workers.

Storage (rul.tuning.storage): SQLite for one worker, a journal file for several on one
machine, a PostgreSQL URL for many machines (docs: Scale out). Re-running the same command
loads the study and adds trials; a process joining a study on a server while another works
towards its target helps reach that target (`study_target`).
"""

import sys
import time
import warnings

import numpy as np
import optuna

from rul.config import NOT_COMPARED_IN_A_STUDY, TuningConfig
from rul.errors import ConfigError
from rul.interrupts import deferred
from rul.training.listener import TrainingListener
from rul.tuning import objectives as objs
from rul.tuning.storage import open_storage, retried_trial_numbers

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


def stop_at(target: int):
    def callback(study: optuna.Study, trial) -> None:
        if counted_trials(study) >= target:
            study.stop()

    return callback


def study_target(study: optuna.Study, n_trials: int, join_within: float | None) -> int:
    """How many counted trials this process works towards: on a shared server, a target still
    open (a trial running, or set within `join_within` seconds) is joined; otherwise n_trials
    are added to the trials there. Called under the study lock."""
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
    """Create or load the study with its sampler and pruner (not stored); the sampler's seed
    depends on the worker and the trials already there, so a resumed study draws anew."""
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
    base["seeds_per_trial"] = config.seeds_per_trial  # what a trial's value is the mean of
    return base


def _check_base_config(study: optuna.Study, config: TuningConfig) -> None:
    """ConfigError unless the config shares what the study's trials did not draw (epochs,
    schedule, seed, defaults; keys either search space draws not compared). A study without a
    trained trial, or from before this check (said), takes the config it is run with."""
    wanted = base_config(config)
    stored = study.user_attrs.get(BASE_ATTR)
    if stored is None or not study.get_trials(deepcopy=False, states=TRAINED):
        if stored is None and study.trials:
            print(f"study {study.study_name!r} has no stored base config (made by an older "
                  "rul): its trials are taken to share this config's", file=sys.stderr)
        if stored != wanted:
            study.set_user_attr(BASE_ATTR, wanted)
        return
    stored = {"seeds_per_trial": 1, **stored}  # a study from before the key trained one
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


def await_running_trials(study: optuna.Study, interval: float) -> None:
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


