"""rul: Remaining Useful Life prediction for NASA C-MAPSS turbofan engines.

Pipeline, one package per stage:
    rul.data           load, validate and fetch C-MAPSS FD001-FD004
    rul.preprocessing  RUL target, feature selection, scaling, sliding windows
    rul.models         temporal networks (1D-CNN, LSTM/GRU, Transformer)
    rul.training       exact gradient accumulation, AMP, clipping, checkpoints
    rul.evaluation     RMSE, MAE, PHM08 score
    rul.tracking       MLflow runs, pyfunc model, registry
    rul.tuning         Optuna search over micro-batch size, K and more
"""

__version__ = "0.1.0"
