"""A network's predictions over a split's windows, and the validation RMSE of an epoch."""

import numpy as np
import torch

from rul.evaluation.metrics import rmse
from rul.training.batching import WindowBatches


@torch.inference_mode()
def _predicted(model, batches: WindowBatches, batch_size: int) -> torch.Tensor | None:
    """The predictions in order along the last axis ((members, windows) for stacked members:
    rul.models.stacking)."""
    model.eval()
    outputs = [model(x).float() for x, _ in batches.in_order(batch_size)]
    return torch.cat(outputs, dim=-1) if outputs else None


def predict_windows(model, batches: WindowBatches, batch_size: int = 4096):
    """RUL (cycles) for every window of `batches`, in order, as a float32 numpy array.

    In float32 whatever precision trained the model: validation (early stopping, intervals)
    and test metrics are those of the model as it is served (rul/serving predicts in float32,
    without autocast), not of its autocast forward."""
    predicted = _predicted(model, batches, batch_size)
    return predicted.cpu().numpy() if predicted is not None else np.empty(0, np.float32)


@torch.inference_mode()
def validation_rmse(model, batches: WindowBatches, batch_size: int = 4096,
                    weights=None) -> float | list:
    """The RMSE of `model` over `batches` (float64, as evaluation.metrics.rmse; stacked
    members: one each, a list), each window weighted by `weights` when given
    (rul.training.members.Members.val_weights: one row per stacked member). On a GPU it is
    computed there and read at once: the epoch's only wait for the device."""
    if batches.targets.device.type == "cpu":
        predicted = predict_windows(model, batches, batch_size)
        if predicted.ndim == 2:
            return [rmse(member, batches.targets, None if weights is None else weights[i])
                    for i, member in enumerate(predicted)]
        return rmse(predicted, batches.targets, weights)
    predicted = _predicted(model, batches, batch_size)
    if predicted is None:
        return float("nan")
    squared = (predicted.double() - batches.targets.double()).square()
    if weights is None:
        found = squared.mean(dim=-1).sqrt()
    else:
        weights = torch.as_tensor(weights, dtype=torch.float64, device=squared.device)
        found = ((weights * squared).sum(dim=-1) / weights.sum(dim=-1)).sqrt()
    return found.tolist() if squared.dim() == 2 else found.item()
