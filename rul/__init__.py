"""rul: Remaining Useful Life prediction for NASA C-MAPSS turbofan engines.

Pipeline, one package per stage, each importing only from those listed before it
(tests/test_layers.py):
    rul.data           load, validate and fetch C-MAPSS FD001-FD004
    rul.preprocessing  RUL target, feature selection, scaling, sliding windows, odd inputs
    rul.models         temporal networks (1D-CNN, LSTM/GRU, Transformer)
    rul.evaluation     RMSE, MAE, PHM08 score, test scores, intervals, ensembles, seeds
    rul.training       exact gradient accumulation, AMP, clipping, checkpoints, the GPU path
    rul.serving        the lean served model (ONNX), its checks and its HTTP guard
    rul.tracking       MLflow only: what a run logs, the logged model, registry, store
    rul.workflows      plans trained in MLflow runs: a run, an ensemble, seeds (`rul evaluate`)
    rul.tuning         Optuna search over micro-batch size, K and more
    rul.reporting      the generated Results and Performance pages (`rul report`)
Beside them: rul.config (the config keys) and rul.plan (a run's plan from its config), below
tracking; rul.inference (`rul predict`) and rul.cli (the `rul` command), on top."""

__version__ = "0.1.0"
