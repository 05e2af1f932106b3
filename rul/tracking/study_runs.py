"""How a `rul tune` study is kept in MLflow, in one place: `rul tune` writes these names and
`rul report` reads them back (rul.reporting.studies).

The study is a parent run tagged STUDY (its name), with the search space as the param
SEARCH_SPACE and, once it ends, a count metric per trial state (`trials_complete`, ...). Each
trial that trains is a child run tagged STUDY and TRIAL (its number), and, when it ends,
STATE (Optuna's TrialState name) and REASON (why it was pruned or failed).
"""

STUDY, TRIAL = "optuna.study", "optuna.trial"
STATE, REASON = "optuna.trial_state", "optuna.reason"
SEARCH_SPACE = "search_space"


def count_metric(state: str) -> str:
    """The parent run's metric counting a study's trials in `state` (a TrialState name)."""
    return f"trials_{state.lower()}"
