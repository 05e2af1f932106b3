"""Inference on raw C-MAPSS rows: the stored inference spec, predict_frame, the pyfunc model.

Imports only what inference needs (torch, numpy, pandas, scikit-learn, mlflow and the lean
parts of rul), so a registered model loads in an environment without the training tools.
"""
