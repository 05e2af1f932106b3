"""Optuna tuning over micro-batch size, accumulation steps, lr, width/depth, dropout, window."""
