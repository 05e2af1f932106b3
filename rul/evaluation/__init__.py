from rul.evaluation.metrics import mae, phm08_score, rmse, rul_metrics

__all__ = ["mae", "phm08_score", "rmse", "rul_metrics"]
