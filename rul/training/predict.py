"""A network's predictions over a split's windows, and the validation RMSE of an epoch."""

import numpy as np
import torch

from rul.evaluation.metrics import rmse
from rul.training.batching import WindowBatches


@torch.inference_mode()
def _predicted(model, batches: WindowBatches, batch_size: int) -> torch.Tensor | None:
    model.eval()
    outputs = [model(x).float() for x, _ in batches.in_order(batch_size)]
    return torch.cat(outputs) if outputs else None


def predict_windows(model, batches: WindowBatches, batch_size: int = 4096):
    """RUL (cycles) for every window of `batches`, in order, as a float32 numpy array.

    In float32 whatever precision trained the model: validation (early stopping, intervals)
    and test metrics are those of the model as it is served (rul/serving predicts in float32,
    without autocast), not of its autocast forward."""
    predicted = _predicted(model, batches, batch_size)
    return predicted.cpu().numpy() if predicted is not None else np.empty(0, np.float32)


@torch.inference_mode()
def validation_rmse(model, batches: WindowBatches, batch_size: int = 4096) -> float:
    """The RMSE of `model` over `batches` (float64, as evaluation.metrics.rmse). On a GPU it is
    computed there and one number is read: the epoch's only wait for the device."""
    if batches.targets.device.type == "cpu":
        return rmse(predict_windows(model, batches, batch_size), batches.targets)
    predicted = _predicted(model, batches, batch_size)
    if predicted is None:
        return float("nan")
    error = predicted.double() - batches.targets.double()
    return error.square().mean().sqrt().item()
