"""MLflow tracking: store, batched metric callback, figures, pyfunc model, registry."""
