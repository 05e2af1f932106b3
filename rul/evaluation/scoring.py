"""A model's scores on the test units, one way for a single run and an ensemble: from its
predicted RUL of each test unit, the test metrics and the predictions frame."""

import pandas as pd

from rul.evaluation.metrics import rul_metrics


def score_test(predicted, data, rul_cap: float) -> tuple[dict, pd.DataFrame]:
    """`predicted`: the RUL of each test unit of `data` (a PreparedData). Returns the metrics
    (`test_rmse`, `test_mae`, ...: rul_metrics against the true RUL) and the frame unit,
    true_rul, true_rul_capped, predicted_rul."""
    metrics = {f"test_{k}": v for k, v in
               rul_metrics(predicted, data.subset.test_rul, rul_cap).items()}
    frame = pd.DataFrame({"unit": data.test_units, "true_rul": data.subset.test_rul,
                          "true_rul_capped": data.test.targets, "predicted_rul": predicted})
    return metrics, frame
