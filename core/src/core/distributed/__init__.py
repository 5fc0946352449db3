"""Tensor and data parallelism: sharding plans, the model's collectives, worker processes and executors."""
