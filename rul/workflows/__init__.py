"""Workflows: plans trained inside MLflow runs, one module per command's work.

    train     `rul train`: an ensemble, a torchrun-split run or one run; `--resume`
    ensemble  N members under a parent run, logged as one averaged model
    evaluate  `rul evaluate`: N seeds under a parent run, reported as mean ± std
    tracked   one tracked run around one plan (RunRole, track)
    parent    children trained under one parent run, side by side or in turn

Each command opens its MLflow store once (rul.tracking.store.open_store) and hands it down.
"""
