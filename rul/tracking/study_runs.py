"""How a `rul tune` study is kept in MLflow, in one place: `rul tune` writes these names and
`rul report` reads them back (rul.reporting.studies).

The study is a parent run tagged STUDY (its name), with the search space as the param
SEARCH_SPACE (and SEEDS_PER_TRIAL where a trial trains more than one seed) and, once it ends,
a count metric per trial state (`trials_complete`, ...). Each trial that trains is a child run
tagged STUDY and TRIAL (its number), and, when it ends, STATE (Optuna's TrialState name) and
REASON (why it was pruned or failed). A trial scored on several seeds has a run per seed,
each also tagged SEED_INDEX (0: the first, the trial's model); its value is their mean. The
Optuna trial names its runs in its user attributes RUN_ATTR (the first) and SEED_RUNS_ATTR
(the others). The trial of the base config's own values (`baseline_trial`) is marked so in
its user attribute BASELINE_ATTR and its runs' tag BASELINE.
"""

STUDY, TRIAL = "optuna.study", "optuna.trial"
STATE, REASON = "optuna.trial_state", "optuna.reason"
SEARCH_SPACE, SEEDS_PER_TRIAL = "search_space", "seeds_per_trial"
SEED_INDEX = "optuna.seed_index"
RUN_ATTR, SEED_RUNS_ATTR = "mlflow_run_id", "mlflow_seed_run_ids"
BASELINE, BASELINE_ATTR = "optuna.baseline", "baseline"


def trial_run_ids(user_attrs: dict) -> list[str]:
    """Every MLflow run of an Optuna trial (its user attributes), the first seed's first."""
    first = user_attrs.get(RUN_ATTR)
    return ([first] if first else []) + list(user_attrs.get(SEED_RUNS_ATTR, []))


def count_metric(state: str) -> str:
    """The parent run's metric counting a study's trials in `state` (a TrialState name)."""
    return f"trials_{state.lower()}"


def end_failed_trial_runs(client, user_attrs: dict, reason: str) -> None:
    """A trial that failed without ending its runs (its process killed, its worker dead): each
    of its runs says FAIL and why, and the one still RUNNING ends KILLED."""
    for run_id in trial_run_ids(user_attrs):
        client.set_tag(run_id, STATE, "FAIL")
        client.set_tag(run_id, REASON, reason)
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, status="KILLED")
