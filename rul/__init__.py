"""rul: Remaining Useful Life prediction for NASA C-MAPSS turbofan engines.

Pipeline, one package per stage:
    rul.data           load, validate and fetch C-MAPSS FD001-FD004
    rul.preprocessing  RUL target, feature selection, scaling, sliding windows, odd inputs
    rul.models         temporal networks (1D-CNN, LSTM/GRU, Transformer)
    rul.training       exact gradient accumulation, AMP, clipping, checkpoints, the GPU path
    rul.evaluation     RMSE, MAE, PHM08 score, intervals, ensembles, seeds
    rul.tracking       MLflow runs, the logged model, registry
    rul.tuning         Optuna search over micro-batch size, K and more
    rul.serving        the lean served model (ONNX), its checks and its HTTP guard
    rul.reporting      the generated Results and Performance pages (`rul report`)
Beside them: rul.cli (the `rul` command), rul.plan (a run's plan from its config),
rul.config (the config keys), rul.inference (`rul predict`)."""

__version__ = "0.1.0"
