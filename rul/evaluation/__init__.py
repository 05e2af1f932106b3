from rul.evaluation.conformal import Interval, fit_conformal, interval_scores
from rul.evaluation.metrics import mae, phm08_score, rmse, rul_metrics

__all__ = ["Interval", "fit_conformal", "interval_scores", "mae", "phm08_score", "rmse",
           "rul_metrics"]
