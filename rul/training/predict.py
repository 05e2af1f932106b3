"""A network's predictions over a split's windows."""

import numpy as np
import torch

from rul.training.batching import WindowBatches


@torch.inference_mode()
def predict_windows(model, batches: WindowBatches, batch_size: int = 4096):
    """RUL (cycles) for every window of `batches`, in order, as a float32 numpy array.

    In float32 whatever precision trained the model: validation (early stopping, intervals)
    and test metrics are those of the model as it is served (rul/serving predicts in float32,
    without autocast), not of its autocast forward."""
    model.eval()
    outputs = []
    for x, _ in batches.in_order(batch_size):
        outputs.append(model(x).float())
    return torch.cat(outputs).cpu().numpy() if outputs else np.empty(0, np.float32)
