"""Inference on raw C-MAPSS rows: the inference spec, the lean runtime, the served pyfunc.

The served model (lean_pyfunc, around runtime.LeanModel) imports numpy, pandas, onnxruntime
and MLflow's pyfunc base: no torch, no scikit-learn, nothing from training. onnx_export and
torch_weights (torch) are for logging a model and for using a run's torch networks;
pyfunc_model keeps models logged before the lean runtime loading in rul's environment.
columns is the one table of the output columns (standard library only). server serves it
over HTTP (`make serve`) with what the model's requirements bring (mlflow-skinny's uvicorn):
limits, guard, connections, admission, bodies, scoring, answers, lanes and refusal_log are its
parts, each named in docs/reference/layout.md.
"""
