"""Training: seeded batching, the accumulation/AMP optimizer step, the epoch loop."""
